"""mlm_tasks: every step of the masked-LM pretraining pipeline, with no Airflow inside.

mlm_tasks/steps/ holds the steps, one module and one function each, called both by the Airflow DAGs
(the task of the same name) and by the CLI (the verb of the same name), over the libraries beside it
(docs/architecture.md#layers lists them):

    python -m mlm_tasks build_shard_set --config configs/default.yaml
    python -m mlm_tasks train --config configs/default.yaml --run-id my-run

Importing this package is cheap: TensorFlow and transformers load only inside the steps that need them.
"""

import os

# transformers' TF models need Keras 2 (tf-keras); this must be set before TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# TensorFlow's C++ INFO lines drown the progress lines operators read.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
