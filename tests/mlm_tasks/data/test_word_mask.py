"""Whole-word masking (train.whole_word_mask): on the tiny data set's real sequences and its trained
Unigram tokenizer, every drawn word is masked whole, specials never, the cap of LM-head slots keeps
words whole, the masked share is mlm_probability's, and the masker compiles under XLA.

Words are found here independently of the code under test, from the pieces' text: a piece starting
with "▁" starts a word, a special token is a word of its own, and so is the piece after one.
"""

import json
import shutil

import numpy as np
import pytest

from mlm_tasks.data.shard_set import ShardSet
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import DataPaths

SEQUENCES = 4096  # for the share: ~260k tokens in ~190k words, a standard error of ~0.001 at p=0.15
SHARE_TOLERANCE = 0.005  # ~5 standard errors; selecting words at p / (pieces per word) misses it by ~0.04


@pytest.fixture(scope="module")
def tiny(tiny_prepared):
    """(tokenizer, train ids [records, 64] int32, tokenizer folder) of the tiny data set."""
    import tensorflow as tf

    from mlm_tasks.data.tokenizer import load_tokenizer

    cfg, data = tiny_prepared
    paths = DataPaths(cfg.output_root, data["fingerprint"])
    shard_set = ShardSet.load(paths)
    feature = {"input_ids": tf.io.FixedLenFeature([shard_set.max_length], tf.int64)}
    rows = [
        tf.io.parse_single_example(raw, feature)["input_ids"].numpy()
        for raw in tf.data.TFRecordDataset(shard_set.shard_uris("train"))
    ]
    return load_tokenizer(paths.tokenizer), np.stack(rows).astype(np.int32), data["tokenizer_uri"]


def _words(tok, ids: np.ndarray) -> np.ndarray:
    """Each position's word index in its row, from the pieces' text."""
    special = set(tok.all_special_ids)
    words = np.zeros_like(ids)
    for r, row in enumerate(ids):
        pieces = tok.convert_ids_to_tokens(row.tolist())
        w = 0
        for i, (piece, id_) in enumerate(zip(pieces, row, strict=True)):
            if i and (piece.startswith("▁") or id_ in special or row[i - 1] in special):
                w += 1
            words[r, i] = w
    return words


def _mask(tok, ids, probability, max_predictions=0, batch_index=0, jit=False):
    import tensorflow as tf

    from mlm_tasks.data.input import BatchSeededRng, make_masker

    mask = make_masker(tok, probability, whole_word_mask=True, max_predictions=max_predictions)
    step = tf.function(lambda ids, index: mask(ids, BatchSeededRng(3, index)), jit_compile=jit)
    masked, labels = step(tf.constant(ids), tf.constant(batch_index, tf.int64))
    return masked.numpy(), labels.numpy()


def _partial_words(words: np.ndarray, selected: np.ndarray) -> int:
    """How many (row, word) pairs are selected in part only."""
    partial = 0
    for row_words, row_sel in zip(words, selected, strict=True):
        for w in np.unique(row_words):
            s = row_sel[row_words == w]
            partial += bool(s.any() and not s.all())
    return partial


def test_every_drawn_word_is_masked_whole_and_specials_never(tiny):
    tok, ids, _ = tiny
    ids = ids[:256]
    masked, labels = _mask(tok, ids, 0.3)
    words, selected = _words(tok, ids), labels != -100
    assert _partial_words(words, selected) == 0
    # The test can tell: whole words of several pieces were drawn, which token-level masking splits.
    lengths = [(words[r] == words[r, i]).sum() for r, i in zip(*np.nonzero(selected), strict=True)]
    assert sum(n > 1 for n in lengths) > 100
    assert not np.isin(ids[selected], tok.all_special_ids).any()
    np.testing.assert_array_equal(labels[selected], ids[selected])  # labels are the original pieces
    assert (masked[~selected] == ids[~selected]).all()
    # 80/10/10 per token: <mask>, another token, unchanged.
    shown = masked[selected]
    assert 0.75 < (shown == tok.mask_token_id).mean() < 0.85
    assert 0.06 < (shown == ids[selected]).mean() < 0.14


def test_the_cap_keeps_words_whole_and_cuts_after_the_last_word_that_fits(tiny):
    tok, ids, _ = tiny
    ids, cap = ids[:256], 6
    _, free = _mask(tok, ids, 0.3)
    _, capped = _mask(tok, ids, 0.3, max_predictions=cap)  # the same draws: the same seed and batch
    words, free, capped = _words(tok, ids), free != -100, capped != -100
    assert (free.sum(axis=1) > cap).sum() > 50  # the cap bites in many rows
    assert capped.sum(axis=1).max() <= cap and _partial_words(words, capped) == 0
    # Kept: exactly the drawn words that end within the first `cap` selected tokens of the row.
    expected = free & (
        np.array([[free[r][words[r] <= words[r, i]].sum() for i in range(ids.shape[1])] for r in range(len(ids))])
        <= cap
    )
    np.testing.assert_array_equal(capped, expected)


