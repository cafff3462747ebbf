"""The shard-set writer: each task writes one corpus partition, a merge publishes the set. The only one.

    from mlm_tasks.shards_parallel import write_partition, merge_partitions
    parts = [write_partition(cfg, paths, p, 4) for p in range(4)]    # any order, any machine, in parallel
    shard_set = merge_partitions(cfg, paths, 4, extra)               # manifest.json and _SUCCESS last

The DAGs map the `write_shards` step over `shards.partitions` partitions; the CLI (`build_shard_set`,
`run_all`), the benchmarks and the test fixtures write one partition of one, through the same step
functions (mlm_tasks/steps/plan_shards.py, write_shards.py, merge_shards.py). The tokenizer must already be
published at `paths.tokenizer`.

One read per partition: the corpus yields this partition's (split, row) pairs for every split in one
pass (`Corpus.split_rows`), skipping the other partitions' rows before parsing them (whole pages of a
dump, blocks of lines of local files, `datasets`' `shard()`), and the rows go to per-split chunkers
and block writers (mlm_tasks/shards.py).

Equal counts: a partition keeps only whole chunks and records its tail (< max_length ids) in its
partial manifest; the merge joins the tails in partition order and writes the whole chunks among them
as one more shard. Records = floor(sum of all ids / max_length), whatever the partition count.

Names: `<split>/<split>-p00001of00004-00000-2048.tfrecord` (partition 1 of 4, its shard 0, 2048
records) and `<split>/<split>-tail-00000-37.tfrecord` for the joined tails: partitions never collide,
and Hugging Face's `-\\d+-(\\d+)\\.tfrecord` reads exactly the record count from every name.

Safe to kill and to rerun: a partition writes into a private staging folder and moves its finished
shards into the set's folder only at the end (a rename on local disk; object uploads on GCS), then
writes its partial manifest; a partition whose partial manifest exists is skipped. Nothing is trusted
before the merge writes manifest.json and then `_SUCCESS`, last. Two writers of one fingerprint write
the same bytes under the same names, so either may finish first.
"""
from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile

import numpy as np

from mlm_tasks import storage
from mlm_tasks.config import ConfigError, PipelineConfig
from mlm_tasks.manifest import ShardSet, build_manifest, publish_manifest
from mlm_tasks.paths import SPLITS, DataPaths, join
from mlm_tasks.shards import BlockWriter, Chunker, check_split_written, encoded_batches

log = logging.getLogger(__name__)
STAGING_PREFIX = ".shards-staging-"


def partition_manifest_uri(paths: DataPaths, part: int, num_parts: int) -> str:
    return join(paths.partitions_dir, f"p{part:05d}-of-{num_parts:05d}.json")


def write_partition(cfg: PipelineConfig, paths: DataPaths, part: int, num_parts: int, corpus=None) -> dict:
    """Write partition `part` of `num_parts` of every split; returns (and stores) its partial manifest."""
    from mlm_tasks.corpus import open_corpus
    from mlm_tasks.tokenizer import load_encoder

    if not 0 <= part < num_parts:
        raise ConfigError(f"Partition {part} is outside 0..{num_parts - 1}: check the mapped task's index.")
    marker = partition_manifest_uri(paths, part, num_parts)
    if storage.exists(marker):
        log.info("Partition %d/%d already written (%s): nothing to do", part, num_parts, marker)
        return storage.read_json(marker)
    tokenizer = load_encoder(paths.tokenizer)
    corpus = corpus or open_corpus(cfg.corpus)
    sc = cfg.shards
    staging = _staging_dir(paths)
    try:
        chunkers = {s: Chunker(sc.max_length) for s in SPLITS}
        writers = {s: BlockWriter(staging, s, f"{s}-p{part:05d}of{num_parts:05d}", sc) for s in SPLITS}
        for split, batch, encodings in encoded_batches(corpus.split_rows(part, num_parts), tokenizer,
                                                       sc.tokenize_batch_rows):
            writers[split].write(chunkers[split].add(batch, encodings))
        partial = {"part": part, "num_parts": num_parts, "splits": {}}
        articles = getattr(corpus, "articles_seen", {})
        for split in SPLITS:
            shards, chunker = writers[split].finish(), chunkers[split]
            records = sum(s["records"] for s in shards)
            partial["splits"][split] = {
                "records": records, "tokens": records * sc.max_length, "rows": chunker.rows,
                "characters": chunker.characters, "shards": shards, "tail": chunker.tail.tolist(),
                "articles": articles.get(split)}
        _move_into_set(staging, paths, [s for e in partial["splits"].values() for s in e["shards"]])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    storage.write_json(marker, partial)  # last: marks this partition done
    return partial


