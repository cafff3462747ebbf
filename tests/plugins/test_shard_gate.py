"""The shard gate against a local folder and the GCS emulator, through a real Airflow connection.

    python -m pytest tests/plugins/test_shard_gate.py -q

No scheduler: poke/execute run with a minimal context, and the deferrable path runs the provider's
GCSBlobTrigger.run() under asyncio against the emulator, the way the triggerer would.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from airflow.providers.google.cloud.sensors.gcs import GCSObjectExistenceSensor
from airflow.providers.google.cloud.triggers.gcs import GCSBlobTrigger
from airflow.sdk.bases.operator import TriggerFailureReason
from airflow.sdk.exceptions import (AirflowException, AirflowFailException, AirflowRescheduleException,
                                    AirflowSensorTimeout, TaskDeferred)

from mlm_tasks import storage
from mlm_tasks.config import SensorConfig
from mlm_tasks.paths import DataPaths
from shard_gate import MARKER_FROM_PREPARE_DATA, ShardSetCompleteSensor, shard_gate_sensor

CONN_ID = "gcs_emulator"


@pytest.fixture
def gcs_conn(gcs, monkeypatch) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(
        {"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True, "project": gcs.project}}))
    return CONN_ID


class StubTI:
    """What a sensor touches on the task instance: XCom of prepare_data, first reschedule date."""

    def __init__(self, prepare_data_result=None):
        self.result = prepare_data_result

    def xcom_pull(self, task_ids=None, **_):
        assert task_ids == "prepare_data"
        return self.result

    def get_first_reschedule_date(self, context):
        return None


def _marker(root: str) -> str:
    return DataPaths(root, "fp123").success


def _write_marker_later(uri: str, delay_s: float) -> threading.Thread:
    t = threading.Timer(delay_s, storage.write_text, args=(uri, ""))
    t.start()
    return t


def test_local_poke_sees_marker(tmp_path):
    marker = _marker(str(tmp_path))
    sensor = ShardSetCompleteSensor(task_id="wait", marker_uri=marker)
    assert sensor.mode == "reschedule"
    assert sensor.poke({}) is False
    storage.write_text(marker, "")
    assert sensor.poke({}) is True
    assert ShardSetCompleteSensor(task_id="w2", marker_uri="file://" + marker).poke({}) is True


def test_local_reschedules_then_succeeds(tmp_path):
    marker = _marker(str(tmp_path))
    sensor = ShardSetCompleteSensor(task_id="wait", marker_uri=marker, poke_interval=30, timeout=600)
    context = {"ti": StubTI()}
    with pytest.raises(AirflowRescheduleException):
        sensor.execute(context)  # frees the worker slot instead of sleeping
    storage.write_text(marker, "")
    assert sensor.execute(context) == marker


def test_local_timeout_says_what_to_check(tmp_path):
    marker = _marker(str(tmp_path))
    sensor = ShardSetCompleteSensor(task_id="wait", marker_uri=marker, mode="poke", poke_interval=0.2, timeout=1)
    started = time.monotonic()
    with pytest.raises(AirflowSensorTimeout) as err:
        sensor.execute({"ti": StubTI()})
    assert time.monotonic() - started < 10
    msg = str(err.value)
    assert f"Shards under {marker.rsplit('/', 1)[0]} not complete after 1 s" in msg
    assert "Did prepare_data fail?" in msg and "sensor.timeout_s" in msg


def test_marker_template_renders_from_prepare_data_xcom(tmp_path):
    marker = _marker(str(tmp_path))
    sensor = shard_gate_sensor(sensor=SensorConfig(poke_interval_s=7, timeout_s=99, gcp_conn_id="c"))
    assert sensor.marker_uri == MARKER_FROM_PREPARE_DATA
    assert (sensor.poke_interval, sensor.timeout, sensor.gcp_conn_id) == (7, 99, "c")
    sensor.render_template_fields({"ti": StubTI({"success_uri": marker, "output_root": str(tmp_path)})})
    assert sensor.marker_uri == marker


def test_missing_success_uri_fails_without_retry(tmp_path):
    sensor = ShardSetCompleteSensor(task_id="wait")
    sensor.render_template_fields({"ti": StubTI({"success_uri": None})})
    with pytest.raises(AirflowFailException, match="prepare_data returned no 'success_uri'"):
        sensor.poke({})


def test_gcs_poke_through_airflow_connection(gcs_root, gcs_conn):
    marker = _marker(gcs_root)
    sensor = ShardSetCompleteSensor(task_id="wait", marker_uri=marker, gcp_conn_id=gcs_conn)
    assert sensor.poke({}) is False
    storage.write_text(marker, "")
    assert sensor.poke({}) is True


def test_provider_object_existence_sensor_against_emulator(gcs, gcs_root, gcs_conn):
    marker = _marker(gcs_root)
    name = marker[len(f"gs://{gcs.bucket}/"):]
    sensor = GCSObjectExistenceSensor(task_id="wait", bucket=gcs.bucket, object=name,
                                      google_cloud_conn_id=gcs_conn, deferrable=True, timeout=60)
    assert sensor.poke({}) is False
    storage.write_text(marker, "")
    assert sensor.poke({}) is True


def test_deferrable_gcs_defers_to_blob_trigger_which_fires_when_marker_lands(gcs, gcs_root, gcs_conn):
    marker = _marker(gcs_root)
    sensor = ShardSetCompleteSensor(task_id="wait", marker_uri=marker, gcp_conn_id=gcs_conn,
                                    poke_interval=0.2, timeout=120)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({"ti": StubTI()})
    trigger = deferred.value.trigger
    assert isinstance(trigger, GCSBlobTrigger)
    assert deferred.value.method_name == "execute_complete"
    assert deferred.value.timeout.total_seconds() == 120
    classpath, kwargs = trigger.serialize()
    assert kwargs["bucket"] == gcs.bucket and f"gs://{gcs.bucket}/{kwargs['object_name']}" == marker
    assert kwargs["google_cloud_conn_id"] == gcs_conn and kwargs["use_glob"] is False

    async def first_event():
        return await asyncio.wait_for(trigger.run().__anext__(), timeout=30)

    writer = _write_marker_later(marker, 0.8)
    event = asyncio.run(first_event())
    writer.join()
    assert event.payload["status"] == "success", event.payload
    assert sensor.execute_complete({}, event.payload) == marker


def test_deferrable_gcs_with_marker_present_does_not_defer(gcs_root, gcs_conn):
    marker = _marker(gcs_root)
    storage.write_text(marker, "")
    sensor = ShardSetCompleteSensor(task_id="wait", marker_uri=marker, gcp_conn_id=gcs_conn)
    assert sensor.execute({"ti": StubTI()}) == marker


def test_deferral_timeout_and_trigger_error_messages(gcs_root):
    marker = _marker(gcs_root)
    sensor = ShardSetCompleteSensor(task_id="wait", marker_uri=marker, timeout=3600)
    with pytest.raises(AirflowSensorTimeout, match=r"Shards under gs://.*/shards not complete after 3600 s"):
        sensor.resume_execution("__fail__", {"error": TriggerFailureReason.TRIGGER_TIMEOUT}, {})
    with pytest.raises(AirflowException, match="Check that the Airflow connection"):
        sensor.execute_complete({}, {"status": "error", "message": "403 Forbidden"})
