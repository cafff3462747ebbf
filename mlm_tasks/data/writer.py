"""The shard-set writer: each task writes one corpus partition, a merge publishes the set.

    parts = [write_partition(cfg, paths, p, 4) for p in range(4)]    # any order, any machine, in parallel
    shard_set = merge_partitions(cfg, paths, 4, extra)               # manifest.json and _SUCCESS last
docs/data.md#how-a-partition-is-written
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from typing import Any, BinaryIO, TypeVar

import numpy as np

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig, ShardConfig
from mlm_tasks.data.corpus import open_corpus
from mlm_tasks.data.corpus.base import empty_corpus_error
from mlm_tasks.data.dedup.clusters import kept_source_rows
from mlm_tasks.data.shard_set import ShardSet, publish_manifest
from mlm_tasks.data.tfrecord import encode_examples, frame_records, shard_name
from mlm_tasks.data.tokenizer import load_encoder
from mlm_tasks.errors import ConfigError, MissingArtifactError
from mlm_tasks.paths import SPLITS, DataPaths, join

log = logging.getLogger(__name__)
K = TypeVar("K")


def encoded_batches(
    split_rows: Iterable[tuple[K, str]], tokenizer, batch_rows: int
) -> Iterator[tuple[K, list[str], list]]:
    """(key, rows, encodings) for batches of `batch_rows` rows of one key each, in row order per key, from
    one stream of (key, row) pairs (the writer's key: split and mixture source)."""
    backend = tokenizer.backend_tokenizer if hasattr(tokenizer, "backend_tokenizer") else tokenizer
    # encode_batch_fast skips the character offsets nobody here reads: the same ids, ~25% faster.
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)

    def batches() -> Iterator[tuple[K, list[str]]]:
        pending: dict[K, list[str]] = {}
        for split, row in split_rows:
            batch = pending.setdefault(split, [])
            batch.append(row)
            if len(batch) >= batch_rows:
                yield split, pending.pop(split)
        yield from pending.items()

    # encode_batch releases the GIL: the next batch is tokenized while this thread chunks and writes the last.
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = None
        for split, batch in batches():
            future = pool.submit(encode, batch)  # adds <s> ... </s> per row, as the reference does
            if pending is not None:
                yield pending[0], pending[1], pending[2].result()
            pending = (split, batch, future)
        if pending is not None:
            yield pending[0], pending[1], pending[2].result()


class Chunker:
    """Concatenates one split's encodings and cuts whole `max_length` chunks; counts rows and characters.
    The rest (< max_length ids) is `tail`: the merge joins the partitions' tails."""

    def __init__(self, max_length: int):
        self.max_length, self.rows, self.characters = max_length, 0, 0
        self.tail = np.zeros(0, dtype=np.int32)

    def add(self, batch: list[str], encodings) -> np.ndarray:
        # One fromiter over all rows: a numpy array per row costs more than the rest of the chunking.
        ids = np.concatenate([self.tail, np.fromiter(chain.from_iterable(e.ids for e in encodings), dtype=np.int32)])
        self.rows += len(batch)
        self.characters += sum(len(r) for r in batch)
        usable = len(ids) // self.max_length * self.max_length
        self.tail = ids[usable:]
        return ids[:usable].reshape(-1, self.max_length)


