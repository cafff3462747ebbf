"""plan_shards' partition count: shards.partitions for a small or unsized corpus, more for a large one."""

import pytest

from mlm_tasks.config import CorpusConfig, ShardConfig
from mlm_tasks.data.corpus import open_corpus
from mlm_tasks.data.corpus.base import Corpus
from mlm_tasks.steps.plan_shards import partition_count

MiB = 1 << 20


class Sized(Corpus):
    def __init__(self, size, units=None):
        self.size, self.units, self.asked_units = size, units, False

    def size_bytes(self):
        return self.size

    def partition_units(self):
        self.asked_units = True
        return self.units


@pytest.mark.parametrize(
    ("partitions", "partition_mb", "size", "units", "expected"),
    [
        (1, 256, None, None, 1),  # unknown size (a dump): shards.partitions
        (3, 256, None, None, 3),
        (1, 256, 10 * MiB, None, 1),  # small: shards.partitions, as before
        (4, 256, 10 * MiB, 1, 4),  # the floor holds even above the units
        (1, 256, 1000 * MiB, None, 4),  # ceil(1000 / 256)
        (8, 256, 1000 * MiB, None, 8),
        (1, 1, 5000 * MiB, 3000, 1024),  # the config's limit
        (1, 1, 5000 * MiB, 7, 7),  # no more than the units (files, row groups, MiB of text)
        (2, 1, 5000 * MiB, 1, 2),
    ],
)
def test_partition_count(partitions, partition_mb, size, units, expected):
    corpus = Sized(size, units)
    assert partition_count(ShardConfig(partitions=partitions, partition_mb=partition_mb), corpus) == expected


def test_a_small_corpus_is_not_asked_for_units():
    """Units may cost reads (parquet footers): only a corpus larger than shards.partitions' worth is asked."""
    corpus = Sized(10 * MiB, 5)
    partition_count(ShardConfig(partitions=2), corpus)
    assert not corpus.asked_units


def test_the_default_corpus_is_one_partition():
    assert open_corpus(CorpusConfig()).size_bytes() is None
    assert partition_count(ShardConfig(), open_corpus(CorpusConfig())) == 1


def test_local_files_are_cut_by_size(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"a row of text\n" * (MiB // 5))  # 2.8 MiB
    (tmp_path / "b.txt.gz").write_bytes(b"\x1f\x8b" + b"\0" * (MiB - 2))  # 1 MiB, one unit (not read here)
    corpus = open_corpus(CorpusConfig(source="local_files", local_paths=[str(tmp_path / "*")]))
    assert corpus.size_bytes() == 14 * (MiB // 5) + MiB and corpus.partition_units() == 3 + 1
    assert partition_count(ShardConfig(partition_mb=1), corpus) == 4
    assert partition_count(ShardConfig(partition_mb=2), corpus) == 2
    assert partition_count(ShardConfig(partitions=6, partition_mb=1), corpus) == 6
