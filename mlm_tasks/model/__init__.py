"""The model and what training needs around it: the RoBERTa masked LM, the training plan and resume
checks, progress logging, the PyTorch-layout export and the model card.
"""
