"""Unigram tokenizer: RoBERTa specials, clean <mask> handling, first-writer-wins publishing."""

import pytest

from mlm_tasks.config import CorpusConfig, TokenizerConfig
from mlm_tasks.data.corpus import open_corpus
from mlm_tasks.data.tokenizer import load_tokenizer, save_tokenizer, train_unigram
from mlm_tasks.errors import ConfigError, MissingArtifactError

ROWS = None


def rows():
    global ROWS
    if ROWS is None:
        ROWS = list(open_corpus(CorpusConfig(max_articles=12)).rows("train"))
    return ROWS


def test_specials_and_mask_without_stray_pieces(tmp_path):
    tok = train_unigram(rows(), TokenizerConfig(vocab_size=1000))
    save_tokenizer(tok, str(tmp_path / "tok"), 64)
    pt = load_tokenizer(str(tmp_path / "tok"))
    assert [pt.convert_ids_to_tokens(i) for i in range(5)] == ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    pieces = pt.convert_ids_to_tokens(pt("The state is <mask>.")["input_ids"])
    assert pieces[0] == "<s>" and pieces[-1] == "</s>"
    # With lstrip on <mask> and prepend_scheme="first" there is no lone "▁" before or after the mask.
    i = pieces.index("<mask>")
    assert pieces[i - 1] == "▁is" and pieces[i + 1] == "."
    assert len(pt) == 1000


def test_vocab_larger_than_corpus_supports():
    with pytest.raises(ConfigError, match="larger than this corpus supports"):
        train_unigram(["tiny corpus of few words"] * 3, TokenizerConfig(vocab_size=5000))


@pytest.mark.slow  # trains tokenizers in racing processes: ~12 s: in make test, not in make test-fast
def test_publish_is_first_writer_wins(tmp_path):
    a = train_unigram(rows(), TokenizerConfig(vocab_size=1000))
    b = train_unigram(rows()[:200], TokenizerConfig(vocab_size=500))
    uri = str(tmp_path / "tok")
    assert save_tokenizer(a, uri, 64) is True
    assert save_tokenizer(b, uri, 64) is False
    assert len(load_tokenizer(uri)) == 1000


def test_missing_tokenizer_says_what_to_do(tmp_path):
    with pytest.raises(MissingArtifactError, match="run train_tokenizer first"):
        load_tokenizer(str(tmp_path / "nothing"))
