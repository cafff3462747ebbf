"""How the model is trained: the parts mlm_tasks/steps/train.py chains (docs/layout.md)."""
