"""Airflow Assets shared by the DAGs: the refresh DAG emits events on SHARDS, mlm_pretrain is scheduled on it.
An event's `extra` carries what a training run needs to use exactly that data (`event_extra`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow.sdk import Asset

from mlm_tasks.config.deployment import DATA_SECTIONS, Deployment
from mlm_tasks.results import DataSummary

log = logging.getLogger(__name__)

# An "x-" scheme is Airflow's mark for a private URI: parsing the DAGs loads no provider to normalise it.
SHARDS = Asset(name="mlm_shards", uri="x-mlm://shards", group="mlm")


def event_extra(cfg_dict: dict[str, Any], data: DataSummary) -> dict[str, Any]:
    return {
        "fingerprint": data["fingerprint"],
        "output_root": cfg_dict["output_root"],
        "data_config": {k: cfg_dict[k] for k in DATA_SECTIONS},
        "records": data["records"],
        "tokens": data["tokens"],
    }


def triggering_shards_event(context: Mapping[str, Any], deployment: Deployment | None = None) -> dict[str, Any] | None:
    """The newest SHARDS event that triggered this run (checked as input), or None for a manual run. A run
    consumes every event since the last such run, in no set order: picked by timestamp, never by position."""
    from mlm_tasks.config.deployment import check_event

    events = (context.get("triggering_asset_events") or {}).items()
    shards = [event for asset, of_asset in events if getattr(asset, "name", None) == SHARDS.name for event in of_asset]
    if not shards:
        return None
    newest = max(shards, key=lambda e: e.timestamp)
    event = check_event(dict(newest.extra or {}), deployment, getattr(newest, "source_dag_id", None))
    log.info("Triggered by dataset refresh: fingerprint %s under %s", event["fingerprint"], event["output_root"])
    return event
