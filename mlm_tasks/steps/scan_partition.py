"""Step scan_partition: read one corpus partition, filter its rows, hash them for dedup, pick tokenizer candidates.
python -m mlm_tasks scan_partition --config c.yaml --set shards.partitions=4 --part 0 --data-fingerprint FP"""

from __future__ import annotations

from mlm_tasks.config import PipelineConfig
from mlm_tasks.paths import RunContext
from mlm_tasks.results import ScannedPartition


def scan_partition(
    cfg: PipelineConfig, ctx: RunContext, *, part: int = 0, num_parts: int = 1, corpus=None
) -> ScannedPartition:
    from mlm_tasks.data.corpus import open_corpus
    from mlm_tasks.data.dedup.scan import scan_partition as scan
    from mlm_tasks.data.filters import RowFilter

    corpus = corpus or open_corpus(cfg.corpus)
    done = scan(cfg, ctx.data, corpus, part, num_parts, RowFilter(cfg.corpus.filters))
    return ScannedPartition(
        fingerprint=ctx.data.fingerprint,
        part=part,
        num_parts=num_parts,
        rows=done["rows"],
        dropped_by_filters=done["dropped_by_filters"],
    )
