"""The XCom contract of the shard fan-out both DAGs run: plan_shards -> write_shards (mapped) -> merge.

plan_shards returns the partitions (the list write_shards is mapped over) and pushes the plan's
fingerprint and cache_hit under the key "plan"; the mapped tasks and the merge read it back here.
"""
from __future__ import annotations

from mlm_tasks.config import PipelineConfig
from task_errors import bad_input_fails_fast

PLAN_TASK = "plan_shards"


def hand_out(ti, plan: dict) -> list[dict]:
    """plan_shards' return value: the partitions to map over; the rest of the plan goes to XCom "plan"."""
    ti.xcom_push(key="plan", value={k: plan.get(k) for k in ("fingerprint", "cache_hit", "corpus_fingerprint")})
    return plan["partitions"]


def planned(ti) -> dict:
    """{"fingerprint", "cache_hit", "corpus_fingerprint"} as plan_shards decided them."""
    return ti.xcom_pull(task_ids=PLAN_TASK, key="plan")


def write_partition(cfg: PipelineConfig, ti, part: int, num_parts: int) -> dict:
    """Body of a mapped write_shards task: one partition's shards and partial manifest."""
    from mlm_tasks.prepare import write_data_partition

    with bad_input_fails_fast():
        return write_data_partition(cfg, planned(ti)["fingerprint"], part, num_parts)
