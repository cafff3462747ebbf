"""mlm_tasks: every step of the masked-LM pretraining pipeline, with no Airflow inside (docs/architecture.md).
Importing it is cheap: TensorFlow and transformers load only inside the steps that need them.
python -m mlm_tasks train --config configs/default.yaml --run-id my-run"""

import os

# transformers' TF models need Keras 2 (tf-keras); this must be set before TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# TensorFlow's C++ INFO lines drown the progress lines operators read.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
