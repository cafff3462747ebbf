"""Unigram tokenizer: RoBERTa specials, clean <mask> handling, first-writer-wins publishing."""

import pytest

from mlm_tasks.config import CorpusConfig, TokenizerConfig
from mlm_tasks.data.corpus import open_corpus
from mlm_tasks.data.tokenizer import load_tokenizer, save_tokenizer, train_subwords
from mlm_tasks.errors import ConfigError, MissingArtifactError

ROWS = None


def rows():
    global ROWS
    if ROWS is None:
        ROWS = list(open_corpus(CorpusConfig(max_articles=12)).rows("train"))
    return ROWS


def test_specials_and_mask_without_stray_pieces(tmp_path):
    tok = train_subwords(rows(), TokenizerConfig(vocab_size=1000))
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
        train_subwords(["tiny corpus of few words"] * 3, TokenizerConfig(vocab_size=5000))


@pytest.mark.slow  # trains tokenizers in racing processes: ~12 s: in make test, not in make test-fast
def test_publish_is_first_writer_wins(tmp_path):
    a = train_subwords(rows(), TokenizerConfig(vocab_size=1000))
    b = train_subwords(rows()[:200], TokenizerConfig(vocab_size=500))
    uri = str(tmp_path / "tok")
    assert save_tokenizer(a, uri, 64) is True
    assert save_tokenizer(b, uri, 64) is False
    assert len(load_tokenizer(uri)) == 1000


def test_missing_tokenizer_says_what_to_do(tmp_path):
    with pytest.raises(MissingArtifactError, match="run train_tokenizer first"):
        load_tokenizer(str(tmp_path / "nothing"))


def _shard_set(tmp_path, name: str, **tokenizer):
    """A shard set of the tiny config's first rows, built by the real steps with these tokenizer settings."""
    from mlm_tasks.data.shard_set import ShardSet
    from mlm_tasks.paths import DataPaths
    from mlm_tasks.steps import build_shard_set
    from peers.tiny_data import tiny_config

    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        corpus.write_text("\n".join(rows()[:400]) + "\n", encoding="utf-8")
    settings = {f"tokenizer.{k}": v for k, v in tokenizer.items()}
    cfg = tiny_config(
        tmp_path / name, **{"corpus.source": "local_files", "corpus.local_paths": [str(corpus)]}, **settings
    )
    data = build_shard_set(cfg)
    return cfg, data, ShardSet.load(DataPaths(cfg.output_root, data["fingerprint"]))


@pytest.mark.parametrize("model", ["unigram", "bpe", "wordpiece"])
def test_each_trainer_builds_a_shard_set_whose_manifest_names_it(tmp_path, model):
    from transformers import RobertaConfig, TFRobertaForMaskedLM, pipeline

    from mlm_tasks.reporting.card import data_card_lines

    cfg, data, shard_set = _shard_set(tmp_path, model, model=model, vocab_size=500, reserved_tokens=3)
    tok = shard_set.data["tokenizer"]
    # 500 trained + at least 3 spares, padded to 512 = 8 x 64.
    assert tok["model"] == model and tok["from_pretrained"] is None and tok["spare_tokens"] == 12
    assert shard_set.vocab_size == 512 and tok["sha256"] == shard_set.tokenizer_sha256
    assert any(line.startswith(f"- {model.capitalize()} tokenizer trained on") for line in data_card_lines(data))
    pt = load_tokenizer(data["tokenizer_uri"])
    assert len(pt) == 512 and pt.convert_ids_to_tokens(list(range(500, 512))) == [f"<unused{i}>" for i in range(12)]
    assert pt.convert_ids_to_tokens(list(range(5))) == ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    ids = pt("The state is <mask>.")["input_ids"]
    assert ids.count(pt.mask_token_id) == 1 and pt.decode(ids, skip_special_tokens=True).startswith("The state is")
    # The fill-mask pipeline the project runs (framework="tf") works with each tokenizer.
    model_cfg = RobertaConfig(
        vocab_size=len(pt),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=66,
        pad_token_id=pt.pad_token_id,
    )
    fill = pipeline(
        "fill-mask", model=TFRobertaForMaskedLM(model_cfg), tokenizer=pt, framework="tf", dtype=None, top_k=3
    )
    assert len(fill("The state is <mask>.")) == 3
    # Another trainer is another shard set: the choice is in the fingerprint.
    assert data["fingerprint"] != _fingerprint(cfg, model="unigram" if model != "unigram" else "bpe")


