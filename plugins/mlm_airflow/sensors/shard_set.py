"""The shard gate: wait until a shard set's _SUCCESS marker exists, locally or on gs:// (deferrable, in the
provider's GCSBlobTrigger; a local folder pokes in reschedule mode), with timing from the run's `sensor.*`.

    wait = ShardSetCompleteSensor(task_id="wait_for_shards", config=validate_output, data=merge_output)
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSensorTimeout

from mlm_airflow.tasks.step_context import config_from_xcom, xcom_dict
from mlm_tasks import storage


class ShardSetCompleteSensor(BaseSensorOperator):
    """Succeeds once the marker `data["success_uri"]` exists, or at once when `data["written_here"]`; returns
    the marker URI."""

    template_fields = ("config", "data")
    ui_color = "#e8f4e4"

    def __init__(
        self, *, config: Any, data: Any, deferrable: bool = True, mode: str = "reschedule", **kwargs: Any
    ) -> None:
        super().__init__(mode=mode, **kwargs)
        self.config = config
        self.data = data
        self.deferrable = deferrable
        self.gcp_conn_id = ""  # from the run's config, in apply_run_config
        self._configured = False

    def apply_run_config(self) -> None:
        """Poke interval, timeout and GCP connection from the run's config; every entry point calls it first."""
        if self._configured:
            return
        cfg = config_from_xcom(self.config)
        self.poke_interval = float(cfg.sensor.poke_interval_s)
        self.timeout = float(cfg.sensor.timeout_s)
        self.gcp_conn_id = cfg.sensor.gcp_conn_id or cfg.gcp_conn_id
        self._configured = True
        self.log.info(
            "Shard gate settings from the run's config: poke every %g s, timeout %g s "
            "(sensor.poke_interval_s, sensor.timeout_s), GCP connection %r.",
            *(self.poke_interval, self.timeout, self.gcp_conn_id),
        )

    @property
    def marker_uri(self) -> str:
        uri = xcom_dict(self.data).get("success_uri")
        if not uri:
            raise AirflowFailException(
                "No shard marker URI: the shard-set summary given to the gate as `data` has no 'success_uri' "
                f"(got {str(self.data)[:200]!r}). Check the log and return value of the step that merges the "
                "shards; this gate waits for <output_root>/datasets/<fp>/shards/_SUCCESS."
            )
        return str(uri)

    @property
    def _is_gcs(self) -> bool:
        return storage.scheme(self.marker_uri) == "gs"

    def poke(self, context: Context) -> bool:
        self.apply_run_config()
        marker = self.marker_uri
        self.log.info("Waiting for the shard marker %s", marker)
        if self._is_gcs:
            from airflow.providers.google.cloud.hooks.gcs import GCSHook

            return GCSHook(gcp_conn_id=self.gcp_conn_id).exists(*storage.bucket_and_name(marker))
        return os.path.isfile(storage.local_path(marker))

    def execute(self, context: Context) -> str:
        self.apply_run_config()
        marker = self.marker_uri
        if xcom_dict(self.data).get("written_here"):
            self.log.info(
                "Not waiting: this run wrote the shard set %s itself, in merge_shards; the gate waits "
                "only for shards from elsewhere (a dataset refresh, another DAG, bring-your-own "
                "shards).",
                marker.rsplit("/", 1)[0],
            )
            return marker
        if self.deferrable and self._is_gcs:
            if not self.poke(context):
                from airflow.providers.google.cloud.triggers.gcs import GCSBlobTrigger

                bucket, name = storage.bucket_and_name(marker)
                trigger = GCSBlobTrigger(
                    bucket=bucket,
                    object_name=name,
                    use_glob=False,
                    poke_interval=self.poke_interval,
                    google_cloud_conn_id=self.gcp_conn_id,
                    hook_params={},
                )
                self.defer(trigger=trigger, method_name="execute_complete", timeout=timedelta(seconds=self.timeout))
            return marker
        try:
            super().execute(context)
        except AirflowSensorTimeout as e:
            raise AirflowSensorTimeout(self.timeout_message()) from e
        return marker

    def execute_complete(self, context: Context, event: dict[str, Any]) -> str:
        self.apply_run_config()
        if event.get("status") != "success":
            raise AirflowException(
                f"Checking {self.marker_uri} failed on the triggerer: {event.get('message')}. Check that "
                f"the Airflow connection {self.gcp_conn_id!r} can read the bucket."
            )
        self.log.info("Shard set complete: %s", self.marker_uri)
        return self.marker_uri

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context) -> Any:
        self.apply_run_config()  # a resumed task is a fresh operator: the config's timeout is for the message
        try:
            return super().resume_execution(next_method, next_kwargs, context)
        except AirflowSensorTimeout as e:  # the deferral ran out of time on the triggerer
            raise AirflowSensorTimeout(self.timeout_message()) from e

    def timeout_message(self) -> str:
        marker = self.marker_uri
        where = f"Airflow connection {self.gcp_conn_id!r}" if self._is_gcs else "this worker's filesystem"
        return (
            f"Shards under {marker.rsplit('/', 1)[0]} not complete after {int(self.timeout)} s: no {marker}. "
            "This run did not write that set: check that whatever writes it (a dataset refresh, another DAG "
            "or run, your upload of bring-your-own shards) finished, that output_root is right and readable "
            f"through {where}; if the set is just slow to arrive, raise sensor.timeout_s."
        )
