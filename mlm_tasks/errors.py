"""The errors every layer raises, in one module that imports nothing of the project (docs/architecture.md#errors).
A `NoRetryError` (a person must act) fails a task without retries and exits the CLI with 2; the rest are retried."""

from __future__ import annotations

# The CLI's exit status for a NoRetryError: plugins/mlm_airflow/operators/remote_step.py reads it as "do not retry".
NO_RETRY_EXIT = 2


class NoRetryError(Exception):
    """A retry would fail the same way: the task fails at once and a person acts on the message."""


class ConfigError(NoRetryError, ValueError):
    """A setting or an input is wrong; the message says which and what to change (a ValueError: validators raise it)."""


class MissingArtifactError(NoRetryError):
    """An artifact an earlier step writes is missing: the message names the step to run first."""


class AuthError(NoRetryError):
    """A credential is missing, rejected (401) or lacks a permission (403); the message never holds the secret."""


class TrainingDivergedError(NoRetryError):
    """A loss or gradient was not finite: a retry diverges again, so a person changes the recipe."""


class TransientError(Exception):
    """A service failed on its side or did not answer in time (5xx, 429, a timeout): worth a retry."""
