"""Benchmark: near-duplicate detection's recall by similarity, and what each dedup stage costs per row.

    .venv/bin/python bench/bench_dedup.py [--pairs 200] [--threshold 0.8]

Recall: distinct paragraphs of the embedded Wikipedia sample (80+ words), each planted once more with k
words changed (k = 1..12; an exact copy is exact dedup's), through the real stages (scan_partition,
find_duplicates, cluster_duplicates) in one partition; the Jaccard similarity of each pair's 5-word
shingles is computed exactly, and the table gives, per similarity band, the share of pairs found (and
the S-curve datasketch's bands predict).
Precision: rows removed that are not one of a planted pair (the originals are distinct, so any is a
false positive). Cost: scan rows/s of the embedded corpus with exact dedup alone, and with near dedup.
"""

from __future__ import annotations

import argparse
import random
import re
import tempfile
import time
from pathlib import Path

_WORD = re.compile(r"\w+")


def _shingles(row: str, n: int = 5) -> set[str]:
    words = _WORD.findall(row.lower())
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


def _jaccard(a: str, b: str) -> float:
    x, y = _shingles(a), _shingles(b)
    return len(x & y) / len(x | y)


def main() -> None:
    from mlm_tasks.config import CorpusConfig, build_config
    from mlm_tasks.data.corpus import open_corpus
    from mlm_tasks.data.dedup import dedup_in_process
    from mlm_tasks.data.dedup.clusters import kept_rows
    from mlm_tasks.data.dedup.near_keys import NearKeys
    from mlm_tasks.paths import DataPaths

    p = argparse.ArgumentParser()
    p.add_argument("--pairs", type=int, default=200)
    p.add_argument("--threshold", type=float, default=0.8)
    args = p.parse_args()
    rng = random.Random(0)
    seen, originals = set(), []
    for _, row in open_corpus(CorpusConfig()).split_rows():
        if len(row.split()) >= 80 and row not in seen:
            seen.add(row)
            originals.append(row)
    originals = originals[: args.pairs * 2]
    planted, similarity = [], []
    for i, row in enumerate(originals[: args.pairs]):
        words = row.split()
        for j in rng.sample(range(len(words)), 1 + i % 12):  # 1..12 words: exact copies are exact dedup's
            words[j] = words[j] + "x"
        copy = " ".join(words)
        planted.append(copy)
        similarity.append(_jaccard(row, copy))
    rows = originals + planted
    rng.shuffle(rows)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.txt"
        path.write_text("\n".join(rows) + "\n")
        cfg = build_config(
            {
                "output_root": f"{tmp}/out",
                # Every planted row reaches the dedup (the filters have their own measurements).
                "corpus": {"source": "local_files", "local_paths": [str(path)], "filters": {"enabled": False}},
                "dedup": {"near": True, "near_threshold": args.threshold},
            }
        )
        paths = DataPaths(cfg.output_root, "bench")
        corpus = open_corpus(cfg.corpus)
        dedup_in_process(cfg, paths, corpus, 1)
        written = {row for _, row in kept_rows(corpus, paths, 0, 1)}
    keys = NearKeys(cfg.dedup)
    b, r = keys.bands, keys.rows_per_band
    print(
        f"near dedup at threshold {args.threshold}: datasketch chose {b} bands of {r} rows "
        f"({b * r} of {cfg.dedup.num_perm} permutations)"
    )
    print(f"{'Jaccard':>12} {'pairs':>6} {'found':>6} {'predicted':>9}")
    edges = [0.0, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.01]
    for lo, hi in zip(edges, edges[1:], strict=False):
        band = [i for i, s in enumerate(similarity) if lo <= s < hi]
        if not band:
            continue
        found = sum(1 for i in band if originals[i] not in written or planted[i] not in written)
        mid = sum(similarity[i] for i in band) / len(band)
        predicted = 1 - (1 - mid**r) ** b
        print(f"{lo:5.2f}-{min(hi, 1):4.2f} {len(band):>6} {found / len(band):>6.2f} {predicted:>9.2f}")
    pair_rows = set(originals[: args.pairs]) | set(planted)
    removed = set(rows) - written
    false = len(removed - pair_rows)
    print(
        f"precision: {1 - false / max(len(removed), 1):.3f} "
        f"({false} of {len(removed)} removed rows outside the planted pairs)"
    )

    corpus_cfg = CorpusConfig()
    for near in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            cfg = build_config({"output_root": tmp, "dedup": {"near": near}})
            corpus = open_corpus(corpus_cfg)
            t0 = time.perf_counter()
            stats = dedup_in_process(cfg, DataPaths(tmp, "bench"), corpus, 1)
            seconds = time.perf_counter() - t0
        n = sum(stats["rows"].values())
        removed = stats["duplicates_removed"]
        print(
            f"embedded corpus, {'exact + near' if near else 'exact only'}: {n} rows in {seconds:.1f}s "
            f"({n / seconds:,.0f} rows/s, reading the dump included); removed exact {sum(removed['exact'].values())}, "
            f"near {sum(removed['near'].values())}"
        )


if __name__ == "__main__":
    main()
