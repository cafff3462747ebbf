"""Step: check every input that touches the outside world, before anything costly starts.

    python -m mlm_tasks validate --config configs/default.yaml

`PipelineConfig` already rejects bad values and combinations; this adds what needs I/O: the corpus
exists and is readable, output_root is writable, gs:// has credentials. It runs first in the DAG, so a
bad input fails in seconds, long before a TPU VM is created.
"""
from __future__ import annotations

import logging
import os
import uuid

from mlm_tasks import storage
from mlm_tasks.config import ConfigError, PipelineConfig
from mlm_tasks.corpus import open_corpus

log = logging.getLogger(__name__)


def check_gcs_credentials(uri: str) -> None:
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        google.auth.default()
    except DefaultCredentialsError:
        raise ConfigError(f"output_root {uri} needs Google Cloud credentials and none were found: set "
                          "GOOGLE_APPLICATION_CREDENTIALS, run `gcloud auth application-default login`, or "
                          "give the Airflow GCP connection a key.") from None


def check_writable(uri: str) -> None:
    probe = f"{uri.rstrip('/')}/_probes/{uuid.uuid4().hex}"
    try:
        storage.write_text(probe, "ok")
        storage.remove(probe)
    except Exception as err:  # any failure here means the run could not save its work
        raise ConfigError(f"Cannot write to output_root {uri}: {type(err).__name__}: {err}. Check the path "
                          "and its permissions.") from None


def validate_inputs(cfg: PipelineConfig) -> None:
    open_corpus(cfg.corpus)  # raises ConfigError for missing paths and bad file types
    if storage.scheme(cfg.output_root) == "gs":
        check_gcs_credentials(cfg.output_root)
    check_writable(cfg.output_root)
    log.info("Configuration valid: corpus %s, output_root %s, compute %s, preset %s",
             cfg.corpus.source, cfg.output_root, cfg.compute, cfg.model.preset)
