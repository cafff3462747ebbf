"""Triggers of the pipeline (run in the triggerer): a TPU VM's state, a detached trainer."""
