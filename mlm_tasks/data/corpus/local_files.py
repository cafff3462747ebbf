"""Local text files as rows: .txt (a row per line), .jsonl (`corpus.text_column` of each object), .parquet.

    corpus = LocalFilesCorpus(cfg)    # corpus.source: local_files, corpus.local_paths: files or globs

Rows are split by a hash of the row. Partitions are blocks of PARTITION_BLOCK consecutive lines, dealt
round-robin, so every partition count gives the same rows per split.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator

from mlm_tasks import storage
from mlm_tasks.config import CorpusConfig
from mlm_tasks.data.corpus.base import Corpus, split_of
from mlm_tasks.errors import ConfigError

PARTITION_BLOCK = 1000  # consecutive lines of local files that go to the same partition


class LocalFilesCorpus(Corpus):
    def __init__(self, cfg: CorpusConfig):
        self.cfg = cfg
        self.files: list[str] = []
        for pattern in cfg.local_paths:
            matched = sorted(glob.glob(pattern))
            if not matched:
                raise ConfigError(
                    f"corpus.local_paths entry {pattern!r} matches no file: check the path "
                    "(relative paths are relative to the worker's working directory)."
                )
            self.files.extend(matched)
        if not self.files:
            raise ConfigError("corpus.source=local_files needs corpus.local_paths (files or globs).")
        for path in self.files:
            if not path.endswith((".txt", ".jsonl", ".parquet")):
                raise ConfigError(f"{path}: unsupported file type; use .txt, .jsonl or .parquet.")

    def fingerprint(self) -> str:
        return "files:" + ",".join(f"{os.path.basename(p)}={storage.sha256(p)[:16]}" for p in self.files)

    def _lines(self, path: str, keep) -> Iterator[tuple[int, str]]:
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                if not keep():
                    continue
                try:
                    yield lineno, raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise ConfigError(
                        f"{path} line {lineno} is not valid UTF-8 ({err.reason} at byte "
                        f"{err.start}): re-encode the file as UTF-8."
                    ) from None

    def _all_rows(self, part: int = 0, num_parts: int = 1) -> Iterator[str]:
        """Rows of partition `part`: blocks of PARTITION_BLOCK consecutive lines/records of the files
        (blank ones included, so the split is the same for every num_parts), block b to partition
        b % num_parts. Other partitions' lines are skipped undecoded."""
        index = -1

        def keep() -> bool:
            nonlocal index
            index += 1
            return (index // PARTITION_BLOCK) % num_parts == part

        for path in self.files:
            if path.endswith(".txt"):
                for _, line in self._lines(path, keep):
                    yield line
            elif path.endswith(".jsonl"):
                for lineno, line in self._lines(path, keep):
                    if line.strip():
                        try:
                            yield json.loads(line).get(self.cfg.text_column, "")
                        except (json.JSONDecodeError, AttributeError):
                            raise ConfigError(
                                f"{path} line {lineno} is not a JSON object: fix the line or use .txt for plain text."
                            ) from None
            else:
                import pyarrow.parquet as pq

                for batch in pq.ParquetFile(path).iter_batches(columns=[self.cfg.text_column]):
                    texts = batch.column(0).to_pylist()
                    if num_parts == 1:  # every row is this partition's: no per-row bookkeeping
                        yield from texts
                        continue
                    for text in texts:
                        if keep():
                            yield text

    def rows_partition(self, split: str, part: int, num_parts: int) -> Iterator[str]:
        for row_split, row in self.split_rows(part, num_parts):
            if row_split == split:
                yield row

    def split_rows(self, part: int = 0, num_parts: int = 1) -> Iterator[tuple[str, str]]:
        for row in self._all_rows(part, num_parts):
            row = (row or "").strip()
            if row:
                yield split_of(row, self.cfg.validation_fraction, self.cfg.test_fraction), row
