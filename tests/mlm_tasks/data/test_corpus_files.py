"""corpus.source=local_files: local and gs:// files, partitions by byte range, what a partition reads."""

import gzip
import io
import json
import random
import re

import pytest

from mlm_tasks import storage
from mlm_tasks.config import CorpusConfig
from mlm_tasks.data.corpus import local_files, open_corpus
from mlm_tasks.data.corpus.base import split_of
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import SPLITS

COUNTS = (1, 2, 3, 5, 8, 13)


def _corpus_files(folder) -> dict[str, bytes]:
    """One file of each type, by name; text lines of many lengths (some blank, one long)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(7)
    lines = [" ".join(f"w{rng.randrange(500)}" for _ in range(rng.randrange(0, 12))) for _ in range(400)]
    lines[50] = "long " * 2000
    files = {
        "a.txt": "".join(f"{line}\n" for line in lines).encode(),
        "b.jsonl": "".join(json.dumps({"text": f"json row {i}", "n": i}) + "\n" for i in range(120)).encode(),
        "c.txt.gz": gzip.compress("".join(f"gz line {i}\n" for i in range(50)).encode(), mtime=0),
        "d.jsonl.gz": gzip.compress("".join(json.dumps({"text": f"gz json {i}"}) + "\n" for i in range(30)).encode()),
        "e.txt": b"last line without newline",
    }
    sink = io.BytesIO()
    pq.write_table(pa.table({"text": [f"parquet row {i}" for i in range(200)]}), sink, row_group_size=30)
    files["c.parquet"] = sink.getvalue()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def _cfg(*patterns: str, **kw) -> CorpusConfig:
    return CorpusConfig(
        source="local_files", local_paths=list(patterns), validation_fraction=0.2, test_fraction=0.1, **kw
    )


def _parts(cfg: CorpusConfig, num_parts: int) -> list[list[tuple[str, str]]]:
    """(split, row) of each partition, each from a fresh corpus object (as a mapped task has)."""
    return [list(open_corpus(cfg).split_rows(p, num_parts)) for p in range(num_parts)]


def test_byte_ranges_give_every_line_to_one_partition(monkeypatch):
    rng = random.Random(1)
    for _ in range(200):
        monkeypatch.setattr(local_files, "READ_BYTES", rng.choice([1, 3, 64, 1 << 20]))
        monkeypatch.setattr(local_files, "FIRST_TAIL_READ", rng.choice([1, 2, 1024]))
        files = [
            b"".join(rng.choice([b"\n", b"a\n", b"bb", b"ccc\n", b"d" * 30 + b"\n"]) for _ in range(rng.randrange(12)))
            for _ in range(rng.randrange(1, 4))
        ]
        for n in range(1, 10):
            got = [[] for _ in files]
            for p in range(n):
                for index, start, end in local_files.owned_ranges([len(f) for f in files], p, n):
                    got[index] += local_files.lines_starting_in(io.BytesIO(files[index]), start, end)
            for data, lines in zip(files, got, strict=True):
                assert [line for _, line in lines] == data.splitlines(keepends=True)
                assert all(data[offset : offset + len(line)] == line for offset, line in lines)


def test_every_type_reads_the_same_rows_in_any_partition_count(tmp_path):
    _corpus_files(tmp_path)
    cfg = _cfg(str(tmp_path / "*"))
    whole = list(open_corpus(cfg).split_rows())
    rows = [row for _, row in whole]
    assert rows[0] == next(line for line in (tmp_path / "a.txt").read_text().splitlines() if line.strip())
    assert "json row 119" in rows and "gz line 49" in rows and "gz json 29" in rows
    assert "parquet row 199" in rows and rows[-1] == "last line without newline"
    assert all(split == split_of(row, 0.2, 0.1) for split, row in whole)  # the split of a row is its hash's
    for n in COUNTS:
        parts = _parts(cfg, n)
        # Partitions in order are the one reader's stream: every row once, in the same order.
        assert [r for part in parts for r in part] == whole, n
    assert sum(1 for part in _parts(cfg, 8) if part) >= 5  # the work is spread, not all in one partition


class _Counting:
    """A file whose reads are counted in `read[uri]`."""

    def __init__(self, f, uri, read):
        self.f, self.uri, self.read_bytes = f, uri, read

    def read(self, n=-1):
        data = self.f.read(n)
        self.read_bytes[self.uri] = self.read_bytes.get(self.uri, 0) + len(data)
        return data

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def test_a_partition_reads_its_own_bytes_only(tmp_path, monkeypatch):
    """Text files: the owned range, one byte before it, and the rest of its last line; files of which a
    partition owns no byte (a .gz it does not start in, a parquet file) are never opened."""
    files = _corpus_files(tmp_path)
    (tmp_path / "big.txt").write_bytes(b"".join(b"%06d some words of a row\n" % i for i in range(40_000)))
    cfg = _cfg(str(tmp_path / "*"))
    sizes = {uri: len(files.get(uri.rsplit("/", 1)[-1], b"")) for uri in open_corpus(cfg).files}
    opened = local_files._open
    for n in (1, 3, 7):
        total_read = 0
        for part in range(n):
            read: dict[str, int] = {}
            monkeypatch.setattr(
                local_files, "_open", lambda uri, ranged, read=read: _Counting(opened(uri, ranged), uri, read)
            )
            corpus = open_corpus(cfg)
            list(corpus.split_rows(part, n))
            owned = {corpus.files[i]: (s, e) for i, s, e in local_files.owned_ranges(corpus.sizes, part, n)}
            assert set(read) <= set(owned), (part, n)  # never another partition's file
            for uri, count in read.items():
                start, end = owned[uri]
                if uri.endswith((".txt", ".jsonl")):
                    longest = max(map(len, (tmp_path / uri.rsplit("/", 1)[-1]).read_bytes().splitlines()))
                    assert count <= (end - start) + 1 + max(longest, local_files.FIRST_TAIL_READ) * 2, (uri, part, n)
                elif uri.endswith(".gz"):
                    assert start == 0 and count == sizes[uri]
            total_read += sum(c for uri, c in read.items() if uri.endswith("big.txt"))
        big = (tmp_path / "big.txt").stat().st_size
        assert total_read <= big + n * 2 * local_files.FIRST_TAIL_READ  # not n times the file, as before


def test_parquet_partitions_read_only_their_row_groups(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [f"row {i} of a parquet file with ten row groups" for i in range(10_000)]
    table = pa.table({"text": rows, "n": list(range(10_000))})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=1000)
    cfg = _cfg(str(tmp_path / "a.parquet"))
    corpus = open_corpus(cfg)
    assert corpus.partition_units() == 10 and corpus.size_bytes() == (tmp_path / "a.parquet").stat().st_size
    parts = [[row for _, row in part] for part in _parts(cfg, 4)]
    assert [r for part in parts for r in part] == rows
    assert all(len(part) % 1000 == 0 and part for part in parts)  # whole row groups, none empty


def test_undecodable_bytes_name_the_byte_when_the_line_number_is_unknown(tmp_path):
    f = tmp_path / "bad.txt"
    f.write_bytes(b"fine\n" * 100 + b"\xff broken\n")
    cfg = _cfg(str(f))
    with pytest.raises(ConfigError, match=r"bad.txt line 101 is not valid UTF-8"):
        list(open_corpus(cfg).split_rows(0, 1))
    with pytest.raises(ConfigError, match=r"bad.txt line at byte 500 is not valid UTF-8"):
        list(open_corpus(cfg).split_rows(1, 2))


def test_a_parquet_file_without_the_text_column_says_which_to_set(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "a.parquet")
    with pytest.raises(ConfigError, match=r"has no column 'text' \(has \['body'\]\): set corpus.text_column"):
        list(open_corpus(_cfg(str(tmp_path / "a.parquet"))).split_rows())


@pytest.fixture
def remote(gcs_root, tmp_path):
    """The corpus files, locally under tmp_path/local and as objects under gcs_root."""
    local = tmp_path / "local"
    local.mkdir()
    files = _corpus_files(local)
    for name, data in files.items():
        storage.write_bytes(f"{gcs_root}/corpus/{name}", data)
    return gcs_root, local, files


def test_gs_patterns_read_the_same_rows_and_splits_as_local_copies(remote):
    root, local, _ = remote
    gs_cfg = _cfg(f"{root}/corpus/*.txt", f"{root}/corpus/*.jsonl*", f"{root}/corpus/c.parquet")
    local_cfg = _cfg(str(local / "*.txt"), str(local / "*.jsonl*"), str(local / "c.parquet"))
    corpus = open_corpus(gs_cfg)
    assert corpus.files[0] == f"{root}/corpus/a.txt"
    assert corpus.size_bytes() == open_corpus(local_cfg).size_bytes()
    whole = list(corpus.split_rows())
    assert whole == list(open_corpus(local_cfg).split_rows()) and len(whole) > 700
    assert {split for split, _ in whole} == set(SPLITS)
    for n in (2, 5):
        assert [r for part in _parts(gs_cfg, n) for r in part] == whole, n


def test_gs_fingerprint_comes_from_the_listing_and_follows_the_objects(remote, monkeypatch):
    root, _, files = remote
    cfg = _cfg(f"{root}/corpus/*")
    first = open_corpus(cfg).fingerprint()

    def no_download(*args, **kwargs):
        raise AssertionError("the fingerprint of gs:// objects must not read them")

    with monkeypatch.context() as m:
        m.setattr(local_files, "_open", no_download)
        m.setattr(storage, "sha256", no_download)
        assert open_corpus(cfg).fingerprint() == first
    storage.write_bytes(f"{root}/corpus/a.txt", files["a.txt"] + b"one more line\n")
    changed = open_corpus(cfg).fingerprint()
    assert changed != first
    storage.write_bytes(f"{root}/corpus/a.txt", files["a.txt"][:-1] + b"X")  # same size, other bytes
    assert open_corpus(cfg).fingerprint() not in (first, changed)


def test_a_gs_pattern_that_matches_nothing_is_named(gcs_root):
    pattern = f"{gcs_root}/nothing/*.txt"
    with pytest.raises(ConfigError, match=re.escape(f"corpus.local_paths entry '{pattern}' matches no file")):
        open_corpus(_cfg(pattern))


def _split_of_every_row(cfg: CorpusConfig, num_parts: int = 3) -> dict[str, set[str]]:
    corpus = open_corpus(cfg)
    found: dict[str, set[str]] = {}
    for part in range(num_parts):
        for split, row in corpus.split_rows(part, num_parts):
            found.setdefault(row, set()).add(split)
    return found


def test_split_by_document_keeps_a_documents_rows_in_one_split(tmp_path):
    """40 documents of 10 paragraphs each, in .jsonl and .parquet: by row they scatter over the splits, by
    document each document's rows share one split, and the documents still spread over all three."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(1)
    records = [
        {"doc": f"d{d}", "text": f"paragraph {i} of document {d} {rng.random()}"} for d in range(40) for i in range(10)
    ]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:200]))
    pq.write_table(pa.Table.from_pylist(records[200:]), tmp_path / "b.parquet", row_group_size=37)
    paths = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.parquet")]
    common = {"source": "local_files", "local_paths": paths, "validation_fraction": 0.3, "test_fraction": 0.3}

    def doc_splits(found):
        by_doc: dict[str, set[str]] = {}
        for r in records:
            by_doc.setdefault(r["doc"], set()).update(found[r["text"]])
        return by_doc

    by_row = doc_splits(_split_of_every_row(CorpusConfig(**common)))
    assert sum(len(s) > 1 for s in by_row.values()) > 20  # rows of a document land in several splits
    by_doc = doc_splits(_split_of_every_row(CorpusConfig(**common, split_by="document", document_column="doc")))
    assert all(len(s) == 1 for s in by_doc.values())
    assert set().union(*by_doc.values()) == set(SPLITS)


