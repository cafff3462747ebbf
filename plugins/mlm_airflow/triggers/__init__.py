"""Triggers of the pipeline (run in the triggerer): a TPU VM's state, a detached trainer."""

from __future__ import annotations

import inspect
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from airflow.triggers.base import BaseTrigger


class ConnectionTrigger(BaseTrigger):
    """A subclass is a `@dataclass(eq=False, repr=False)`: its fields are the constructor's arguments, serialized
    under their names. `connected()` is a block with the credentials of its `gcp_conn_id`, read once per run."""

    # Stored with every deferred task and imported by the triggerer: a rename must keep this path importable.
    classpath: ClassVar[str]
    gcp_conn_id: str
    _credentials: tuple[Any, str | None] | None = None

    def __post_init__(self) -> None:
        super().__init__()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath, {name: getattr(self, name) for name in inspect.signature(type(self)).parameters}

    def connected(self) -> AbstractContextManager[None]:
        from mlm_airflow.connections import connection_credentials
        from mlm_tasks import credentials

        if self._credentials is None:
            self._credentials = connection_credentials(self.gcp_conn_id)
        return credentials.use(*self._credentials, source=f"Airflow connection {self.gcp_conn_id!r}")
