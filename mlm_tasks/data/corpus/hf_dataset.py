"""A `datasets` dataset as rows (production: Salesforce/wikitext, wikitext-103-raw-v1).

    corpus = HFDatasetCorpus(cfg)    # corpus.source: hf_dataset, corpus.hf_path / hf_name / hf_revision

The dataset's own splits are used; its fingerprint is the resolved commit, so a changed dataset changes
the data fingerprint. Partitions are `datasets`' contiguous `shard()`s.
"""

from __future__ import annotations

from collections.abc import Iterator

from mlm_tasks.config import CorpusConfig
from mlm_tasks.data.corpus.base import Corpus
from mlm_tasks.errors import ConfigError


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

    def rows_partition(self, split: str, part: int, num_parts: int) -> Iterator[str]:
        import datasets

        available = datasets.get_dataset_split_names(self.cfg.hf_path, self.cfg.hf_name, revision=self.cfg.hf_revision)
        if split not in available:
            raise ConfigError(f"{self.cfg.hf_path} has no {split!r} split (has {available}).")
        ds = datasets.load_dataset(self.cfg.hf_path, self.cfg.hf_name, split=split, revision=self.cfg.hf_revision)
        if num_parts > 1:
            ds = ds.shard(num_shards=num_parts, index=part, contiguous=True)
        for text in ds[self.cfg.text_column]:
            # WikiText: half the rows are empty, the rest end in a newline.
            text = (text or "").strip()
            if text:
                yield text
