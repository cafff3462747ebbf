"""Corpus sources: embedded Wikipedia, local files; deterministic splits; fingerprints; bad input."""
import json

import pytest

from mlm_tasks.config import ConfigError, CorpusConfig
from mlm_tasks.corpus import open_corpus, split_of, wikitext_rows


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
    cfg = CorpusConfig(source="local_files", local_paths=[str(tmp_path / "*")], validation_fraction=0,
                       test_fraction=0)
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
    corpus = open_corpus(CorpusConfig(source="local_files", local_paths=[str(f)], validation_fraction=0,
                                      test_fraction=0))
    with pytest.raises(ConfigError, match="bad.txt line 2 is not valid UTF-8"):
        list(corpus.rows("train"))


def test_missing_dump_path():
    with pytest.raises(ConfigError, match="dump_path"):
        open_corpus(CorpusConfig(source="wiki_dump"))
