"""The shard gate: wait until a shard set's _SUCCESS marker exists, locally or on gs://.

    from shard_gate import shard_gate_sensor            # Airflow puts plugins/ on sys.path
    wait = shard_gate_sensor(sensor=cfg.sensor)         # marker from prepare_data's XCom

The marker URI is known only at run time (it holds the data fingerprint), so it is a templated
field, by default `prepare_data`'s returned "success_uri". For gs:// the check is GCSHook.exists
with the run's Airflow GCP connection and, when deferrable, the wait is handed to the provider's
GCSBlobTrigger on the triggerer (no worker slot held). For a local folder it pokes the file in
reschedule mode (the slot is freed between pokes). Either way the timeout says what to check.
"""
from __future__ import annotations

import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSensorTimeout

if TYPE_CHECKING:
    from mlm_tasks.config import SensorConfig

MARKER_FROM_PREPARE_DATA = "{{ ti.xcom_pull(task_ids='prepare_data')['success_uri'] }}"


def split_gs_uri(uri: str) -> tuple[str, str]:
    bucket, _, name = uri[len("gs://"):].partition("/")
    if not bucket or not name:
        raise AirflowFailException(f"Not a gs://bucket/object URI: {uri!r}. Check output_root in the config.")
    return bucket, name


class ShardSetCompleteSensor(BaseSensorOperator):
    """Succeeds once `marker_uri` (local path or gs://bucket/object) exists; returns the URI."""

    template_fields = ("marker_uri", "gcp_conn_id")
    ui_color = "#e8f4e4"

    def __init__(self, *, marker_uri: str = MARKER_FROM_PREPARE_DATA,
                 gcp_conn_id: str = "google_cloud_default", deferrable: bool = True,
                 mode: str = "reschedule", **kwargs: Any) -> None:
        super().__init__(mode=mode, **kwargs)
        self.marker_uri = marker_uri
        self.gcp_conn_id = gcp_conn_id
        self.deferrable = deferrable

    @property
    def _is_gcs(self) -> bool:
        return str(self.marker_uri).startswith("gs://")

    def _check_rendered(self) -> None:
        if not self.marker_uri or self.marker_uri == "None":
            raise AirflowFailException(
                "No shard marker URI: prepare_data returned no 'success_uri'. Check that task's log "
                "and return value; this sensor waits for <output_root>/datasets/<fp>/shards/_SUCCESS.")

    def poke(self, context: Any) -> bool:
        self._check_rendered()
        self.log.info("Waiting for the shard marker %s", self.marker_uri)
        if self._is_gcs:
            from airflow.providers.google.cloud.hooks.gcs import GCSHook

            bucket, name = split_gs_uri(self.marker_uri)
            return GCSHook(gcp_conn_id=self.gcp_conn_id).exists(bucket, name)
        path = self.marker_uri[len("file://"):] if self.marker_uri.startswith("file://") else self.marker_uri
        return os.path.isfile(path)

    def execute(self, context: Any) -> str:
        if self.deferrable and self._is_gcs:
            if not self.poke(context):
                self.defer(trigger=self.trigger(), method_name="execute_complete",
                           timeout=timedelta(seconds=self.timeout))
            return self.marker_uri
        try:
            super().execute(context)
        except AirflowSensorTimeout as e:
            raise AirflowSensorTimeout(self.timeout_message()) from e
        return self.marker_uri

    def trigger(self):
        from airflow.providers.google.cloud.triggers.gcs import GCSBlobTrigger

        bucket, name = split_gs_uri(self.marker_uri)
        return GCSBlobTrigger(bucket=bucket, object_name=name, use_glob=False,
                              poke_interval=self.poke_interval, google_cloud_conn_id=self.gcp_conn_id,
                              hook_params={})

    def execute_complete(self, context: Any, event: dict[str, Any]) -> str:
        if event.get("status") != "success":
            raise AirflowException(
                f"Checking {self.marker_uri} failed on the triggerer: {event.get('message')}. Check that "
                f"the Airflow connection {self.gcp_conn_id!r} can read the bucket.")
        self.log.info("Shard set complete: %s", self.marker_uri)
        return self.marker_uri

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Any):
        try:
            return super().resume_execution(next_method, next_kwargs, context)
        except AirflowSensorTimeout as e:  # the deferral ran out of time on the triggerer
            raise AirflowSensorTimeout(self.timeout_message()) from e

    def timeout_message(self) -> str:
        shards = str(self.marker_uri).rsplit("/", 1)[0]
        where = f"Airflow connection {self.gcp_conn_id!r}" if self._is_gcs else "this worker's filesystem"
        return (f"Shards under {shards} not complete after {int(self.timeout)} s: no {self.marker_uri}. "
                f"Did prepare_data fail? Check its log, that output_root is right and readable through "
                f"{where}; if the corpus is just big, raise sensor.timeout_s.")


def shard_gate_sensor(task_id: str = "wait_for_shards", *, sensor: SensorConfig | None = None,
                      marker_uri: str = MARKER_FROM_PREPARE_DATA, **kwargs: Any) -> ShardSetCompleteSensor:
    """The gate as the DAG uses it: timings and connection from a `SensorConfig` (or defaults)."""
    if sensor is None:
        from mlm_tasks.config import SensorConfig

        sensor = SensorConfig()
    kwargs.setdefault("poke_interval", sensor.poke_interval_s)
    kwargs.setdefault("timeout", sensor.timeout_s)
    kwargs.setdefault("gcp_conn_id", sensor.gcp_conn_id or "google_cloud_default")
    return ShardSetCompleteSensor(task_id=task_id, marker_uri=marker_uri, **kwargs)
