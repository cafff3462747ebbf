"""The pipeline's steps: one module, one function, one Airflow task id and one CLI verb each (docs/architecture.md).
Each is `name(cfg, ctx, *, inputs) -> typed result` (validate: `cfg` alone); build_shard_set, run_all chain them."""

from __future__ import annotations

from mlm_tasks.config import PipelineConfig
from mlm_tasks.paths import RunContext
from mlm_tasks.results import DataSummary, ShardPlan

# The shard-set task group's steps, in order (plugins/mlm_airflow/tasks/shard_set.py; both DAGs run it).
SHARD_SET_STEPS = (
    "plan_shards",
    "scan_partition",
    "find_duplicates",
    "cluster_duplicates",
    "train_tokenizer",
    "write_shards",
    "merge_shards",
)
STEPS = (
    "validate",
    *SHARD_SET_STEPS,
    "check_run",
    "train",
    "evaluate",
    "downstream",
    "fill_mask",
    "report",
    "gate",
    "publish",
    "publish_tokenizer",
    "summary",
)


def build_shard_set(cfg: PipelineConfig, ctx: RunContext | None = None) -> DataSummary:
    """Every shard-set step in this process with a single partition; the data summary."""
    from mlm_tasks.data.corpus import open_corpus
    from mlm_tasks.steps.merge_shards import merge_shards
    from mlm_tasks.steps.plan_shards import plan_shards
    from mlm_tasks.steps.write_shards import write_shards

    ctx = ctx or RunContext.of(cfg)
    corpus = open_corpus(cfg.corpus)
    plan = plan_shards(cfg, ctx, corpus=corpus, num_parts=1)
    data_ctx = ctx.with_data(plan["fingerprint"])
    prepare_partitions(cfg, data_ctx, plan, corpus)
    for p in plan["partitions"]:
        write_shards(cfg, data_ctx, part=p["part"], num_parts=p["num_parts"], corpus=corpus)
    return merge_shards(cfg, data_ctx, plan=plan, corpus=corpus)


def prepare_partitions(cfg: PipelineConfig, ctx: RunContext, plan: ShardPlan, corpus=None) -> None:
    """The steps between plan_shards and write_shards, in this process (none when the plan has no partition)."""
    from mlm_tasks.steps.cluster_duplicates import cluster_duplicates
    from mlm_tasks.steps.find_duplicates import find_duplicates
    from mlm_tasks.steps.scan_partition import scan_partition
    from mlm_tasks.steps.train_tokenizer import train_tokenizer

    if not plan["partitions"]:
        return
    n = len(plan["partitions"])
    for p in plan["partitions"]:
        scan_partition(cfg, ctx, part=p["part"], num_parts=n, corpus=corpus)
    for b in range(n):
        find_duplicates(cfg, ctx, bucket=b, num_parts=n)
    cluster_duplicates(cfg, ctx, num_parts=n)
    train_tokenizer(cfg, ctx, num_parts=n)


def run_all(cfg: PipelineConfig, ctx: RunContext, hub_token: str | None = None) -> dict:
    """Every step up to the report and the gate, no Airflow: what `python -m mlm_tasks run_all` runs."""
    from mlm_tasks.steps.check_run import check_run
    from mlm_tasks.steps.downstream import downstream
    from mlm_tasks.steps.evaluate import evaluate
    from mlm_tasks.steps.fill_mask import fill_mask
    from mlm_tasks.steps.gate import gate
    from mlm_tasks.steps.report import report
    from mlm_tasks.steps.summary import summary
    from mlm_tasks.steps.train import train

    data = build_shard_set(cfg, ctx)
    ctx = ctx.with_data(data["fingerprint"])
    return {
        "data": data,
        "check_run": check_run(cfg, ctx, data=data),
        "train": train(cfg, ctx, hub_token=hub_token),
        "evaluate": evaluate(cfg, ctx),
        "downstream": downstream(cfg, ctx),
        "fill_mask": fill_mask(cfg, ctx),
        "report": report(cfg, ctx, data=data),
        "gate": gate(cfg, ctx),
        "summary": summary(cfg, ctx, data=data),
    }
