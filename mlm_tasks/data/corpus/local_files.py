"""Text files as rows, local or remote (gs://, any fsspec URI): .txt (a row per line), .jsonl
(`corpus.text_column` of each object), .parquet, and .txt.gz / .jsonl.gz (corpus.local_paths: files or globs).
Partitions cut the files' bytes (owned_ranges; a .gz file whole). docs/data.md#reading-a-large-corpus
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
import os
from collections.abc import Iterator
from typing import Any, BinaryIO

from mlm_tasks import storage
from mlm_tasks.config import CorpusConfig
from mlm_tasks.data.corpus.base import Corpus, split_of
from mlm_tasks.errors import ConfigError

log = logging.getLogger(__name__)
FILE_TYPES = (".txt", ".jsonl", ".parquet", ".txt.gz", ".jsonl.gz")
TEXT_UNIT_BYTES = 1 << 20  # a partition unit of text: finer, a task's start-up would cost more than its reading
# A remote object's version, from its listing: a content checksum when there is one (the same bytes
# copied elsewhere keep their fingerprint), else what changes with every write.
CHECKSUM_KEYS = ("md5Hash", "ETag", "etag")
VERSION_KEYS = ("crc32c", "generation", "version_id", "LastModified", "last_modified", "mtime")
MANY_FILES = 64  # above this many files the fingerprint is one hash of the list, not the list
READ_BYTES = 1 << 20  # one read inside the range: a ranged request on object stores
FIRST_TAIL_READ = 1 << 10  # the first read past the range, for the rest of a straddling line; it doubles


def _open(uri: str, ranged: bool) -> BinaryIO:
    """`uri` opened for binary reads; `ranged`: each read a request for exactly its bytes (no read-ahead)."""
    if storage.is_local(uri):
        return open(storage.local_path(uri), "rb", buffering=0 if ranged else -1)
    return storage.filesystem(uri).open(uri, "rb", **({"cache_type": "none"} if ranged else {}))


def list_files(patterns: list[str]) -> dict[str, dict[str, Any]]:
    """Every file the patterns match, in pattern order (each pattern's matches sorted), with its listing."""
    files: dict[str, dict[str, Any]] = {}
    for pattern in patterns:
        matched = storage.glob(pattern)
        if not matched:
            check = (
                "the path (relative paths are relative to the worker's working directory)"
                if storage.is_local(pattern)
                else "the bucket and prefix, and that the worker's credentials may list them"
            )
            raise ConfigError(f"corpus.local_paths entry {pattern!r} matches no file: check {check}.")
        files.update(matched)
    if not files:
        raise ConfigError("corpus.source=local_files needs corpus.local_paths (files or globs).")
    for uri in files:
        if not uri.endswith(FILE_TYPES):
            raise ConfigError(f"{uri}: unsupported file type; use {', '.join(FILE_TYPES)}.")
    return files


class LocalFilesCorpus(Corpus):
    def __init__(self, cfg: CorpusConfig):
        self.cfg = cfg
        self.listing = list_files(cfg.local_paths)
        self.files = list(self.listing)
        self.sizes = [int(info["size"]) for info in self.listing.values()]
        if cfg.split_by == "document":
            plain = [uri for uri in self.files if not uri.removesuffix(".gz").endswith((".jsonl", ".parquet"))]
            if plain:
                raise ConfigError(
                    f"corpus.split_by=document reads a document id from corpus.document_column, which {plain[0]} "
                    "(plain text) has none: use .jsonl or .parquet files, or split_by=file (a file is a document)."
                )

    def fingerprint(self) -> str:
        entries = [f"{os.path.basename(uri)}={self._file_hash(uri)}" for uri in self.files]
        if len(entries) > MANY_FILES:
            return f"files:{len(entries)}:" + hashlib.sha256(",".join(entries).encode()).hexdigest()[:32]
        return "files:" + ",".join(entries)

    def _file_hash(self, uri: str) -> str:
        """Local: the content's sha256. Remote: size and version from the listing, without a download;
        a store whose listing has neither checksum nor version is read and hashed."""
        if storage.is_local(uri):
            return storage.sha256(uri)[:16]
        info = self.listing[uri]
        keys = next(([k] for k in CHECKSUM_KEYS if info.get(k)), [k for k in VERSION_KEYS if info.get(k)])
        if not keys:
            log.info("%s: its listing has no checksum or version, so its content is hashed", uri)
            return storage.sha256(uri)[:16]
        version = json.dumps([info["size"], *(str(info[k]) for k in keys)])
        return hashlib.sha256(version.encode()).hexdigest()[:16]

    def size_bytes(self) -> int:
        return sum(self.sizes)

    def partition_units(self) -> int:
        """A .gz file one each; parquet one per row group (its footer is read); text one per TEXT_UNIT_BYTES."""
        units = 0
        for uri, size in zip(self.files, self.sizes, strict=True):
            if uri.endswith(".parquet"):
                with _open(uri, ranged=True) as f:
                    units += _parquet(f).metadata.num_row_groups
            elif uri.endswith(".gz"):
                units += 1
            else:
                units += math.ceil(size / TEXT_UNIT_BYTES)
        return max(units, 1)

    def _all_rows(self, part: int = 0, num_parts: int = 1) -> Iterator[tuple[str, str]]:
        """(split key, text) of partition `part`'s rows, file by file in listing order."""
        for index, start, end in owned_ranges(self.sizes, part, num_parts):
            uri = self.files[index]
            if uri.endswith(".parquet"):
                with _open(uri, ranged=True) as f:
                    yield from self._keyed(uri, self._parquet_rows(uri, _parquet(f), start, end))
            elif uri.endswith(".gz"):
                if start == 0:  # the partition that owns its first byte reads it whole
                    with _open(uri, ranged=False) as raw, gzip.open(raw) as f:
                        yield from self._keyed(uri, self._parse(uri, ((None, line) for line in f), known_lines=True))
            else:
                with _open(uri, ranged=True) as f:
                    rows = self._parse(uri, lines_starting_in(f, start, end), known_lines=start == 0)
                    yield from self._keyed(uri, rows)

    def _keyed(self, uri: str, rows: Iterator[tuple[str | None, str]]) -> Iterator[tuple[str, str]]:
        """(what the split hashes, text): the row itself, its file's name, or its document id."""
        by = self.cfg.split_by
        name = uri.rsplit("/", 1)[-1]
        for doc, text in rows:
            text = (text or "").strip()
            if text:
                yield (text if by == "row" else name if by == "file" else f"{name}\x00{doc}"), text

    def _parse(self, uri: str, lines, known_lines: bool) -> Iterator[tuple[str | None, str]]:
        """(document id, text) of `lines` ((byte offset or None, raw line)): the text of a .txt line, the
        text column of a .jsonl object (and its document_column)."""
        jsonl = uri.removesuffix(".gz").endswith(".jsonl")
        doc_column = self.cfg.document_column
        for lineno, (offset, raw) in enumerate(lines, 1):
            where = f"{uri} line {lineno}" if known_lines else f"{uri} line at byte {offset}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ConfigError(
                    f"{where} is not valid UTF-8 ({err.reason} at byte {err.start}): re-encode the file as UTF-8."
                ) from None
            if not jsonl:
                yield None, line
            elif line.strip():
                try:
                    record = json.loads(line)
                    yield (str(record.get(doc_column)) if doc_column else None), record.get(self.cfg.text_column, "")
                except (json.JSONDecodeError, AttributeError):
                    raise ConfigError(
                        f"{where} is not a JSON object: fix the line or use .txt for plain text."
                    ) from None

    def _parquet_rows(self, uri: str, pf, start: int, end: int) -> Iterator[tuple[str | None, str]]:
        """(document id, text) of the row groups that start in [start, end): the footer and their text (and
        document) column chunks are all it reads."""
        columns = [self.cfg.text_column] + ([self.cfg.document_column] if self.cfg.document_column else [])
        for column in columns:
            if column not in pf.schema_arrow.names:
                raise ConfigError(
                    f"{uri} has no column {column!r} (has {pf.schema_arrow.names}): set "
                    f"corpus.{'text_column' if column == self.cfg.text_column else 'document_column'} to the "
                    "column that holds it."
                )
        meta = pf.metadata
        owned = [g for g in range(meta.num_row_groups) if start <= _row_group_start(meta.row_group(g)) < end]
        if owned:
            for batch in pf.iter_batches(row_groups=owned, columns=columns):
                texts = batch.column(0).to_pylist()
                docs = batch.column(1).to_pylist() if len(columns) > 1 else [None] * len(texts)
                yield from zip((None if d is None else str(d) for d in docs), texts, strict=True)

    def split_rows(self, part: int = 0, num_parts: int = 1) -> Iterator[tuple[str, str]]:
        for key, row in self._all_rows(part, num_parts):
            yield split_of(key, self.cfg.validation_fraction, self.cfg.test_fraction), row


