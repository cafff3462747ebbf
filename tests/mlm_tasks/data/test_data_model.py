"""Input pipeline (masking rules, determinism) and the masked-positions loss (equal to the full head)."""

import numpy as np

from mlm_tasks.data.shard_set import ShardSet
from mlm_tasks.paths import DataPaths


def _dataset(cfg, data, batch=16, **kw):
    from mlm_tasks.data.input import mlm_dataset
    from mlm_tasks.data.tokenizer import load_tokenizer

    paths = DataPaths(cfg.output_root, data["fingerprint"])
    tok = load_tokenizer(paths.tokenizer)
    return mlm_dataset(ShardSet.load(paths), "train", tok, batch, seed=3, **kw), tok


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
    expected = [b for _, b in zip(range(5), iter(full), strict=False)][3:]
    got = [b for _, b in zip(range(2), iter(resumed), strict=False)]
    for e, g in zip(expected, got, strict=False):
        for key in ("input_ids", "labels"):
            np.testing.assert_array_equal(e[key].numpy(), g[key].numpy())


def _model_and_batch(tiny_prepared):
    """A fresh tiny model (seed 0) and the first masked batch of the tiny shard set."""
    import tensorflow as tf

    from mlm_tasks.model.roberta import build_model, model_config

    cfg, data = tiny_prepared
    ds, tok = _dataset(cfg, data)
    shard_set = ShardSet.load(DataPaths(cfg.output_root, data["fingerprint"]))
    tf.keras.utils.set_random_seed(0)
    return build_model(model_config(cfg, len(tok), shard_set.special_ids)), next(iter(ds))


def test_loss_at_masked_positions_equals_full_head(tiny_prepared):
    from mlm_tasks.model.roberta import masked_lm_loss

    model, batch = _model_and_batch(tiny_prepared)
    full = [float(x) for x in masked_lm_loss(model, batch, 0, training=False)]
    sparse = [float(x) for x in masked_lm_loss(model, batch, 64, training=False)]
    np.testing.assert_allclose(sparse, full, rtol=1e-4)
    assert full[1] == float((batch["labels"].numpy() != -100).sum())


def test_packed_head_takes_the_positions_the_static_slots_take(tiny_prepared):
    """packed=True (CPU without XLA) gathers the masked positions with no padding rows; with a cap that
    sequences overflow it must keep the same first `max_predictions` of each row as the static slots."""
    from mlm_tasks.model.roberta import masked_lm_loss

    model, batch = _model_and_batch(tiny_prepared)
    per_row = (batch["labels"].numpy() != -100).sum(axis=1)
    cap = 2
    assert per_row.max() > cap  # the cap truncates some rows, so the test can tell the two apart
    for max_pred in (0, cap, 64):
        static = [float(x) for x in masked_lm_loss(model, batch, max_pred, training=False)]
        packed = [float(x) for x in masked_lm_loss(model, batch, max_pred, training=False, packed=True)]
        np.testing.assert_allclose(packed, static, rtol=1e-4)
    assert static[1] == float(per_row.sum())
    capped = masked_lm_loss(model, batch, cap, training=False, packed=True)
    assert float(capped[1]) == float(np.minimum(per_row, cap).sum())


def test_shard_policy_is_file_when_every_pipeline_gets_a_file():
    from mlm_tasks.data.input import shard_policy

    assert [shard_policy(files, pipelines)[0] for files, pipelines in [(5, 1), (5, 5), (64, 8), (4, 8), (1, 2)]] == [
        "file",
        "file",
        "file",
        "data",
        "data",
    ]
    assert "every pipeline reads every file" in shard_policy(4, 8)[1]


def _originals(batch):
    """The unmasked token ids of each example (labels hold the original where a token was masked)."""
    ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
    return [tuple(row) for row in np.where(labels != -100, labels, ids)]


def _pipeline(cfg, data, pipelines, pipeline_id, replicas, batch=16):
    """What host `pipeline_id` of `pipelines` reads (global batch `batch` over `replicas` replicas)."""
    import tensorflow as tf

    ctx = tf.distribute.InputContext(
        num_input_pipelines=pipelines, input_pipeline_id=pipeline_id, num_replicas_in_sync=replicas
    )
    return _dataset(cfg, data, batch, input_context=ctx, shuffle_buffer=64)[0]


def test_file_sharding_gives_each_pipeline_its_own_files(tiny_prepared):
    import tensorflow as tf

    cfg, data = tiny_prepared
    shard_set = ShardSet.load(DataPaths(cfg.output_root, data["fingerprint"]))
    files = shard_set.shard_uris("train")
    assert len(files) >= 2, "the tiny preset must write several train shards for this test"
    file_of = {}
    for uri in files:
        for raw in tf.data.TFRecordDataset(uri):
            ids = tf.io.parse_single_example(raw, {"input_ids": tf.io.FixedLenFeature([64], tf.int64)})
            file_of[tuple(ids["input_ids"].numpy())] = uri
    seen = []
    for pipeline_id in range(2):  # 2 hosts of 2 replicas: global batch 16, 4 per replica
        batches = list(_pipeline(cfg, data, 2, pipeline_id, 4).take(120))
        assert {tuple(b["input_ids"].shape) for b in batches} == {(4, 64)}
        seen.append({file_of[x] for b in batches for x in _originals(b)})
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(files)


def test_data_sharding_splits_each_global_batch_over_the_pipelines(tiny_prepared):
    cfg, data = tiny_prepared
    files = ShardSet.load(DataPaths(cfg.output_root, data["fingerprint"])).shard_uris("train")
    pipelines = len(files) + 1  # more hosts than files
    batch = 2 * pipelines
    whole = _originals(next(iter(_dataset(cfg, data, batch, shuffle_buffer=64)[0])))
    parts = []
    for pipeline_id in range(pipelines):
        parts += _originals(next(iter(_pipeline(cfg, data, pipelines, pipeline_id, pipelines, batch))))
    # Each pipeline's slice of step 0's global batch: together the batch one pipeline would read.
    assert len(parts) == batch and parts == whole
