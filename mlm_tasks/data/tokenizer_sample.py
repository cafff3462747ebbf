"""The tokenizer's training text: the kept train rows with the smallest row hashes that fit the budget.

rows, stats = tokenizer_sample(paths, num_parts, budget_bytes)   # rows by ascending row hash
"""

from __future__ import annotations

import heapq
import json
import os
import tempfile
from collections.abc import Iterator

from mlm_tasks import storage
from mlm_tasks.data.dedup.clusters import is_set, removed_bits
from mlm_tasks.data.dedup.scan import scan_dir
from mlm_tasks.paths import join


def _candidates(path: str, part: int) -> Iterator[tuple[int, int, int, str]]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            h, index, row = json.loads(line)
            yield h, part, index, row


def tokenizer_sample(paths, num_parts: int, budget: int) -> tuple[list[str], dict]:
    removed = [removed_bits(paths, part, num_parts) for part in range(num_parts)]  # a bit per row of the corpus
    rows: list[str] = []
    taken = candidates = 0
    last = None
    with tempfile.TemporaryDirectory(prefix="mlm-tokenizer-sample-") as tmp:
        streams = []
        for part in range(num_parts):
            local = os.path.join(tmp, f"{part}.jsonl")
            storage.copy_to_local(join(scan_dir(paths, part, num_parts), "sample.jsonl"), local)
            streams.append(_candidates(local, part))
        for h, part, index, row in heapq.merge(*streams):
            candidates += 1
            if is_set(removed, part, index) or h == last:  # removed by the dedup, or a copy already taken
                continue
            size = len(row.encode("utf-8"))
            if taken + size > budget and rows:
                break
            rows.append(row)
            taken, last = taken + size, h
    return rows, {"rows": len(rows), "bytes": taken, "budget_bytes": budget, "candidates_read": candidates}
