"""Tokenize rows in batches, concatenate, cut `max_length` chunks, write TFRecord shards per split.

    python -m mlm_tasks prepare-data     # tokenizer + shards, reused when the fingerprint is unchanged

Streaming: rows are encoded a batch at a time and records leave memory as soon as they are written,
so memory stays flat however large the corpus. Records are encoded a block at a time without
TensorFlow (mlm_tasks/tfrecord.py: the same bytes as tf.io.TFRecordWriter, several times faster). Each record holds only `input_ids`: chunks are packed,
so the attention mask is all ones and is rebuilt in the input pipeline instead of doubling the bytes.

Atomic publish: shards are written to a private staging folder; locally the finished folder is renamed
into place in one step, on GCS every object is uploaded and the manifest and `_SUCCESS` go last.
Readers trust nothing without `_SUCCESS`, and verify shard checksums against the manifest.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from mlm_tasks import storage
from mlm_tasks.config import ConfigError, ShardConfig
from mlm_tasks.paths import SPLITS, DataPaths, join
from mlm_tasks.tfrecord import encode_examples, frame_records

log = logging.getLogger(__name__)
MANIFEST_VERSION = 1
STAGING_PREFIX = ".shards-staging-"


def _batches(rows: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def chunk_stream(rows: Iterable[str], tokenizer, cfg: ShardConfig, stats: dict) -> Iterator[np.ndarray]:
    """Yield [n, max_length] int32 blocks of concatenated token ids; the tail shorter than one chunk is dropped."""
    backend = tokenizer.backend_tokenizer if hasattr(tokenizer, "backend_tokenizer") else tokenizer
    # encode_batch_fast skips the character offsets nobody here reads: the same ids, ~25% faster.
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    carry = np.zeros(0, dtype=np.int32)

    def chunks(batch, encodings):
        nonlocal carry
        ids = np.concatenate([carry] + [np.asarray(e.ids, dtype=np.int32) for e in encodings])
        stats["rows"] += len(batch)
        stats["characters"] += sum(len(r) for r in batch)
        usable = len(ids) // cfg.max_length * cfg.max_length
        carry = ids[usable:]
        return ids[:usable].reshape(-1, cfg.max_length)

    # encode_batch releases the GIL: the next batch is tokenized while this thread reads rows, chunks
    # and writes the previous one (bench/bench_shards.py: that Python work otherwise adds to the encode).
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = None
        for batch in _batches(rows, cfg.tokenize_batch_rows):
            # adds <s> ... </s> per row, as the reference does
            future = pool.submit(encode, batch)
            if pending is not None:
                block = chunks(pending[0], pending[1].result())
                if len(block):
                    yield block
            pending = (batch, future)
        if pending is not None:
            block = chunks(pending[0], pending[1].result())
            if len(block):
                yield block
    stats["tail"] = carry  # the dropped tail: partitioned writers (shards_parallel) join the tails up


def write_split(rows: Iterable[str], tokenizer, cfg: ShardConfig, out_dir: str, split: str) -> dict:
    """Write one split's shards into the local folder `out_dir/split`; returns its manifest entry."""
    stats = {"rows": 0, "characters": 0}
    return write_blocks(chunk_stream(rows, tokenizer, cfg, stats), cfg, out_dir, split, stats)


def write_blocks(blocks: Iterable[np.ndarray], cfg: ShardConfig, out_dir: str, split: str, stats: dict) -> dict:
    """Write [n, max_length] id blocks as shards `out_dir/split/shard-*`; returns the split's manifest entry."""
    os.makedirs(os.path.join(out_dir, split), exist_ok=True)
    shards: list[dict] = []
    writer, count, t0 = None, 0, time.time()
    records, last_log = 0, t0
    for block in blocks:
        # A whole block is encoded at once (see mlm_tasks/tfrecord.py): no TensorFlow, no proto per record.
        encoded = encode_examples(block)
        done = 0
        while done < len(encoded):
            if writer is None:
                tmp_name = os.path.join(out_dir, split, f"part-{len(shards):05d}.tfrecord")
                writer, count = open(tmp_name, "wb"), 0
            take = min(cfg.records_per_shard - count, len(encoded) - done)
            writer.write(frame_records(encoded[done:done + take]))
            done, count, records = done + take, count + take, records + take
            if count == cfg.records_per_shard:
                writer.close()
                shards.append({"part": tmp_name, "records": count})
                writer = None
        if time.time() - last_log > 10:  # progress for long corpora, quiet for small ones
            last_log = time.time()
            log.info("%s: %d rows, %d records so far (%.0f tokens/s)", split, stats.get("rows", 0), records,
                     records * cfg.max_length / max(last_log - t0, 1e-9))
    if writer is not None:
        writer.close()
        shards.append({"part": tmp_name, "records": count})
    # Counts live in the manifest; names say position and total so a listing shows a complete set.
    total = len(shards)
    for i, shard in enumerate(shards):
        final = os.path.join(out_dir, split, f"shard-{i:05d}-of-{total:05d}.tfrecord")
        os.replace(shard.pop("part"), final)
        shard["file"] = f"{split}/{os.path.basename(final)}"
        shard["bytes"] = os.path.getsize(final)
        shard["sha256"] = file_sha256(final)
    return {"records": records, "tokens": records * cfg.max_length, "rows": stats.get("rows", 0),
            "characters": stats.get("characters", 0), "shards": shards}


