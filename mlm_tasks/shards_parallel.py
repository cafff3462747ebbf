"""Write the shard set with several workers: each writes one corpus partition, a merge publishes the set.

    from mlm_tasks.shards_parallel import write_partition, merge_manifests
    parts = [write_partition(cfg, paths, p, 4) for p in range(4)]    # any order, any machine, in parallel
    manifest = merge_manifests(cfg, paths, 4, extra)                  # manifest.json and _SUCCESS last

The tokenizer must already be published at `paths.tokenizer` (prepare-data trains it first).

Partitions: each split's row stream is cut into blocks of `shards.tokenize_batch_rows` consecutive rows,
dealt round-robin to the partitions (whole blocks, so paragraphs stay next to their neighbours).
Every corpus of mlm_tasks.corpus implements `rows_partition(split, part, num_parts)`, which skips the
other partitions' rows before parsing them (whole pages of a dump, blocks of lines of local files,
`datasets`' `shard()`), so each worker does 1/num_parts of the work. A corpus without it falls back
to reading the whole stream and keeping every num_parts-th block of `tokenize_batch_rows` rows.

Equal counts: a partition keeps only whole chunks and records its tail (< max_length ids) in its
partial manifest; the merge joins the tails in partition order and writes the whole chunks among them
as one more shard. Records = floor(sum of all ids / max_length), exactly as one worker writes, so the
merged manifest has the single worker's records, tokens, rows and characters. The chunk boundaries
(which ids share a record) differ, as would any change of row order; the ids are the same multiset
except for the < max_length ids either way drops at the very end.

Safe to rerun: a partition whose partial manifest exists is skipped; shards go to names that carry
the partition (`train/p00001-of-00004-00000.tfrecord`), so partitions never collide; the merge writes
manifest.json and then _SUCCESS, last, as the single writer does.

Airflow: dags/mlm_pretrain.py and dags/mlm_dataset_refresh.py run plan_shards -> write_shards (mapped,
one task per partition, through mlm_tasks.prepare.write_data_partition) -> the merge task
(mlm_tasks.prepare.finish_data). bench/bench_scaleout.py times 1 against 2 workers.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator

import numpy as np

from mlm_tasks import storage
from mlm_tasks.config import ConfigError, PipelineConfig
from mlm_tasks.corpus import open_corpus
from mlm_tasks.paths import SPLITS, DataPaths, join
from mlm_tasks.shards import MANIFEST_VERSION, check_split_written, chunk_stream, write_blocks

log = logging.getLogger(__name__)


def partition_manifest_uri(paths: DataPaths, part: int, num_parts: int) -> str:
    return join(paths.root, "partitions", f"p{part:05d}-of-{num_parts:05d}.json")


def partition_rows(rows: Iterable[str], part: int, num_parts: int, block_rows: int) -> Iterator[str]:
    """This partition's rows: blocks of `block_rows` consecutive rows, block b going to partition b % num_parts."""
    for i, row in enumerate(rows):
        if (i // block_rows) % num_parts == part:
            yield row


def _rows(corpus, split: str, part: int, num_parts: int, block_rows: int) -> tuple[Iterator[str], bool]:
    """This partition's rows, and whether the corpus skipped the others' rows itself (then its article
    counts are this partition's own, and the merge adds them up)."""
    try:
        return corpus.rows_partition(split, part, num_parts), True
    except NotImplementedError:
        return partition_rows(corpus.rows(split), part, num_parts, block_rows), False


def write_partition(cfg: PipelineConfig, paths: DataPaths, part: int, num_parts: int) -> dict:
    """Write partition `part` of `num_parts` of every split; returns (and stores) its partial manifest."""
    from mlm_tasks.tokenizer import load_tokenizer

    if not 0 <= part < num_parts:
        raise ConfigError(f"Partition {part} is outside 0..{num_parts - 1}: check the mapped task's index.")
    marker = partition_manifest_uri(paths, part, num_parts)
    if storage.exists(marker):
        log.info("Partition %d/%d already written (%s): nothing to do", part, num_parts, marker)
        return storage.read_json(marker)
    tokenizer = load_tokenizer(paths.tokenizer, cfg.shards.max_length)
    corpus = open_corpus(cfg.corpus)
    partial = {"part": part, "num_parts": num_parts, "splits": {}}
    with tempfile.TemporaryDirectory(prefix=".shards-part-") as staging:
        for split in SPLITS:
            stats = {"rows": 0, "characters": 0}
            rows, own = _rows(corpus, split, part, num_parts, cfg.shards.tokenize_batch_rows)
            entry = write_blocks(chunk_stream(rows, tokenizer, cfg.shards, stats), cfg.shards, staging, split, stats)
            for i, shard in enumerate(entry["shards"]):
                name = f"{split}/p{part:05d}-of-{num_parts:05d}-{i:05d}.tfrecord"
                _put(os.path.join(staging, shard["file"]), join(paths.shards_dir, name))
                shard["file"] = name
            entry["tail"] = stats["tail"].tolist()
            entry["articles"] = getattr(corpus, "articles_seen", {}).get(split) if own else None
            partial["splits"][split] = entry
    storage.write_json(marker, partial)  # last: marks this partition done
    return partial


def merge_manifests(cfg: PipelineConfig, paths: DataPaths, num_parts: int, extra: dict) -> dict:
    """Join the partitions' tails into a last shard, then publish manifest.json and _SUCCESS."""
    if storage.exists(paths.success):
        return storage.read_json(paths.manifest)
    partials = []
    for part in range(num_parts):
        uri = partition_manifest_uri(paths, part, num_parts)
        if not storage.exists(uri):
            raise FileNotFoundError(f"Partition {part} of {num_parts} is not written ({uri} missing): rerun "
                                    "its shard task, then the merge.")
        partials.append(storage.read_json(uri))
    sc = cfg.shards
    manifest = {"version": MANIFEST_VERSION, "fingerprint": paths.fingerprint, "max_length": sc.max_length,
                "records_per_shard": sc.records_per_shard, "features": ["input_ids"], "splits": {}, **extra}
    with tempfile.TemporaryDirectory(prefix=".shards-merge-") as staging:
        for split in SPLITS:
            entries = [p["splits"][split] for p in partials]
            tail = np.asarray([i for e in entries for i in e["tail"]], dtype=np.int32)
            usable = len(tail) // sc.max_length * sc.max_length
            blocks = [tail[:usable].reshape(-1, sc.max_length)] if usable else []
            last = write_blocks(blocks, sc, staging, split, {})
            shards = [s for e in entries for s in e["shards"]]
            for shard in last["shards"]:
                name = f"{split}/tail-{os.path.basename(shard['file'])}"
                _put(os.path.join(staging, shard["file"]), join(paths.shards_dir, name))
                shards.append({**shard, "file": name})
            records = sum(e["records"] for e in entries) + last["records"]
            entry = {"records": records, "tokens": records * sc.max_length,
                     "rows": sum(e["rows"] for e in entries),
                     "characters": sum(e["characters"] for e in entries), "shards": shards}
            if all(e.get("articles") is not None for e in entries):
                entry["articles"] = sum(e["articles"] for e in entries)
            check_split_written(split, entry, sc.max_length)
            manifest["splits"][split] = entry
    storage.write_json(paths.manifest, manifest)
    storage.write_text(paths.success, "")  # last: what the sensors wait for
    return manifest


def _put(local_file: str, uri: str) -> None:
    if storage.is_local(uri):
        target = storage.local_path(uri)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.move(local_file, target)
    else:
        with open(local_file, "rb") as f:
            storage.write_bytes(uri, f.read())
