"""Config: defaults valid, every bad setting rejected with a message that says what to fix."""

import re
from pathlib import Path

import pytest

from mlm_tasks.config import PipelineConfig, build_config, config_from_params, load_config
from mlm_tasks.config.section import deployment_keys, leaves
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
        ({"compute": "tpu_vm", "output_root": "gs://bkt/p"}, "needs tpu.project"),
        ({"publish": True}, "publish.enabled needs publish.repo_id"),
        ({"corpus_source": "web"}, "corpus.source"),
        ({"tokenizer.model": "sentencepiece"}, "tokenizer.model"),
        ({"tokenizer.revision": "v1"}, "tokenizer.revision 'v1' is set but tokenizer.from_pretrained is empty"),
        ({"tokenizer.from_pretrained": "a/b", "model.init_from": "c/d"}, "model.init_from and corpus.source="),
        ({"tokenizer.model": "bpe", "train.whole_word_mask": True}, "tokenizer.model=bpe has none"),
        ({"architecture": "modernbert", "model.sinusoidal_init": True}, "modernbert has no position table"),
    ],
)
def test_bad_settings_fail_with_a_message(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        build_config(overrides=overrides)


def test_fault_injection_is_no_setting_a_run_can_reach(tmp_path):
    """Fault injection is a training hook (MLM_TRAIN_HOOKS in the trainer's environment): no door names it."""
    old = tmp_path / "old.yaml"
    old.write_text("train:\n  steps: 12\n  fail_at_step: 6\n")
    with pytest.raises(ConfigError, match=r"Unknown setting 'train\.fail_at_step'"):
        load_config(old)
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
        ("tpu.delete_timeout_s", 1e12),
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


def test_every_setting_is_documented_and_every_documented_setting_exists():
    """docs/configuration.md#every-setting holds the why of each setting (the schema's descriptions are one
    line): it names exactly the schema's settings, and marks exactly those only the deployment may set."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    part = doc.split("\n## Every setting\n", 1)[1].split("\n## ", 1)[0]
    documented = dict(re.findall(r"^- `([\w.\[\]]+)`( \(deployment only\))?: \S", part, re.M))
    schema = {name for name, _ in leaves(PipelineConfig)}
    assert (sorted(schema - set(documented)), sorted(set(documented) - schema)) == ([], [])
    assert {name for name, mark in documented.items() if mark} == set(deployment_keys(PipelineConfig))
    assert len(schema) > 150 and "corpus.mixture[].weight" in schema and "tpu.project" in documented


PLACE = re.compile(r"(_uri|_path|_paths|_root|_file|_from)$")  # settings that name a place (a Hub id or a path)
PLACES = [name for name, _ in leaves(PipelineConfig) if "[]" not in name and PLACE.search(name)]


@pytest.mark.parametrize("key", PLACES)
def test_every_place_a_run_names_is_checked_as_written_with_its_bucket(key):
    """gcsfs keeps an empty or '.' segment in object names (gs://b//mlm/x writes '/mlm/x/...', outside the
    prefix mlm/): each setting naming a place is refused unless written canonically, and a bad bucket name
    is named as such."""
    for uri, message in [
        ("gs://team-bucket//x", r"'gs://team-bucket//x' has an empty or '\.' path segment.*gs://team-bucket/x"),
        ("gs://team-bucket/./x/", r"'gs://team-bucket/\./x/' has an empty or '\.' path segment"),
        ("gs://goog-bucket/x", r"'gs://goog-bucket/x': the bucket name 'goog-bucket' is not a valid Cloud Storage"),
    ]:
        with pytest.raises(ConfigError, match=rf"{re.escape(key)}(\[0\])? {message}"):
            build_config(overrides={key: [uri] if key.endswith("_paths") else uri})
    assert len(PLACES) >= 7 and "output_root" in PLACES and "publish.releases_root" in PLACES
    build_config(overrides={"output_root": "gs://team-bucket/mlm/x/"})  # a trailing slash is the same place