def write_shards(corpus, tokenizer, cfg: ShardConfig, paths: DataPaths, extra: dict) -> dict:
    """Write every split, then publish the set atomically. Returns the manifest."""
    manifest = {"version": MANIFEST_VERSION, "fingerprint": paths.fingerprint,
                "max_length": cfg.max_length, "records_per_shard": cfg.records_per_shard,
                "features": ["input_ids"], "splits": {}, **extra}
    staging_parent = storage.local_path(paths.root) if storage.is_local(paths.root) else None
    if staging_parent:
        os.makedirs(staging_parent, exist_ok=True)
        _remove_dead_stagings(staging_parent)
    # Host and pid in the name let a later writer tell a SIGKILLed writer's leftovers from a live one's.
    staging = tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{socket.gethostname()}-{os.getpid()}-", dir=staging_parent)
    try:
        for split in SPLITS:
            t0 = time.time()
            entry = write_split(corpus.rows(split), tokenizer, cfg, staging, split)
            check_split_written(split, entry, cfg.max_length)
            if split in getattr(corpus, "articles_seen", {}):
                entry["articles"] = corpus.articles_seen[split]
            manifest["splits"][split] = entry
            log.info("%s: %d records (%d tokens) in %d shards, %.1fs", split, entry["records"],
                     entry["tokens"], len(entry["shards"]), time.time() - t0)
        return publish_shard_set(staging, paths, manifest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def check_split_written(split: str, entry: dict, max_length: int) -> None:
    """Training needs at least one chunk of train and of validation data: say what to change if not."""
    if split == "train" and entry["rows"] == 0:
        raise ConfigError("The corpus is empty: its train split has no text rows. Check the corpus "
                          "source settings (paths, dataset name, text_column).")
    if split in ("train", "validation") and entry["records"] == 0:
        more = "add text or lower max_length" if split == "train" else \
            "add text, lower max_length, or raise corpus.validation_fraction"
        raise ConfigError(f"The {split} split ({entry['rows']} rows, {entry['characters']} characters) "
                          f"is shorter than one chunk of {max_length} tokens: {more}.")


def publish_shard_set(staging: str, paths: DataPaths, manifest: dict) -> dict:
    """Make the finished set in `staging` visible all at once; returns the manifest now published.

    Two writers of one fingerprint encode with the same tokenizer (first writer wins it, both read it
    back), so their sets are identical: whoever publishes second keeps the first set and returns its
    manifest, so both report the same data.
    """
    storage.write_json(os.path.join(staging, "manifest.json"), manifest)
    storage.write_text(os.path.join(staging, "_SUCCESS"), "")
    if storage.is_local(paths.shards_dir):
        _rename_into_place(staging, storage.local_path(paths.shards_dir))
        return storage.read_json(paths.manifest)
    if storage.exists(paths.success):
        log.info("Another writer published %s first: keeping its set", paths.shards_dir)
        return storage.read_json(paths.manifest)
    # GCS has no folder rename: objects first, then the manifest, then _SUCCESS, which is all readers
    # trust. A concurrent writer of the same fingerprint uploads identical bytes, so overwrites are harmless.
    for split, entry in manifest["splits"].items():
        for shard in entry["shards"]:
            with open(os.path.join(staging, shard["file"]), "rb") as f:
                storage.write_bytes(join(paths.shards_dir, shard["file"]), f.read())
    storage.write_json(paths.manifest, manifest)
    storage.write_text(paths.success, "")  # last: what the sensors wait for
    return manifest


def _rename_into_place(staging: str, final: str) -> None:
    try:
        os.rename(staging, final)  # atomic; fails if a concurrent writer already published
        return
    except OSError:
        if os.path.exists(os.path.join(final, "_SUCCESS")):
            log.info("Another writer published %s first: keeping its set", final)
            return
    # A folder without _SUCCESS (left by an older writer): move it aside in one step rather than
    # deleting it in place, so no reader ever sees a half-deleted set under the final name.
    aside = f"{os.path.dirname(final)}/{STAGING_PREFIX}stale-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(final, aside)
    except FileNotFoundError:
        pass
    try:
        os.rename(staging, final)
    except OSError:
        if not os.path.exists(os.path.join(final, "_SUCCESS")):
            raise
        log.info("Another writer published %s first: keeping its set", final)
    shutil.rmtree(aside, ignore_errors=True)


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


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def shard_uris(paths: DataPaths, manifest: dict, split: str) -> list[str]:
    return [join(paths.shards_dir, s["file"]) for s in manifest["splits"][split]["shards"]]


def verify_shards(paths: DataPaths, manifest: dict, split: str) -> None:
    """Fail loudly on a missing, truncated or corrupted shard instead of training on less data."""
    for shard in manifest["splits"][split]["shards"]:
        uri = join(paths.shards_dir, shard["file"])
        if not storage.exists(uri):
            raise FileNotFoundError(f"Shard {uri} listed in the manifest is missing: delete {paths.success} "
                                    "and rerun prepare-data to rebuild the set.")
        h = hashlib.sha256()
        with storage.filesystem(uri).open(uri, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        digest = h.hexdigest()
        if digest != shard["sha256"]:
            raise ValueError(f"Shard {uri} is corrupted or truncated (sha256 {digest[:12]}…, manifest says "
                             f"{shard['sha256'][:12]}…): delete {paths.success} and rerun prepare-data.")
