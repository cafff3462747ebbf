"""Downstream evaluation: how well the trained encoder fine-tunes on text classification.

    task = load_task(task_cfg, cfg.corpus)            # tasks.py: files or `datasets`; held_out.py: the default's
    scores = finetune(model_dir, train, validation, num_labels, budget, seed, pretrained=True)   # finetune.py
    entry = task_scores(...)                           # scores.py: mean and spread over the seeds
    result = score_model(cfg, model_dir, model_uri)   # suite.py: every task of downstream.tasks, every seed

examples.py holds the examples every source gives; contamination.py checks them against the corpus.
"""