def _parquet(f: BinaryIO):
    import pyarrow.parquet as pq

    return pq.ParquetFile(f)


def _row_group_start(group) -> int:
    """The file offset of a row group's first byte: its first column chunk's first page."""
    starts = []
    for c in range(group.num_columns):
        column = group.column(c)
        has_dictionary = column.has_dictionary_page and column.dictionary_page_offset is not None
        starts.append(column.dictionary_page_offset if has_dictionary else column.data_page_offset)
    return min(starts)


def owned_ranges(sizes: list[int], part: int, num_parts: int) -> list[tuple[int, int, int]]:
    """(file index, start, end) of each file partition `part` of `num_parts` owns bytes of, in order."""
    total = sum(sizes)
    lo, hi = part * total // num_parts, (part + 1) * total // num_parts
    owned, offset = [], 0
    for index, size in enumerate(sizes):
        start, end = max(lo - offset, 0), min(hi - offset, size)
        if start < end:
            owned.append((index, start, end))
        offset += size
    return owned


def _chunks(f: BinaryIO, pos: int, end: int) -> Iterator[bytes]:
    """The bytes of `f` from `pos` (where it stands): up to `end` in reads of READ_BYTES, then in
    growing reads until the caller stops asking or the file ends."""
    while pos < end:
        chunk = f.read(min(READ_BYTES, end - pos))
        if not chunk:
            return
        pos += len(chunk)
        yield chunk
    size = FIRST_TAIL_READ
    while chunk := f.read(size):
        yield chunk
        size = min(2 * size, READ_BYTES)


def lines_starting_in(f: BinaryIO, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(offset, line with its newline) of every line of the binary file `f` whose first byte lies in
    [start, end). Reads from start - 1, to learn whether a line starts at `start` (the line holding
    byte start - 1 is the previous range's), to the newline of the last line that starts before `end`."""
    if start >= end:
        return
    base = max(start - 1, 0)  # the file offset of buf[0]
    f.seek(base)
    buf, i = b"", 0  # i: where the next line starts in buf, once known
    skipping = start > 0
    for chunk in _chunks(f, base, end):
        buf = buf[i:] + chunk
        base += i
        i = 0
        if skipping:
            newline = buf.find(b"\n")
            if newline < 0:
                base, buf = base + len(buf), b""
                continue
            i, skipping = newline + 1, False
        while base + i < end:
            newline = buf.find(b"\n", i)
            if newline < 0:
                break
            yield base + i, buf[i : newline + 1]
            i = newline + 1
        if base + i >= end:
            return
    if not skipping and i < len(buf) and base + i < end:  # the file's last line, without a newline
        yield base + i, buf[i:]
