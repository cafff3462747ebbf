"""The shard gate against a local folder and the GCS emulator, through a real Airflow connection.

    python -m pytest tests/plugins/test_shard_gate.py -q

No scheduler: poke/execute run with a minimal context, and the deferrable path runs the provider's
GCSBlobTrigger.run() under asyncio against the emulator, the way the triggerer would. The gate gets the
run's config and the merge step's shard-set summary as plain dicts, the way XComArgs resolve.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from airflow.providers.google.cloud.sensors.gcs import GCSObjectExistenceSensor
from airflow.providers.google.cloud.triggers.gcs import GCSBlobTrigger
from airflow.sdk.bases.operator import TriggerFailureReason
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowRescheduleException,
    AirflowSensorTimeout,
    TaskDeferred,
)

from mlm_airflow.sensors.shard_set import ShardSetCompleteSensor
from mlm_tasks import storage
from mlm_tasks.paths import DataPaths
from peers.tiny_data import tiny_config

CONN_ID = "gcs_emulator"


@pytest.fixture
def gcs_conn(gcs, monkeypatch) -> str:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN_ID.upper()}",
        json.dumps({"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True, "project": gcs.project}}),
    )
    return CONN_ID


class StubTI:
    """What a sensor touches on the task instance: the first reschedule date (None: first try)."""

    def __init__(self, first_reschedule_date=None):
        self.first_reschedule_date = first_reschedule_date

    def get_first_reschedule_date(self, context):
        return self.first_reschedule_date


def _marker(root: str) -> str:
    return DataPaths(root, "fp123").success


def _config(root: str, conn: str | None = None, **sensor) -> dict:
    """The validated config as the validate task returns it; `sensor` settings by their names."""
    settings = {f"sensor.{k}": v for k, v in sensor.items()}
    if conn:
        settings["sensor.gcp_conn_id"] = conn
    return tiny_config(root, **settings).model_dump(mode="json")


def _data(root: str, **extra) -> dict:
    """The merge step's shard-set summary (the part the gate reads)."""
    return {"fingerprint": "fp123", "success_uri": _marker(root), "cache_hit": True, **extra}


def _sensor(
    root: str, conn: str | None = None, *, data: dict | None = None, sensor: dict | None = None, **kwargs
) -> ShardSetCompleteSensor:
    return ShardSetCompleteSensor(
        task_id="wait",
        config=_config(root, conn, **(sensor or {})),
        data=data if data is not None else _data(root),
        **kwargs,
    )


def _write_marker_later(uri: str, delay_s: float) -> threading.Thread:
    t = threading.Timer(delay_s, storage.write_text, args=(uri, ""))
    t.start()
    return t


def test_local_poke_sees_marker(tmp_path):
    marker = _marker(str(tmp_path))
    sensor = _sensor(str(tmp_path))
    assert sensor.mode == "reschedule"
    assert sensor.poke({}) is False
    storage.write_text(marker, "")
    assert sensor.poke({}) is True
    file_uri = _data(str(tmp_path), success_uri="file://" + marker)
    assert _sensor(str(tmp_path), data=file_uri).poke({}) is True


def test_settings_come_from_the_runs_config_at_run_time(tmp_path, capfd):
    """Not the defaults of parse time: the run's sensor section, read when the gate runs (production.yaml
    waits 7200 s). The config and the summary may arrive as a rendered template's JSON."""
    config = json.dumps(_config(str(tmp_path), "gcp_for_sensor", poke_interval_s=7, timeout_s=7200))
    sensor = ShardSetCompleteSensor(task_id="wait", config=config, data=json.dumps(_data(str(tmp_path))), timeout=60)
    assert sensor.timeout == 60  # nothing is read before the run
    before = datetime.now(timezone.utc)
    with pytest.raises(AirflowRescheduleException) as resched:
        sensor.execute({"ti": StubTI()})
    assert (sensor.poke_interval, sensor.timeout, sensor.gcp_conn_id) == (7, 7200, "gcp_for_sensor")
    wait = (resched.value.reschedule_date - before).total_seconds()
    assert 6 <= wait <= 9, wait  # the next poke comes sensor.poke_interval_s later
    assert (
        "poke every 7 s, timeout 7200 s (sensor.poke_interval_s, sensor.timeout_s), GCP connection "
        "'gcp_for_sensor'" in capfd.readouterr().out
    )  # the task log
    # sensor.gcp_conn_id empty: the run's top-level GCP connection.
    top = tiny_config(str(tmp_path), gcp_conn_id="run_conn").model_dump(mode="json")
    fallback = ShardSetCompleteSensor(task_id="w2", config=top, data=_data(str(tmp_path)))
    fallback.apply_run_config()
    assert fallback.gcp_conn_id == "run_conn"


def test_local_reschedules_then_succeeds(tmp_path):
    marker = _marker(str(tmp_path))
    sensor = _sensor(str(tmp_path), sensor={"poke_interval_s": 30, "timeout_s": 600})
    context = {"ti": StubTI()}
    with pytest.raises(AirflowRescheduleException):
        sensor.execute(context)  # frees the worker slot instead of sleeping
    storage.write_text(marker, "")
    assert sensor.execute(context) == marker


def test_timeout_from_the_runs_config_says_what_to_check(tmp_path):
    """Shards from elsewhere (a cache hit: this run did not write them) that never complete."""
    marker = _marker(str(tmp_path))
    sensor = _sensor(str(tmp_path), sensor={"poke_interval_s": 1, "timeout_s": 1}, mode="poke", timeout=3600)
    started = time.monotonic()
    with pytest.raises(AirflowSensorTimeout) as err:
        sensor.execute({"ti": StubTI()})
    assert time.monotonic() - started < 10  # the config's 1 s, not the constructor's hour
    msg = str(err.value)
    assert f"Shards under {marker.rsplit('/', 1)[0]} not complete after 1 s: no {marker}" in msg
    assert "This run did not write that set" in msg and "a dataset refresh, another DAG" in msg
    assert "this worker's filesystem" in msg and "raise sensor.timeout_s" in msg


