"""Step report: the run report under runs/<run>/report/, and the data summary the model card reads.
python -m mlm_tasks report --config configs/default.yaml --run-id my-run [--data-fingerprint FP]"""

from __future__ import annotations

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.data.shard_set import DataSummary, summary_for_fingerprint
from mlm_tasks.paths import RunContext
from mlm_tasks.reporting.report import write_report
from mlm_tasks.results import KeyMetrics


def report(cfg: PipelineConfig, ctx: RunContext, *, data: DataSummary | None = None) -> KeyMetrics:
    """Write the plots and report.md; the key metrics. `data`: merge_shards' summary (None: ctx.fingerprint's)."""
    if data is None and ctx.fingerprint and storage.exists(ctx.data.success):
        data = summary_for_fingerprint(cfg, ctx.fingerprint)
    if data is not None:
        storage.write_json(ctx.run.data_ref, data)
    return write_report(cfg, ctx.run, data)
