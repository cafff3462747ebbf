"""Shard-writing primitives: tokenize rows in batches, pack them into `max_length` chunks, write blocks of
chunks as TFRecord shard files. The one writer that uses them is mlm_tasks/shards_parallel.py.

    for split, batch, encodings in encoded_batches(corpus.split_rows(0, 1), tokenizer, 1000):
        block = chunkers[split].add(batch, encodings)          # [n, max_length] ids, tail carried over
        writers[split].write(block)                            # shards of records_per_shard records
    shards = writers[split].finish()                           # [{"file", "records", "bytes", "sha256"}]

Streaming: rows are encoded a batch at a time and records leave memory as soon as they are written,
so memory stays flat however large the corpus. Records are encoded a block at a time without
TensorFlow (mlm_tasks/tfrecord.py: the same bytes as tf.io.TFRecordWriter, several times faster).

Every record holds `input_ids` and `attention_mask` (all ones: chunks are packed) as int64 lists, and
every file name ends in `-<index>-<records>.tfrecord`: the layout Hugging Face's TF/TPU scripts
(language-modeling-tpu `prepare_tfrecord_shards.py` / `run_mlm.py`) write and read, which count
records from the names with the regex `-\\d+-(\\d+)\\.tfrecord`.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import chain

import numpy as np

from mlm_tasks.config import ConfigError, ShardConfig
from mlm_tasks.tfrecord import encode_examples, frame_records

log = logging.getLogger(__name__)
FEATURES = ["input_ids", "attention_mask"]
# What the Hugging Face TF/TPU training script parses a shard's record count from (run_mlm.py count_samples).
RECORDS_IN_NAME = re.compile(r"-\d+-(\d+)\.tfrecord")


def shard_name(prefix: str, index: int, records: int) -> str:
    """`<prefix>-<index>-<records>.tfrecord`; `prefix` must not end in `-<digits>` (the regex would then
    read the index as the count)."""
    return f"{prefix}-{index:05d}-{records}.tfrecord"


def records_from_name(name: str) -> int | None:
    """The record count a file name carries, as run_mlm.py reads it; None when it carries none."""
    found = RECORDS_IN_NAME.search(name.rsplit("/", 1)[-1])
    return int(found.group(1)) if found else None


def encoded_batches(split_rows: Iterable[tuple[str, str]], tokenizer, batch_rows: int
                    ) -> Iterator[tuple[str, list[str], list]]:
    """(split, rows, encodings) for batches of `batch_rows` rows of one split each, in row order per split,
    from one stream of (split, row) pairs: a corpus is read once for all its splits."""
    backend = tokenizer.backend_tokenizer if hasattr(tokenizer, "backend_tokenizer") else tokenizer
    # encode_batch_fast skips the character offsets nobody here reads: the same ids, ~25% faster.
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)

    def batches() -> Iterator[tuple[str, list[str]]]:
        pending: dict[str, list[str]] = {}
        for split, row in split_rows:
            batch = pending.setdefault(split, [])
            batch.append(row)
            if len(batch) >= batch_rows:
                yield split, pending.pop(split)
        yield from pending.items()

    # encode_batch releases the GIL: the next batch is tokenized while this thread reads rows, chunks
    # and writes the previous one (bench/bench_shards.py: that Python work otherwise adds to the encode).
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
    What is left over (< max_length ids) is `tail`: partitioned writers join the tails up at the end."""

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


def chunk_stream(rows: Iterable[str], tokenizer, cfg: ShardConfig, stats: dict) -> Iterator[np.ndarray]:
    """Yield [n, max_length] int32 blocks of one stream of rows; the tail shorter than one chunk is left
    in stats["tail"], rows and characters in stats["rows"], stats["characters"]."""
    chunker = Chunker(cfg.max_length)
    for _, batch, encodings in encoded_batches((("", r) for r in rows), tokenizer, cfg.tokenize_batch_rows):
        block = chunker.add(batch, encodings)
        if len(block):
            yield block
    stats.update(rows=chunker.rows, characters=chunker.characters, tail=chunker.tail)


class BlockWriter:
    """Writes [n, max_length] blocks into `out_dir/split/` as shards of `records_per_shard` records named
    shard_name(prefix, i, records); `finish()` lists them with their records, bytes and sha256."""

    def __init__(self, out_dir: str, split: str, prefix: str, cfg: ShardConfig):
        self.dir, self.split, self.prefix, self.cfg = os.path.join(out_dir, split), split, prefix, cfg
        os.makedirs(self.dir, exist_ok=True)
        self.shards: list[dict] = []
        self.file, self.count, self.records = None, 0, 0
        self.t0 = self.last_log = time.time()

    def write(self, block: np.ndarray) -> None:
        # A whole block is encoded at once (see mlm_tasks/tfrecord.py): no TensorFlow, no proto per record.
        encoded, done = encode_examples(block) if len(block) else [], 0
        while done < len(encoded):
            if self.file is None:
                # Held open across write() calls: closed when the shard is full or the split ends.
                name = os.path.join(self.dir, f"part-{len(self.shards):05d}.tfrecord")
                self.file, self.count = open(name, "wb"), 0  # noqa: SIM115
            take = min(self.cfg.records_per_shard - self.count, len(encoded) - done)
            self.file.write(frame_records(encoded[done:done + take]))
            done, self.count, self.records = done + take, self.count + take, self.records + take
            if self.count == self.cfg.records_per_shard:
                self._close()
        if time.time() - self.last_log > 10:  # progress for long corpora, quiet for small ones
            self.last_log = time.time()
            log.info("%s: %d records so far (%.0f tokens/s)", self.split, self.records,
                     self.records * self.cfg.max_length / max(self.last_log - self.t0, 1e-9))

    def _close(self) -> None:
        self.file.close()
        # The count goes into the name only now that it is known: a finished shard is renamed once.
        final = os.path.join(self.dir, shard_name(self.prefix, len(self.shards), self.count))
        os.replace(self.file.name, final)
        self.shards.append({"file": f"{self.split}/{os.path.basename(final)}", "records": self.count,
                            "bytes": os.path.getsize(final), "sha256": file_sha256(final)})
        self.file = None

    def finish(self) -> list[dict]:
        if self.file is not None:
            self._close()
        return self.shards


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


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