class BlockWriter:
    """Writes [n, max_length] blocks into `out_dir/split/` as shards of `records_per_shard` records named
    shard_name(prefix, i, records); `finish()` lists them with their records, bytes and sha256."""

    def __init__(self, out_dir: str, split: str, prefix: str, cfg: ShardConfig, source: str = ""):
        self.dir, self.split, self.prefix, self.cfg = os.path.join(out_dir, split), split, prefix, cfg
        self.source = source  # a mixture source's name: each shard entry says it
        os.makedirs(self.dir, exist_ok=True)
        self.shards: list[dict] = []
        self.file: BinaryIO | None = None
        self.count = self.records = 0
        self.t0 = self.last_log = time.time()

    def write(self, block: np.ndarray) -> None:
        encoded, done = encode_examples(block) if len(block) else [], 0
        while done < len(encoded):
            if self.file is None:  # open across write() calls, until the shard is full or the split ends
                name = os.path.join(self.dir, f"{self.prefix}.part-{len(self.shards):05d}")
                self.file, self.count = open(name, "wb"), 0  # noqa: SIM115
            take = min(self.cfg.records_per_shard - self.count, len(encoded) - done)
            self.file.write(frame_records(encoded[done : done + take]))
            done, self.count, self.records = done + take, self.count + take, self.records + take
            if self.count == self.cfg.records_per_shard:
                self._close(self.file)
        if time.time() - self.last_log > 10:  # progress for long corpora, quiet for small ones
            self.last_log = time.time()
            rate = self.records * self.cfg.max_length / max(self.last_log - self.t0, 1e-9)
            log.info("%s: %d records so far (%.0f tokens/s)", self.split, self.records, rate)

    def _close(self, file: BinaryIO) -> None:
        file.close()
        # The count goes into the name only now that it is known: a finished shard is renamed once.
        final = os.path.join(self.dir, shard_name(self.prefix, len(self.shards), self.count))
        os.replace(file.name, final)
        self.shards.append(
            {
                "file": f"{self.split}/{os.path.basename(final)}",
                "records": self.count,
                "bytes": os.path.getsize(final),
                "sha256": storage.sha256(final),
                **({"source": self.source} if self.source else {}),
            }
        )
        self.file = None

    def finish(self) -> list[dict]:
        if self.file is not None:
            self._close(self.file)
        return self.shards


def check_split_written(split: str, entry: dict, max_length: int) -> None:
    """Training needs at least one chunk of train and of validation data: say what to change if not."""
    if split == "train" and entry["rows"] == 0:
        raise empty_corpus_error()
    if split in ("train", "validation") and entry["records"] == 0:
        more = (
            "add text or lower max_length"
            if split == "train"
            else "add text, lower max_length, or raise corpus.validation_fraction"
        )
        raise ConfigError(
            f"The {split} split ({entry['rows']} rows, {entry['characters']} characters) "
            f"is shorter than one chunk of {max_length} tokens: {more}."
        )


STAGING_PREFIX = ".shards-staging-"


def partition_manifest_uri(paths: DataPaths, part: int, num_parts: int) -> str:
    return join(paths.partitions_dir, f"p{part:05d}-of-{num_parts:05d}.json")


def write_partition(cfg: PipelineConfig, paths: DataPaths, part: int, num_parts: int, corpus=None) -> dict:
    """Write partition `part` of `num_parts` of every split; returns (and stores) its partial manifest.
    A mixture's sources are chunked and written apart (shards `<split>-<source>-p…`), each with its tail."""
    if not 0 <= part < num_parts:
        raise ConfigError(f"Partition {part} is outside 0..{num_parts - 1}: check the mapped task's index.")
    marker = partition_manifest_uri(paths, part, num_parts)
    if storage.exists(marker):
        log.info("Partition %d/%d already written (%s): nothing to do", part, num_parts, marker)
        return storage.read_json(marker)
    tokenizer = load_encoder(paths.tokenizer)
    corpus = corpus or open_corpus(cfg.corpus)
    sc = cfg.shards
    keys = [(split, source) for split in SPLITS for source in corpus.source_names()]
    staging = _staging_dir(paths)
    try:
        chunkers = {k: Chunker(sc.max_length) for k in keys}
        writers = {k: BlockWriter(staging, k[0], _prefix(*k, f"p{part:05d}of{num_parts:05d}"), sc, k[1]) for k in keys}
        stream = (((split, source), row) for source, split, row in kept_source_rows(corpus, paths, part, num_parts))
        for key, batch, encodings in encoded_batches(stream, tokenizer, sc.tokenize_batch_rows):
            writers[key].write(chunkers[key].add(batch, encodings))
        entries: dict[str, dict[str, dict]] = {split: {} for split in SPLITS}  # by split, then source
        for split, source in keys:
            shards, chunker = writers[(split, source)].finish(), chunkers[(split, source)]
            records = sum(s["records"] for s in shards)
            read = corpus.sources[source] if source else corpus  # the articles its last read saw (dump sources)
            entries[split][source] = {
                "records": records,
                "tokens": records * sc.max_length,
                "rows": chunker.rows,
                "characters": chunker.characters,
                "shards": shards,
                "tail": chunker.tail.tolist(),
                "articles": getattr(read, "articles_seen", {}).get(split),
            }
        single = corpus.source_names() == [""]
        splits = {s: by[""] if single else {**_total(by.values()), "sources": by} for s, by in entries.items()}
        partial = {"part": part, "num_parts": num_parts, "splits": splits}
        _move_into_set(staging, paths, [s for by in entries.values() for e in by.values() for s in e["shards"]])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    storage.write_json(marker, partial)  # last: marks this partition done
    return partial


