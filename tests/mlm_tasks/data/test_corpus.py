"""Corpus sources: embedded Wikipedia, local files; deterministic splits; fingerprints; bad input."""

import json

import pytest

from mlm_tasks.config import CorpusConfig
from mlm_tasks.data.corpus import open_corpus
from mlm_tasks.data.corpus.base import split_of
from mlm_tasks.data.corpus.wiki import wikitext_rows
from mlm_tasks.errors import ConfigError


def test_wikitext_rows_format_headings_and_drop_markup():
    rows = wikitext_rows("'''Anarchism''' is a philosophy.\n\n==History==\nOld ''ideas''.\n\n")
    assert rows == ["Anarchism is a philosophy.", "= = History = =", "Old ideas."]


def test_embedded_wiki_is_real_text_split_by_article():
    corpus = open_corpus(CorpusConfig(max_articles=10, validation_fraction=0.2, test_fraction=0.1))
    splits = {s: list(corpus.rows(s)) for s in ("train", "validation", "test")}
    assert sum(corpus.articles_seen.values()) == 10
    assert all(r.strip() == r and r for rows in splits.values() for r in rows)
    assert any(" the " in r for r in splits["train"])
    # Articles never straddle splits: a title row appears in exactly one split.
    titles = [r for rows in splits.values() for r in rows if r.startswith("= ") and not r.startswith("= =")]
    assert len(titles) == len(set(titles)) == 10


def test_split_is_deterministic_and_roughly_proportional():
    keys = [f"article {i}" for i in range(2000)]
    first = [split_of(k, 0.1, 0.1) for k in keys]
    assert first == [split_of(k, 0.1, 0.1) for k in keys]
    assert 120 < first.count("validation") < 280


def test_local_files_txt_jsonl_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.txt").write_text("first line\n\nsecond line\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "json row"}) + "\n")
    pq.write_table(pa.table({"text": ["parquet row"]}), tmp_path / "c.parquet")
    cfg = CorpusConfig(source="local_files", local_paths=[str(tmp_path / "*")], validation_fraction=0, test_fraction=0)
    rows = list(open_corpus(cfg).rows("train"))
    assert rows == ["first line", "second line", "json row", "parquet row"]


def test_fingerprint_follows_content(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("one\n")
    cfg = CorpusConfig(source="local_files", local_paths=[str(f)])
    before = open_corpus(cfg).fingerprint()
    assert open_corpus(cfg).fingerprint() == before
    f.write_text("two\n")
    assert open_corpus(cfg).fingerprint() != before


def test_missing_local_path_says_which(tmp_path):
    with pytest.raises(ConfigError, match="matches no file"):
        open_corpus(CorpusConfig(source="local_files", local_paths=[str(tmp_path / "missing.txt")]))


def test_undecodable_bytes_name_file_and_line(tmp_path):
    f = tmp_path / "bad.txt"
    f.write_bytes(b"fine\n\xff\xfe broken\n")
    corpus = open_corpus(
        CorpusConfig(source="local_files", local_paths=[str(f)], validation_fraction=0, test_fraction=0)
    )
    with pytest.raises(ConfigError, match="bad.txt line 2 is not valid UTF-8"):
        list(corpus.rows("train"))


def test_missing_dump_path():
    with pytest.raises(ConfigError, match="dump_path"):
        open_corpus(CorpusConfig(source="wiki_dump"))


SPLITS = ("train", "validation", "test")


def _partitioned(cfg: CorpusConfig, num_parts: int) -> dict:
    """{split: [rows of partition 0, rows of partition 1, ...]}, each partition from a fresh corpus object."""
    return {s: [list(open_corpus(cfg).rows_partition(s, p, num_parts)) for p in range(num_parts)] for s in SPLITS}


@pytest.fixture
def small_dump(tmp_path):
    """The first 20 articles of the embedded dump (redirect pages left out), as a dump of its own."""
    import bz2

    from mlm_tasks.data.corpus.wiki import embedded_wiki_path

    with bz2.open(embedded_wiki_path(), "rt", encoding="utf-8") as f:
        xml = f.read()
    head, pages = xml[: xml.index("<page>")], []
    for page in xml.split("<page>")[1:]:
        if "#REDIRECT" not in page:
            pages.append("<page>" + page[: page.index("</page>") + len("</page>")])
        if len(pages) == 20:
            break
    path = tmp_path / "small.xml.bz2"
    path.write_bytes(bz2.compress((head + "\n".join(pages) + "\n</mediawiki>\n").encode("utf-8")))
    return str(path)


@pytest.mark.slow  # every partition of the dump, read twice: ~20 s a case: in make test, not in make test-fast
@pytest.mark.parametrize("max_articles", [None, 9])
def test_wiki_partitions_are_disjoint_and_cover_every_article(small_dump, max_articles):
    cfg = CorpusConfig(
        source="wiki_dump", dump_path=small_dump, max_articles=max_articles, validation_fraction=0.2, test_fraction=0.2
    )
    whole = open_corpus(cfg)
    single = {s: list(whole.rows(s)) for s in SPLITS}
    parts = _partitioned(cfg, 3)
    for s in SPLITS:
        assert sorted(r for p in parts[s] for r in p) == sorted(single[s]), s
    titles = [
        [r for s in SPLITS for r in parts[s][p] if r.startswith("= ") and not r.startswith("= =")] for p in range(3)
    ]
    assert all(titles), titles  # every partition got articles
    assert not set(titles[0]) & set(titles[1]) and not set(titles[1]) & set(titles[2])
    # Articles per partition add up to the single reader's count (the merged manifest sums them).
    counted = 0
    for p in range(3):
        corpus = open_corpus(cfg)
        for s in SPLITS:
            list(corpus.rows_partition(s, p, 3))
        counted += sum(corpus.articles_seen.values())
    assert counted == sum(whole.articles_seen.values()) == (max_articles or counted)