def test_split_by_file_keeps_a_files_rows_in_one_split(tmp_path):
    for f in range(12):
        (tmp_path / f"f{f}.txt").write_text("".join(f"line {i} of file {f}\n" for i in range(20)))
    cfg = CorpusConfig(
        source="local_files", local_paths=[str(tmp_path / "*.txt")], split_by="file", validation_fraction=0.3
    )
    found = _split_of_every_row(cfg)
    for f in range(12):
        assert len(set().union(*(found[f"line {i} of file {f}"] for i in range(20)))) == 1


def test_bad_split_settings_say_what_to_set(tmp_path):
    from mlm_tasks.config import build_config

    (tmp_path / "a.txt").write_text("one row\n")
    local = {"source": "local_files", "local_paths": [str(tmp_path / "a.txt")]}
    with pytest.raises(ConfigError, match="needs corpus.document_column"):
        build_config({"corpus": {**local, "split_by": "document"}})
    with pytest.raises(ConfigError, match="is for source=local_files"):
        build_config({"corpus": {"split_by": "file"}})
    cfg = build_config({"corpus": {**local, "split_by": "document", "document_column": "doc"}})
    with pytest.raises(ConfigError, match="plain text"):
        open_corpus(cfg.corpus)


def test_another_text_column_of_the_same_files_is_other_data(tmp_path):
    from mlm_tasks.config import build_config
    from mlm_tasks.data.shard_set import data_fingerprint

    (tmp_path / "a.jsonl").write_text('{"title": "A title", "body": "A body of text"}\n')
    local = {"source": "local_files", "local_paths": [str(tmp_path / "a.jsonl")]}
    title, body = (build_config({"corpus": {**local, "text_column": c}}) for c in ("title", "body"))
    assert data_fingerprint(title) != data_fingerprint(body)