def merge_partitions(cfg: PipelineConfig, paths: DataPaths, num_parts: int, extra: dict) -> ShardSet:
    """Join the partitions' tails into a last shard per split (and source), then publish manifest.json and _SUCCESS."""
    if storage.exists(paths.success):
        return ShardSet.load(paths)
    partials = []
    for part in range(num_parts):
        uri = partition_manifest_uri(paths, part, num_parts)
        if not storage.exists(uri):
            raise MissingArtifactError(
                f"Partition {part} of {num_parts} is not written ({uri} missing): rerun its shard task, then the merge."
            )
        partials.append(storage.read_json(uri))
    sc = cfg.shards
    splits = {}
    staging = _staging_dir(paths)
    try:
        for split in SPLITS:
            entries = [p["splits"][split] for p in partials]
            if "sources" not in entries[0]:
                entry = _merge_tails(sc, paths, staging, split, "", entries)
            else:
                by_source = {
                    name: _merge_tails(sc, paths, staging, split, name, [e["sources"][name] for e in entries])
                    for name in entries[0]["sources"]
                }
                entry = {**_total(by_source.values()), "sources": {}}
                for name, e in by_source.items():
                    entry["sources"][name] = {**e, "shards": len(e["shards"])}  # the shards are in the split's list
                    if split == "train" and e["records"] == 0:
                        raise ConfigError(
                            f"Mixture source {name!r} has no whole train chunk ({e['rows']} rows, {e['characters']} "
                            f"characters after filters and dedup, {sc.max_length} tokens a chunk): training could "
                            "draw nothing from it. Add text to it, lower max_length, or remove it from corpus.mixture."
                        )
            check_split_written(split, entry, sc.max_length)
            splits[split] = entry
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return publish_manifest(paths, sc.max_length, sc.records_per_shard, splits, extra)


def _prefix(split: str, source: str, suffix: str) -> str:
    """`<split>-<suffix>`, or `<split>-<source>-<suffix>` for a mixture source: the suffix (p00001of00004,
    tail) has no `-`, so distinct sources never give one name, and no prefix ends in `-<digits>`."""
    return f"{split}-{source}-{suffix}" if source else f"{split}-{suffix}"


def _merge_tails(sc: ShardConfig, paths: DataPaths, staging: str, split: str, source: str, entries: list) -> dict:
    """One split's (one source's) partial entries as one, the whole chunks of their joined tails one more shard."""
    tail = np.asarray([i for e in entries for i in e["tail"]], dtype=np.int32)
    usable = len(tail) // sc.max_length * sc.max_length
    writer = BlockWriter(staging, split, _prefix(split, source, "tail"), sc, source)
    writer.write(tail[:usable].reshape(-1, sc.max_length))
    last = writer.finish()
    _move_into_set(staging, paths, last)
    entry = _total(entries)
    records = sum(s["records"] for s in last)
    entry.update(records=entry["records"] + records, tokens=entry["tokens"] + records * sc.max_length)
    entry["shards"] += last
    return entry


def _total(entries: Iterable[dict]) -> dict:
    """The sum of a split's per-source entries (a mixture): counts, every shard, articles when all have them."""
    entries = list(entries)
    total: dict[str, Any] = {k: sum(e[k] for e in entries) for k in ("records", "tokens", "rows", "characters")}
    total["shards"] = [s for e in entries for s in e["shards"]]
    if entries and all(e.get("articles") is not None for e in entries):
        total["articles"] = sum(e["articles"] for e in entries)
    return total


def _staging_dir(paths: DataPaths) -> str:
    """A private folder for unfinished shards: locally beside the set (finished shards move by rename); host and
    pid in its name let a later writer on that host remove it once its writer was killed half way."""
    parent, mine = None, f"{STAGING_PREFIX}{socket.gethostname()}-"
    if storage.is_local(paths.root):
        parent = storage.local_path(paths.root)
        os.makedirs(parent, exist_ok=True)
        for name in os.listdir(parent):
            pid = name.removeprefix(mine).split("-", 1)[0] if name.startswith(mine) else ""
            if pid.isdigit() and not _alive(int(pid)):
                log.info("Removing %s, left by a writer that was killed half way", name)
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{mine}{os.getpid()}-", dir=parent)


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True
