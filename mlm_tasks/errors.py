"""The errors every layer raises, in one module that imports nothing of the project.

    from mlm_tasks.errors import ConfigError

`ConfigError`: a setting or an input is wrong; only a person can fix it, so the task fails without
retries (plugins/task_errors.py) and the CLI exits 2. Anything else is taken as worth a retry.
"""
from __future__ import annotations


class ConfigError(ValueError):
    """A setting is wrong; the message says which one and what to do."""
