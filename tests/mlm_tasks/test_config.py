"""Config: defaults valid, every bad setting rejected with a message that says what to fix."""

import re
from pathlib import Path

import pytest

from mlm_tasks.config import PipelineConfig, build_config, config_from_params, load_config
from mlm_tasks.errors import ConfigError

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_defaults_are_valid():
    cfg = build_config()
    assert cfg.compute == "local" and cfg.model.shape().hidden_size > 0


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_files_load(path):
    assert isinstance(load_config(path), PipelineConfig)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"vocab_sz": 8000}, "Unknown setting 'vocab_sz'"),
        ({"train.learnig_rate": 0.1}, "Unknown setting 'train.learnig_rate'"),
        ({"tpu.ssh_via_external_ip": True}, "Unknown setting 'tpu.ssh_via_external_ip'"),  # now tpu.ssh_via, no alias
        ({"model_preset": "huge"}, "Unknown model preset 'huge'"),
        ({"max_length": 512}, "max_length can be at most 128"),
        ({"output_root": "s3://bucket/x"}, "unsupported scheme 's3'"),
        ({"vocab_size": 10}, "vocab_size"),
        ({"batch_size": 0}, "train.batch_size"),
        ({"compute": "tpu_vm"}, "compute=tpu_vm needs output_root=gs://"),
        ({"compute": "tpu_vm", "output_root": "gs://b/p"}, "needs tpu.project"),
        ({"publish": True}, "publish.enabled needs publish.repo_id"),
        ({"corpus_source": "web"}, "corpus.source"),
    ],
)
def test_bad_settings_fail_with_a_message(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        build_config(overrides=overrides)


def test_train_fail_at_step_is_gone_and_the_error_says_what_replaces_it(tmp_path):
    """Fault injection is a training hook now: whichever door still names the setting (an override, a YAML
    file, a trigger's conf) is told it is gone and what to use, not to check its spelling."""
    with pytest.raises(
        ConfigError,
        match=r"Setting 'train\.fail_at_step' is gone: .*hooks=\[FailAtStep\(N\)\]"
        r".*MLM_TRAIN_HOOKS=mlm_tasks\.training\.hooks:fail_at_step=N",
    ):
        build_config(overrides={"train.fail_at_step": 6})
    old = tmp_path / "old.yaml"
    old.write_text("train:\n  steps: 12\n  fail_at_step: 6\n")
    with pytest.raises(ConfigError, match=r"'train\.fail_at_step' is gone"):
        load_config(old)
    with pytest.raises(ConfigError, match=r"'train\.fail_at_step' is gone"):
        config_from_params({"steps": 12, "overrides": {"train": {"fail_at_step": 6}}})
    # What replaces it is no setting by any name: a trigger's conf cannot reach it.
    with pytest.raises(ConfigError, match="Unknown setting 'MLM_TRAIN_HOOKS'"):
        config_from_params({"MLM_TRAIN_HOOKS": "mlm_tasks.training.hooks:fail_at_step=6"})


def test_flat_params_and_overrides_map_into_sections():
    cfg = config_from_params(
        {
            "vocab_size": 2000,
            "steps": 7,
            "overrides": {"train.checkpoint_every": 3},
            "output_root": "gs://bucket/prefix",
            "corpus_source": "",
        }
    )
    assert cfg.tokenizer.vocab_size == 2000 and cfg.train.steps == 7 and cfg.train.checkpoint_every == 3
    assert cfg.output_root == "gs://bucket/prefix" and cfg.corpus.source == "embedded_wiki"


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_max_length_fits_when_positions_are_raised():
    cfg = build_config(overrides={"max_length": 256, "model.max_position_embeddings": 258})
    assert cfg.shards.max_length == 256


def test_a_config_file_that_is_not_a_small_regular_file_is_refused(tmp_path):
    import os

    from mlm_tasks.config import load_config
    from mlm_tasks.errors import ConfigError

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # reading it would hang the task
    for path in (fifo, "/dev/zero", tmp_path):
        with pytest.raises(ConfigError, match="is not a regular file of at most"):
            load_config(path)


@pytest.mark.parametrize(
    "key, value",
    [
        ("tpu.api_timeout_s", 1e12),
        ("publish.request_timeout_s", 1e12),
        ("tpu.ttl_hours", 1e9),
        ("storage.timeout_s", 1e6),
        ("train.batch_size", 10**9),
        ("train.shuffle_buffer", 10**12),
        ("shards.records_per_shard", 10**12),
        ("eval.batch_size", 10**9),
        ("train.stall_minutes", 1e9),
    ],
)
def test_every_limit_has_an_upper_bound_named_in_the_error(key, value):
    from mlm_tasks.config import build_config
    from mlm_tasks.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"{re.escape(key)}: Input should be less than or equal to"):
        build_config({}, {key: value})
