"""Downstream evaluation: how well the trained encoder fine-tunes on text classification.

    task = load_task(task_cfg, cfg.corpus)            # tasks.py: files or `datasets`; held_out.py: the default's
    scores = finetune(model_dir, train, validation, num_labels, budget, seed, pretrained=True)   # finetune.py
    entry = task_scores(...)                           # scores.py: mean and spread over the seeds

examples.py holds the examples every source gives. The `downstream` step (mlm_tasks/steps/downstream.py)
runs every task of `downstream.tasks` for `downstream.seeds` seeds, from the trained weights and from
random weights of the same shape.
"""