def _fingerprint(cfg, **tokenizer):
    from mlm_tasks.data.shard_set import data_fingerprint

    return data_fingerprint(cfg.model_copy(update={"tokenizer": cfg.tokenizer.model_copy(update=tokenizer)}))


def test_a_tokenizer_from_a_folder_is_reused_and_named(tmp_path, caplog):
    import logging
    import shutil

    from mlm_tasks.reporting.card import data_card_lines

    _, first, first_set = _shard_set(tmp_path, "trained", vocab_size=500)
    folder = tmp_path / "my-tokenizer"
    shutil.copytree(first["tokenizer_uri"], folder)
    with caplog.at_level(logging.INFO, logger="mlm_tasks"):
        cfg, data, shard_set = _shard_set(tmp_path, "reused", from_pretrained=str(folder), vocab_size=900)
    assert "no tokenizer is trained" in caplog.text
    tok = shard_set.data["tokenizer"]
    assert tok["from_pretrained"] == str(folder) and tok["revision"].startswith("sha256:") and tok["model"] == "unigram"
    # The same tokenizer, so the same ids: vocab_size (a trainer's setting) plays no part.
    assert load_tokenizer(data["tokenizer_uri"]).get_vocab() == load_tokenizer(str(folder)).get_vocab()
    assert shard_set.vocab_size == first_set.vocab_size == 500
    assert f"- Unigram tokenizer reused from `{folder}` (files sha256 `{tok['revision'][7:]}`)" in data_card_lines(data)
    assert data["fingerprint"] != first["fingerprint"]
    # Its files are its identity: another tokenizer.json in the folder is another shard set.
    assert _fingerprint(cfg) == data["fingerprint"]
    (folder / "tokenizer.json").write_text((folder / "tokenizer.json").read_text().replace('"<unk>"', '"<UNK>"'))
    assert _fingerprint(cfg) != data["fingerprint"]
    with pytest.raises(ConfigError, match=r"tokenizer.from_pretrained .* lacks the special token\(s\) <unk>"):
        _shard_set(tmp_path, "broken", from_pretrained=str(folder))
    from mlm_tasks.steps.validate import validate

    with pytest.raises(ConfigError, match=r"tokenizer.from_pretrained .* lacks the special token\(s\) <unk>"):
        validate(cfg)  # before any work, too


def test_a_hub_tokenizer_is_pinned_to_its_commit(tmp_path, fake_hub):
    from huggingface_hub import HfApi

    _, first, first_set = _shard_set(tmp_path, "trained", vocab_size=500)
    api = HfApi(endpoint=fake_hub.url, token=fake_hub.token)
    api.create_repo("tester/tok")
    commit = api.upload_folder(repo_id="tester/tok", folder_path=first["tokenizer_uri"]).oid
    api.upload_file(repo_id="tester/tok", path_or_fileobj=b"later", path_in_repo="notes.txt")  # main moves on
    _, data, shard_set = _shard_set(tmp_path, "hub", from_pretrained="tester/tok", reserved_tokens=1)
    tok = shard_set.data["tokenizer"]
    assert tok["from_pretrained"] == "tester/tok" and tok["revision"] == fake_hub.repos["tester/tok"].sha != commit
    assert tok["spare_tokens"] == 12 and shard_set.vocab_size == 512  # 500 + 1, padded to 512
    _, pinned, _ = _shard_set(tmp_path, "pinned", from_pretrained="tester/tok", revision=commit)
    assert pinned["fingerprint"] != data["fingerprint"]
    with pytest.raises(ConfigError, match="tokenizer.revision 'v9' is not a branch, tag or commit of tester/tok"):
        _shard_set(tmp_path, "nope", from_pretrained="tester/tok", revision="v9")
