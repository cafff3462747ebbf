"""Downstream evaluation: how well the trained encoder fine-tunes on text classification.

result = score_model(cfg, model_dir, model_uri)   # suite.py: every task of downstream.tasks, every seed
"""