def test_reschedule_mode_times_out_by_the_configs_timeout(tmp_path):
    """In reschedule mode the clock starts at the first reschedule: a later try fails once the run's
    sensor.timeout_s has passed since then."""
    sensor = _sensor(str(tmp_path), sensor={"poke_interval_s": 1, "timeout_s": 5})
    first = datetime.now(timezone.utc) - timedelta(seconds=30)
    with pytest.raises(AirflowSensorTimeout, match="not complete after 5 s"):
        sensor.execute({"ti": StubTI(first_reschedule_date=first)})


def test_shards_written_by_this_run_pass_at_once_without_poking(tmp_path, capfd, monkeypatch):
    marker = _marker(str(tmp_path))  # does not exist: the gate must not look for it
    sensor = _sensor(
        str(tmp_path),
        data=_data(str(tmp_path), cache_hit=False, written_here=True),
        sensor={"poke_interval_s": 1, "timeout_s": 1},
        mode="poke",
    )
    pokes = []
    monkeypatch.setattr(sensor, "poke", lambda context: pokes.append(context) or False)
    assert sensor.execute({"ti": StubTI()}) == marker  # success, not a skip: training follows
    assert pokes == []
    assert (
        f"Not waiting: this run wrote the shard set {marker.rsplit('/', 1)[0]} itself, in merge_shards; "
        "the gate waits only for shards from elsewhere (a dataset refresh, another DAG, bring-your-own "
        "shards)."
    ) in capfd.readouterr().out


def test_config_and_data_render_from_xcom_args(tmp_path):
    """As the DAG wires it: XComArgs of the config and merge tasks, no task ids inside the gate."""
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG

    with DAG("gate_wiring", schedule=None):
        validate, merge = EmptyOperator(task_id="validate"), EmptyOperator(task_id="merge")
        sensor = ShardSetCompleteSensor(task_id="wait", config=validate.output, data=merge.output)
    assert sensor.upstream_task_ids == {"validate", "merge"}
    outputs = {"validate": _config(str(tmp_path), poke_interval_s=3, timeout_s=9), "merge": _data(str(tmp_path))}

    class XComTI(StubTI):
        def xcom_pull(self, task_ids=None, **_):
            return outputs[task_ids]

    sensor.render_template_fields({"ti": XComTI()})
    assert sensor.marker_uri == _marker(str(tmp_path))
    sensor.apply_run_config()
    assert (sensor.poke_interval, sensor.timeout) == (3, 9)


def test_missing_success_uri_fails_without_retry(tmp_path):
    for data in ({"success_uri": None}, {}):
        sensor = _sensor(str(tmp_path), data=data)
        with pytest.raises(AirflowFailException, match="has no 'success_uri'.*step that merges the shards"):
            sensor.execute({"ti": StubTI()})


def test_gcs_poke_through_airflow_connection(gcs_root, gcs_conn):
    marker = _marker(gcs_root)
    sensor = _sensor(gcs_root, gcs_conn)
    assert sensor.poke({}) is False
    storage.write_text(marker, "")
    assert sensor.poke({}) is True


def test_provider_object_existence_sensor_against_emulator(gcs, gcs_root, gcs_conn):
    marker = _marker(gcs_root)
    name = marker[len(f"gs://{gcs.bucket}/") :]
    sensor = GCSObjectExistenceSensor(
        task_id="wait", bucket=gcs.bucket, object=name, google_cloud_conn_id=gcs_conn, deferrable=True, timeout=60
    )
    assert sensor.poke({}) is False
    storage.write_text(marker, "")
    assert sensor.poke({}) is True


def test_deferrable_gcs_defers_to_blob_trigger_which_fires_when_marker_lands(gcs, gcs_root, gcs_conn):
    marker = _marker(gcs_root)
    sensor = _sensor(gcs_root, gcs_conn, sensor={"poke_interval_s": 1, "timeout_s": 120})
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({"ti": StubTI()})
    trigger = deferred.value.trigger
    assert isinstance(trigger, GCSBlobTrigger)
    assert deferred.value.method_name == "execute_complete"
    assert deferred.value.timeout.total_seconds() == 120
    classpath, kwargs = trigger.serialize()
    assert kwargs["bucket"] == gcs.bucket and f"gs://{gcs.bucket}/{kwargs['object_name']}" == marker
    assert kwargs["google_cloud_conn_id"] == gcs_conn and kwargs["use_glob"] is False
    assert kwargs["poke_interval"] == 1

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
    sensor = _sensor(gcs_root, gcs_conn)
    assert sensor.execute({"ti": StubTI()}) == marker


def test_deferral_timeout_and_trigger_error_messages(gcs_root):
    """A task resumed after its deferral is a fresh operator: it reads the run's config again."""
    sensor = _sensor(gcs_root, sensor={"timeout_s": 3600}, timeout=60)
    with pytest.raises(AirflowSensorTimeout, match=r"Shards under gs://.*/shards not complete after 3600 s"):
        sensor.resume_execution("__fail__", {"error": TriggerFailureReason.TRIGGER_TIMEOUT}, {})
    with pytest.raises(AirflowException, match="Check that the Airflow connection"):
        sensor.execute_complete({}, {"status": "error", "message": "403 Forbidden"})