@pytest.mark.parametrize("probability", [0.15, 0.3])
def test_the_masked_share_of_tokens_is_mlm_probability(tiny, probability):
    tok, ids, _ = tiny
    reps = -(-SEQUENCES // len(ids))
    selected, plain = [], []
    for k in range(reps):  # other batch indices: other draws on the same sequences
        selected.append(_mask(tok, ids, probability, batch_index=k)[1] != -100)
        plain.append(~np.isin(ids, tok.all_special_ids))
    share = np.concatenate(selected).sum() / np.concatenate(plain).sum()
    assert len(ids) * reps >= SEQUENCES
    assert abs(share - probability) < SHARE_TOLERANCE, share


def test_the_masker_compiles_under_xla_and_keeps_its_rules(tiny):
    """jit_compile=True (a TPU's step): XLA's stateless random numbers differ from the CPU kernels'
    (another draw, not another rule), so the rules are checked again on what it masks."""
    tok, ids, _ = tiny
    ids, cap = ids[:64], 10
    masked, labels = _mask(tok, ids, 0.3, max_predictions=cap, batch_index=5, jit=True)
    selected = labels != -100
    assert selected.sum() > 200 and selected.sum(axis=1).max() <= cap
    assert _partial_words(_words(tok, ids), selected) == 0
    assert not np.isin(ids[selected], tok.all_special_ids).any()
    np.testing.assert_array_equal(labels[selected], ids[selected])
    assert (masked[~selected] == ids[~selected]).all() and (masked[selected] == tok.mask_token_id).mean() > 0.6


def test_the_train_input_masks_whole_words_within_the_slots(tiny_prepared, tiny):
    from mlm_tasks.data.input import mlm_dataset

    cfg, data = tiny_prepared
    tok = tiny[0]
    shard_set = ShardSet.load(DataPaths(cfg.output_root, data["fingerprint"]))
    ds = mlm_dataset(shard_set, "train", tok, 64, seed=3, whole_word_mask=True, max_predictions=12)
    batch = next(iter(ds))
    ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
    original = np.where(labels != -100, labels, ids)
    selected = labels != -100
    assert selected.sum(axis=1).max() <= 12 and selected.mean() > 0.1
    assert _partial_words(_words(tok, original), selected) == 0


def _metaspace_free_copy(folder, dest):
    """The tokenizer folder with every "▁" written "Ġ": the pieces of a byte-level BPE's shape."""
    shutil.copytree(folder, dest)
    path = dest / "tokenizer.json"
    path.write_text(path.read_text(encoding="utf-8").replace("▁", "Ġ"), encoding="utf-8")
    return dest


def test_a_tokenizer_without_word_starts_is_refused(tiny, tmp_path):
    from mlm_tasks.data.tokenizer import load_tokenizer
    from mlm_tasks.data.word_mask import WholeWordMasker, check_word_starts

    tok, _, folder = tiny
    check_word_starts(tok.get_vocab(), "ours")  # the project's Unigram passes
    bpe = load_tokenizer(str(_metaspace_free_copy(folder, tmp_path / "bpe")))
    message = r"train.whole_word_mask needs a Metaspace tokenizer.*the shards has no such piece.*'Ġ'.*=false"
    with pytest.raises(ConfigError, match=message):
        WholeWordMasker(bpe, 0.15)


def _base_folder(folder, tokenizer_folder):
    """A base model folder as validate reads it: config.json, tokenizer.json, a weights file (not read)."""
    folder.mkdir()
    tokenizer_json = (tokenizer_folder / "tokenizer.json").read_text(encoding="utf-8")
    shape = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128)
    vocab = len(json.loads(tokenizer_json)["model"]["vocab"])
    config = {"model_type": "roberta", **shape, "max_position_embeddings": 66, "vocab_size": vocab}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    (folder / "tf_model.h5").write_bytes(b"validate does not read the weights")
    return folder


