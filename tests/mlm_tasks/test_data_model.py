"""Input pipeline (masking rules, determinism) and the masked-positions loss (equal to the full head)."""
import numpy as np

from mlm_tasks.manifest import ShardSet
from mlm_tasks.paths import DataPaths


def _dataset(cfg, data, **kw):
    from mlm_tasks.data import mlm_dataset
    from mlm_tasks.tokenizer import load_tokenizer

    paths = DataPaths(cfg.output_root, data["fingerprint"])
    tok = load_tokenizer(paths.tokenizer)
    return mlm_dataset(ShardSet.load(paths), "train", tok, 16, seed=3, **kw), tok


def test_masking_rules(tiny_prepared):
    cfg, data = tiny_prepared
    ds, tok = _dataset(cfg, data)
    batch = next(iter(ds))
    ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
    assert ids.shape == labels.shape == (16, 64) and batch["attention_mask"].numpy().all()
    masked = labels != -100
    assert 0.08 < masked.mean() < 0.25  # 15% of tokens selected
    # Special tokens are never selected; 80% of selected positions become <mask>.
    assert not np.isin(labels[masked], tok.all_special_ids).any()
    assert 0.6 < (ids[masked] == tok.mask_token_id).mean() < 0.95
    assert (ids[~masked] != tok.mask_token_id).all()


def test_skip_reproduces_the_same_batches_and_masks(tiny_prepared):
    cfg, data = tiny_prepared
    full, _ = _dataset(cfg, data)
    resumed, _ = _dataset(cfg, data, skip_batches=3)
    expected = [b for _, b in zip(range(5), iter(full))][3:]
    got = [b for _, b in zip(range(2), iter(resumed))]
    for e, g in zip(expected, got):
        for key in ("input_ids", "labels"):
            np.testing.assert_array_equal(e[key].numpy(), g[key].numpy())


def test_loss_at_masked_positions_equals_full_head(tiny_prepared):
    import tensorflow as tf

    from mlm_tasks.model import build_model, masked_lm_loss, roberta_config

    cfg, data = tiny_prepared
    ds, tok = _dataset(cfg, data)
    batch = next(iter(ds))
    shard_set = ShardSet.load(DataPaths(cfg.output_root, data["fingerprint"]))
    tf.keras.utils.set_random_seed(0)
    model = build_model(roberta_config(cfg, len(tok), shard_set.special_ids))
    full = [float(x) for x in masked_lm_loss(model, batch, 0, training=False)]
    sparse = [float(x) for x in masked_lm_loss(model, batch, 64, training=False)]
    np.testing.assert_allclose(sparse, full, rtol=1e-4)
    assert full[1] == float((batch["labels"].numpy() != -100).sum())
