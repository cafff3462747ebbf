"""Downstream evaluation: how well the trained encoder fine-tunes on text classification (suite.score_model)."""
