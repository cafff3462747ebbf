"""The SHARDS asset event helpers: what the refresh DAG attaches, and which event a triggered run uses."""

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

pytest.importorskip("airflow")


def test_event_extra_carries_exactly_what_a_training_run_needs(tiny_cfg):
    from mlm_airflow.assets import event_extra

    cfg = tiny_cfg.model_dump(mode="json")
    data = {"fingerprint": "abc123", "records": {"train": 10}, "tokens": {"train": 640}, "data_root": "x"}
    extra = event_extra(cfg, data)
    assert extra == {
        "fingerprint": "abc123",
        "output_root": cfg["output_root"],
        "data_config": {k: cfg[k] for k in ("corpus", "tokenizer", "shards", "dedup")},
        "records": {"train": 10},
        "tokens": {"train": 640},
    }


def test_a_run_that_consumed_several_events_uses_the_newest_whatever_their_order():
    from mlm_airflow.assets import SHARDS, triggering_shards_event

    t0 = datetime(2026, 1, 5, tzinfo=timezone.utc)
    events = [
        SimpleNamespace(
            timestamp=t0 + timedelta(days=d),
            source_dag_id="mlm_dataset_refresh",
            extra={"fingerprint": f"{d:016x}", "output_root": "out", "data_config": {}},
        )
        for d in (7, 0, 14)
    ]
    from airflow.sdk import Asset

    other = Asset(name="something_else", uri="x-mlm://other")
    context = {"triggering_asset_events": {other: [SimpleNamespace(timestamp=t0, extra={})], SHARDS: events}}
    assert triggering_shards_event(context)["fingerprint"] == f"{14:016x}"
    assert triggering_shards_event({"triggering_asset_events": {}}) is None
    assert triggering_shards_event({}) is None


@pytest.mark.parametrize("source_dag_id, extra", [(None, {"from_rest_api": True}), ("someone_elses_dag", {})])
def test_an_event_the_refresh_dag_did_not_make_is_refused(source_dag_id, extra):
    """FAB's User role may POST /api/v2/assets/events: such an event (Airflow marks it from_rest_api, with no
    source DAG) or another DAG's never reaches the run's settings."""
    from mlm_airflow.assets import SHARDS, triggering_shards_event
    from mlm_tasks.errors import ConfigError

    event = SimpleNamespace(
        timestamp=datetime(2026, 1, 5, tzinfo=timezone.utc),
        source_dag_id=source_dag_id,
        extra={"fingerprint": "0" * 16, "output_root": "out", "data_config": {}, **extra},
    )
    with pytest.raises(ConfigError, match="not by mlm_dataset_refresh"):
        triggering_shards_event({"triggering_asset_events": {SHARDS: [event]}})
