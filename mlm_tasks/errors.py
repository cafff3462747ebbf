"""The errors every layer raises, in one module that imports nothing of the project.

    from mlm_tasks.errors import ConfigError, MissingArtifactError, AuthError, TransientError

`NoRetryError` (a person must act) fails an Airflow task without retries, the CLI exits 2; TransientError
and anything unforeseen are retried. docs/architecture.md#errors
"""

from __future__ import annotations

# The CLI's exit status for every NoRetryError; the SSH runner (plugins/mlm_airflow/operators/remote_step.py) reads
# a remote step's exit 2 as "do not retry".
NO_RETRY_EXIT = 2


class NoRetryError(Exception):
    """A retry would fail the same way: the task fails at once and a person acts on the message."""


class ConfigError(NoRetryError, ValueError):
    """A setting or an input is wrong (a setting, a path, data that does not fit the run); the message
    says which one and what to change. A ValueError too, so pydantic validators may raise it."""


class MissingArtifactError(NoRetryError):
    """An artifact an earlier step writes is missing (no tokenizer, no trained model, no shard set): the
    message names the step to run first, or the setting (output_root, a fingerprint) to check."""


class AuthError(NoRetryError):
    """A credential is missing, rejected (401) or lacks a permission (403): the message names the
    connection or credential to fix. Never contains the secret itself."""


class TrainingDivergedError(NoRetryError):
    """A step's loss or gradient was not finite: the run stopped before saving it, and its last checkpoint
    is the last good one. The same batches and settings diverge again, so a person changes the recipe."""


class TransientError(Exception):
    """A service failed on its side or did not answer in time (5xx, 429, a timeout, a secrets backend
    that is down): worth a retry, which Airflow does (plugins/mlm_airflow/defaults.py). The message says what to
    check if it persists."""
