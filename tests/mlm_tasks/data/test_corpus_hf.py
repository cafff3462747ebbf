"""corpus.source=hf_dataset: streamed partitions of a local `datasets` folder (no Hub here), the fallback."""

import logging

import pytest

from mlm_tasks.config import CorpusConfig
from mlm_tasks.data.corpus import open_corpus
from mlm_tasks.data.corpus.hf_dataset import stream_part

ROWS = [f"row {i}" for i in range(100)]


@pytest.fixture
def dataset_folder(tmp_path):
    """A `datasets` folder as the Hub serves one: two train parquet files (row groups of 20), one validation."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    data.mkdir()
    for name, rows in (("train-00000-of-00002", ROWS[:60]), ("train-00001-of-00002", ROWS[60:90])):
        pq.write_table(pa.table({"text": rows, "n": range(len(rows))}), data / f"{name}.parquet", row_group_size=20)
    pq.write_table(pa.table({"text": ["", *ROWS[90:]], "n": range(11)}), data / "validation-00000-of-00001.parquet")
    return CorpusConfig(source="hf_dataset", hf_path=str(tmp_path), hf_name=None)


@pytest.mark.parametrize("num_parts", [1, 2, 3, 5, 7, 11])
def test_streamed_partitions_hold_every_row_once(dataset_folder, num_parts):
    """Up to the files (2): whole files; up to the row groups (5): whole row groups, in order; beyond:
    the partitions sharing a row group deal its rows."""
    parts = [list(open_corpus(dataset_folder).rows_partition("train", p, num_parts)) for p in range(num_parts)]
    rows = [r for part in parts for r in part]
    assert sorted(rows) == sorted(ROWS[:90])
    if num_parts <= 5:
        assert rows == ROWS[:90]
    assert all(parts)
    assert list(open_corpus(dataset_folder).rows("validation")) == ROWS[90:]  # its own split; blank rows dropped


def test_stream_part_of_a_stream_with_fewer_files_than_partitions():
    """An IterableDataset of 3 generator shards that cannot be cut further: 7 partitions deal the rows."""
    import datasets

    def rows(shard):  # `datasets` hands each generator shard a list: its share of gen_kwargs["shard"]
        for name in shard:
            for i in range(10):
                yield {"text": f"{name}-{i}"}

    ds = datasets.IterableDataset.from_generator(rows, gen_kwargs={"shard": ["a", "b", "c"]})
    assert ds.num_shards == 3
    parts = [list(stream_part(ds, "text", p, 7)) for p in range(7)]
    assert sorted(r for part in parts for r in part) == sorted(f"{s}-{i}" for s in "abc" for i in range(10))
    assert parts[0] == ["a-0", "a-3", "a-6", "a-9"] and parts[3] == ["a-1", "a-4", "a-7"]
    assert [list(stream_part(ds, "text", p, 3)) for p in range(3)] == [[f"{s}-{i}" for i in range(10)] for s in "abc"]


def test_a_dataset_that_cannot_stream_is_loaded_whole(dataset_folder, monkeypatch, caplog):
    import datasets

    load = datasets.load_dataset

    def no_streaming(*args, streaming=False, **kwargs):
        if streaming:
            raise NotImplementedError("this builder cannot stream")
        return load(*args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", no_streaming)
    with caplog.at_level(logging.INFO, logger="mlm_tasks.data.corpus.hf_dataset"):
        parts = [list(open_corpus(dataset_folder).rows_partition("train", p, 4)) for p in range(4)]
    assert [r for part in parts for r in part] == ROWS[:90]
    assert "cannot be streamed (this builder cannot stream): each partition loads it whole" in caplog.text


def test_size_and_units_of_a_local_folder(dataset_folder):
    corpus = open_corpus(dataset_folder)
    assert corpus.partition_units() == 2  # the train files
    assert corpus.size_bytes() is None  # a folder's metadata states no size: plan_shards uses shards.partitions
