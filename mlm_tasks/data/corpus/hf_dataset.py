"""A `datasets` dataset as rows, by its own splits (corpus.source: hf_dataset, corpus.hf_path / hf_name / hf_revision).

Its fingerprint is the resolved commit. It is streamed, so a partition reads only its own files (`stream_part`);
a dataset that cannot be streamed is loaded whole and cut with `Dataset.shard()`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from mlm_tasks.config import CorpusConfig
from mlm_tasks.data.corpus.base import Corpus
from mlm_tasks.errors import ConfigError

log = logging.getLogger(__name__)
BATCH_ROWS = 1000


class HFDatasetCorpus(Corpus):
    """Any `datasets` dataset. Uses its own validation/test splits when it has them."""

    def __init__(self, cfg: CorpusConfig):
        self.cfg = cfg
        self.credit = f"Dataset {cfg.hf_path} ({cfg.hf_name}); see its dataset card for license and credit."

    def fingerprint(self) -> str:
        from huggingface_hub import HfApi

        revision = self.cfg.hf_revision
        if revision is None:  # resolve "main" to a commit so a changed dataset changes the fingerprint
            revision = HfApi().dataset_info(self.cfg.hf_path).sha
        return f"hf:{self.cfg.hf_path}:{self.cfg.hf_name}:{revision}"

    def _builder(self):
        import datasets

        return datasets.load_dataset_builder(self.cfg.hf_path, self.cfg.hf_name, revision=self.cfg.hf_revision)

    def size_bytes(self) -> int | None:
        """The dataset's size as its card or metadata states it (None when it states none)."""
        info = self._builder().info
        return info.dataset_size or info.download_size or None

    def partition_units(self) -> int | None:
        """Data files of the largest split (None for a dataset loaded by a script: no file list)."""
        data_files = self._builder().config.data_files
        return max((len(files) for files in data_files.values()), default=None) if data_files else None

    def rows_partition(self, split: str, part: int, num_parts: int) -> Iterator[str]:
        import datasets

        cfg = self.cfg
        available = datasets.get_dataset_split_names(cfg.hf_path, cfg.hf_name, revision=cfg.hf_revision)
        if split not in available:
            raise ConfigError(f"{cfg.hf_path} has no {split!r} split (has {available}).")
        try:
            streamed = datasets.load_dataset(
                cfg.hf_path, cfg.hf_name, split=split, revision=cfg.hf_revision, streaming=True
            )
        except NotImplementedError as err:  # what `datasets` raises for a builder that cannot stream
            log.info("%s cannot be streamed (%s): each partition loads it whole, keeps its shard()", cfg.hf_path, err)
            loaded = datasets.load_dataset(cfg.hf_path, cfg.hf_name, split=split, revision=cfg.hf_revision)
            texts = loaded.shard(num_shards=num_parts, index=part, contiguous=True)[cfg.text_column]
        else:
            texts = stream_part(streamed.select_columns([cfg.text_column]), cfg.text_column, part, num_parts)
        for text in texts:
            # WikiText: half the rows are empty, the rest end in a newline.
            text = (text or "").strip()
            if text:
                yield text


def stream_part(ds, column: str, part: int, num_parts: int) -> Iterator[str]:
    """`column` of partition `part` of the IterableDataset `ds`, which `shard()` cuts by its files: contiguous
    runs of files; more partitions than files: by row groups (`reshard`), and if still too few, the partitions
    sharing a file each read it and keep their round-robin turn of its rows."""
    if num_parts > ds.num_shards:
        ds = ds.reshard()
    files = ds.num_shards
    if num_parts <= files:
        shard, turn, sharing = ds.shard(num_shards=num_parts, index=part, contiguous=True), 0, 1
    else:
        index = part % files
        shard = ds.shard(num_shards=files, index=index)
        turn, sharing = part // files, len(range(index, num_parts, files))
    row = 0
    for batch in shard.iter(batch_size=BATCH_ROWS):
        for text in batch[column]:
            if row % sharing == turn:
                yield text
            row += 1