def merge_partitions(cfg: PipelineConfig, paths: DataPaths, num_parts: int, extra: dict) -> ShardSet:
    """Join the partitions' tails into a last shard per split, then publish manifest.json and _SUCCESS."""
    if storage.exists(paths.success):
        return ShardSet.load(paths)
    partials = []
    for part in range(num_parts):
        uri = partition_manifest_uri(paths, part, num_parts)
        if not storage.exists(uri):
            raise FileNotFoundError(f"Partition {part} of {num_parts} is not written ({uri} missing): rerun "
                                    "its shard task, then the merge.")
        partials.append(storage.read_json(uri))
    sc = cfg.shards
    splits = {}
    staging = _staging_dir(paths)
    try:
        for split in SPLITS:
            entries = [p["splits"][split] for p in partials]
            tail = np.asarray([i for e in entries for i in e["tail"]], dtype=np.int32)
            usable = len(tail) // sc.max_length * sc.max_length
            writer = BlockWriter(staging, split, f"{split}-tail", sc)
            writer.write(tail[:usable].reshape(-1, sc.max_length))
            last = writer.finish()
            _move_into_set(staging, paths, last)
            shards = [s for e in entries for s in e["shards"]] + last
            records = sum(s["records"] for s in shards)
            entry = {"records": records, "tokens": records * sc.max_length,
                     "rows": sum(e["rows"] for e in entries),
                     "characters": sum(e["characters"] for e in entries), "shards": shards}
            if all(e.get("articles") is not None for e in entries):
                entry["articles"] = sum(e["articles"] for e in entries)
            check_split_written(split, entry, sc.max_length)
            splits[split] = entry
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    manifest = build_manifest(paths, sc.max_length, sc.records_per_shard, splits, extra)
    return publish_manifest(paths, manifest)


def _staging_dir(paths: DataPaths) -> str:
    """A private folder for unfinished shards. Locally it sits beside the set, so finished shards move
    into place by rename; host and pid in its name let a later writer remove a killed writer's leftovers."""
    parent = None
    if storage.is_local(paths.root):
        parent = storage.local_path(paths.root)
        os.makedirs(parent, exist_ok=True)
        _remove_dead_stagings(parent)
    return tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{socket.gethostname()}-{os.getpid()}-", dir=parent)


def _move_into_set(staging: str, paths: DataPaths, shards: list[dict]) -> None:
    for shard in shards:
        src, uri = os.path.join(staging, shard["file"]), join(paths.shards_dir, shard["file"])
        if storage.is_local(uri):
            target = storage.local_path(uri)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.replace(src, target)  # atomic; a concurrent writer of the same set has the same bytes
        else:
            with open(src, "rb") as f:
                storage.write_bytes(uri, f.read())


def _remove_dead_stagings(parent: str) -> None:
    """Delete staging folders of writers on this host that no longer run (killed half way)."""
    host = socket.gethostname()
    for name in os.listdir(parent):
        if not name.startswith(f"{STAGING_PREFIX}{host}-"):
            continue
        pid = name[len(f"{STAGING_PREFIX}{host}-"):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            log.info("Removing %s, left by a writer that was killed half way", name)
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