def test_validate_refuses_whole_words_for_a_base_or_shards_tokenizer_without_word_starts(tiny, tmp_path):
    from mlm_tasks.steps.validate import validate
    from peers.tiny_data import tiny_config

    _, ids, folder = tiny
    bpe = _metaspace_free_copy(folder, tmp_path / "bpe")
    on = {"train.whole_word_mask": True}
    base = _base_folder(tmp_path / "base", bpe)
    validate(tiny_config(tmp_path / "a", **{"model.init_from": str(base)}))  # off: the base is fine
    with pytest.raises(ConfigError, match=rf"needs a Metaspace tokenizer.*model.init_from {base} has no"):
        validate(tiny_config(tmp_path / "a", **{"model.init_from": str(base)}, **on))

    shards = _shards(tmp_path / "shards", ids[:4])
    byo = {"corpus.source": "tfrecord_shards", "corpus.shards_uri": str(shards)}
    validate(tiny_config(tmp_path / "b", **byo, **{"corpus.tokenizer_uri": str(folder)}, **on))  # ours: fine
    with pytest.raises(ConfigError, match=rf"needs a Metaspace tokenizer.*corpus.tokenizer_uri {bpe}"):
        validate(tiny_config(tmp_path / "c", **byo, **{"corpus.tokenizer_uri": str(bpe)}, **on))
    with pytest.raises(ConfigError, match=rf"needs a Metaspace tokenizer.*tokenizer.from_pretrained {bpe}"):
        validate(tiny_config(tmp_path / "d", **{"tokenizer.from_pretrained": str(bpe)}, **on))


def _shards(folder, block):
    """train/ and validation/ of one seed-script-named file each, holding `block`."""
    import tensorflow as tf

    for split in ("train", "validation"):
        (folder / split).mkdir(parents=True)
        with tf.io.TFRecordWriter(str(folder / split / f"dataset-0-{len(block)}.tfrecord")) as w:
            for row in block:
                values = {"input_ids": row, "attention_mask": np.ones_like(row)}
                feature = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=v)) for k, v in values.items()}
                w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return folder


def test_the_option_is_off_by_default_and_validated():
    from mlm_tasks.config import build_config

    assert build_config().train.whole_word_mask is False
    assert build_config(overrides={"train.whole_word_mask": True}).train.whole_word_mask is True
    with pytest.raises(ConfigError):
        build_config(overrides={"train.whole_word_masks": True})


@pytest.mark.parametrize("whole_word_mask", [False, True])
def test_the_replacement_shares_follow_mask_replace_prob_and_random_replace_prob(tiny, whole_word_mask):
    """Of the selected tokens, the shares shown as <mask>, as another token and as themselves, measured over
    ~4,096 masked sequences (~39k selected tokens: a standard error of ~0.0025), token-level and whole-word."""
    import tensorflow as tf

    from mlm_tasks.data.input import BatchSeededRng, make_masker

    tok, ids, _ = tiny
    reps = -(-SEQUENCES // len(ids))
    for replace in [(0.8, 0.1), (1.0, 0.0), (0.5, 0.4), (0.0, 1.0)]:
        mask = make_masker(tok, 0.15, whole_word_mask=whole_word_mask, replace=replace)
        step = tf.function(lambda ids, index, mask=mask: mask(ids, BatchSeededRng(5, index)))
        shown, originals = [], []
        for k in range(reps):
            masked, labels = (t.numpy() for t in step(tf.constant(ids), tf.constant(k, tf.int64)))
            shown.append(masked[labels != -100])
            originals.append(labels[labels != -100])
        shown_all, original = np.concatenate(shown), np.concatenate(originals)
        as_mask = np.mean(shown_all == tok.mask_token_id)
        as_random = np.mean((shown_all != tok.mask_token_id) & (shown_all != original))
        # A random draw may hit the token itself or <mask> (1 in ~1,000 each): within the tolerance.
        assert abs(as_mask - replace[0]) < 0.01 and abs(as_random - replace[1]) < 0.01, (replace, as_mask, as_random)


def test_the_replacement_shares_are_validated_together():
    from mlm_tasks.config import build_config

    assert build_config(overrides={"train.mask_replace_prob": 0.7, "train.random_replace_prob": 0.3})
    with pytest.raises(ConfigError, match=r"train.mask_replace_prob 0.9 \+ train.random_replace_prob 0.2 is 1.1"):
        build_config(overrides={"train.mask_replace_prob": 0.9, "train.random_replace_prob": 0.2})
    with pytest.raises(ConfigError, match="mask_replace_prob"):
        build_config(overrides={"train.mask_replace_prob": 1.2})


def test_the_run_s_train_input_takes_the_replacement_shares_from_its_config(tiny_prepared, tiny):
    from mlm_tasks.training.step import train_input
    from peers.tiny_data import tiny_config

    cfg, data = tiny_prepared
    every = tiny_config(cfg.output_root, **{"train.mask_replace_prob": 1.0, "train.random_replace_prob": 0.0})
    shard_set = ShardSet.load(DataPaths(cfg.output_root, data["fingerprint"]))
    batch = next(iter(train_input(every, shard_set, tiny[0], 64, 0, 1)(None)))
    ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
    assert (labels != -100).sum() > 50 and (ids[labels != -100] == tiny[0].mask_token_id).all()
