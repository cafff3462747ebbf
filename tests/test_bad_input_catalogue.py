"""The bad-input catalogue: every bad input is refused with a message that says what to fix, before any
TPU VM is created.

Each case runs through the real entry points that meet it, in DAG order: `config_from_params` and
the `validate` step (task validate), `plan_shards`, the `write_shards` partitions, `merge_shards`
and `check_run`, and, for inputs that only a standalone step can be handed (`python -m mlm_tasks train
--data-fingerprint ...`), the step itself (train / evaluate). `test_checks_run_before_the_tpu_vm`
shows in the real DAG that these tasks come before create_tpu_vm, and one real `airflow dags test`
run on the TPU path stops at check_run without a single create call to the (fake) TPU API.

    pytest tests/test_bad_input_catalogue.py
    python scripts/print_catalogue.py       # the same cases, printed as the docs/ table
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlm_tasks.config import config_from_params
from mlm_tasks.errors import AuthError, ConfigError, MissingArtifactError
from mlm_tasks.steps import SHARD_SET_STEPS
from peers.tiny_data import TINY_YAML, tiny_config

RECORD = os.environ.get("MLM_CATALOGUE_OUT")  # scripts/print_catalogue.py collects the messages here
TASK_OF = {
    "config_from_params": "validate",
    "validate": "validate",
    "run_config": "validate",
    "plan_shards": "plan_shards",
    "scan_partition": "scan_partition",
    "train_tokenizer": "train_tokenizer",
    "merge_shards": "merge_shards",
    "check_run": "check_run",
    "summary_for_fingerprint": "plan_shards",
    "train": "train (step run alone)",
    "evaluate": "evaluate (step run alone)",
}


# The tasks that refuse bad input before money is spent: every one is upstream of create_tpu_vm.
BEFORE_VM = ("validate", *SHARD_SET_STEPS, "check_run")


@dataclass
class Case:
    id: str
    what: str
    expect: str  # regex: the message names the setting and the fix
    steps: list[tuple]  # (entry point, call[, expect if it differs]) in DAG order
    needs: str = ""  # fixture: "" | "data" | "trained"
    error: type = ConfigError


def form(**params):
    """The trigger form: tiny.yaml plus flat params, exactly as the validate task builds the config."""
    return lambda ctx: config_from_params({"config_file": str(TINY_YAML), "output_root": str(ctx.tmp / "o"), **params})


def deployed(**params):
    """The trigger form under a deployment file (MLM_DEPLOYMENT): the configs folder holds tiny.yaml,
    runs may write under <tmp>/o and gs://team-bucket/mlm, and the deployment sets the GCP project."""

    def make(ctx):
        from mlm_tasks.config.deployment import Deployment

        configs = ctx.tmp / "configs"
        configs.mkdir(exist_ok=True)
        (configs / "tiny.yaml").write_text(TINY_YAML.read_text())
        dep_file = ctx.tmp / "deployment.yaml"
        dep_file.write_text(
            f"settings: {{tpu: {{project: team-project}}}}\noutput_roots: [{ctx.tmp / 'o'}, "
            f"'gs://team-bucket/mlm']\nconfig_dirs: [{configs}]\n"
        )
        return Deployment.load(str(dep_file)).run_config(
            {"config_file": str(configs / "tiny.yaml"), "output_root": str(ctx.tmp / "o"), **params}
        )

    return make


def rest_made_event(ctx):
    """A shards event POSTed through the REST API (FAB's User role may), as the validate task receives it."""
    from mlm_tasks.config.deployment import check_event

    return check_event(
        {
            "fingerprint": "0123456789abcdef",
            "output_root": str(ctx.tmp / "o"),
            "from_rest_api": True,
            "data_config": {"corpus": {"source": "local_files", "local_paths": ["/etc/*"]}},
        },
        None,
        None,
    )


def config_file(text: str):
    """The trigger form naming a config file with `text` in it."""

    def make(ctx):
        path = ctx.tmp / "bad.yaml"
        path.write_text(text)
        return config_from_params({"config_file": str(path), "output_root": str(ctx.tmp / "o")})

    return make


def tpu_form(**params):
    """The trigger form of a TPU VM run (gs:// output, a project), plus `params`."""
    return form(output_root="gs://bucket/prefix", compute="tpu_vm", tpu_project="my-project", **params)


def local_corpus(ctx, name: str, content: bytes, **overrides):
    path = ctx.tmp / name
    path.write_bytes(content)
    return tiny_config(
        ctx.tmp / "o",
        **{
            "corpus.source": "local_files",
            "corpus.local_paths": [str(path)],
            "corpus.validation_fraction": 0.0,
            "corpus.test_fraction": 0.0,
            **overrides,
        },
    )


def validate(make_cfg, **where):
    """The validate step as the validate task calls it; `where` is what the Airflow side detects (executor)."""

    def call(ctx):
        from mlm_tasks.steps.validate import validate

        return validate(make_cfg(ctx), **where)

    return call


def prepare(make_cfg, fails_in: str):
    """The DAG's data tasks in order: plan_shards, every scan_partition, every find_duplicates,
    cluster_duplicates, train_tokenizer, every write_shards partition, merge_shards. Each is run only if
    the one before passed, so the error comes from the task named `fails_in`."""

    def call(ctx):
        from mlm_tasks.paths import RunContext
        from mlm_tasks.steps.cluster_duplicates import cluster_duplicates
        from mlm_tasks.steps.find_duplicates import find_duplicates
        from mlm_tasks.steps.merge_shards import merge_shards
        from mlm_tasks.steps.plan_shards import plan_shards
        from mlm_tasks.steps.scan_partition import scan_partition
        from mlm_tasks.steps.train_tokenizer import train_tokenizer
        from mlm_tasks.steps.write_shards import write_shards

        cfg = make_cfg(ctx)
        plan = plan_shards(cfg, RunContext.of(cfg))
        if fails_in == "plan_shards":
            return plan
        data = RunContext.of(cfg, fingerprint=plan["fingerprint"])
        n = len(plan["partitions"])
        if n:
            for p in plan["partitions"]:
                scan_partition(cfg, data, part=p["part"], num_parts=n)
            if fails_in == "scan_partition":
                return plan
            for b in range(n):
                find_duplicates(cfg, data, bucket=b, num_parts=n)
            cluster_duplicates(cfg, data, num_parts=n)
            train_tokenizer(cfg, data, num_parts=n)
            if fails_in == "train_tokenizer":
                return plan
        for p in plan["partitions"]:
            write_shards(cfg, data, part=p["part"], num_parts=p["num_parts"])
        return merge_shards(cfg, data, plan=plan)

    return call


def find_data(fp_of):
    def call(ctx):
        from mlm_tasks.data.shard_set import summary_for_fingerprint

        return summary_for_fingerprint(ctx.cfg, fp_of(ctx))

    return call


def run_check(cfg_of, run_id: str, fp_of):
    """The check_run step with the part of merge_shards' summary it reads (the shard set may be missing)."""

    def call(ctx):
        from mlm_tasks.paths import RunContext
        from mlm_tasks.steps.check_run import check_run

        cfg, fingerprint = cfg_of(ctx), fp_of(ctx)
        return check_run(cfg, RunContext.of(cfg, run_id, fingerprint), data={"fingerprint": fingerprint})

    return call


def train_step(cfg_of, run_id: str, fp_of):
    def call(ctx):
        from mlm_tasks.paths import RunContext
        from mlm_tasks.steps.train import train

        cfg = cfg_of(ctx)
        return train(cfg, RunContext.of(cfg, run_id, fp_of(ctx)))

    return call


def eval_step(cfg_of, run_id: str, fp_of):
    def call(ctx):
        from mlm_tasks.paths import RunContext
        from mlm_tasks.steps.evaluate import evaluate

        cfg = cfg_of(ctx)
        return evaluate(cfg, RunContext.of(cfg, run_id, fp_of(ctx)))

    return call


def _with(**update):
    """The prepared tiny config with some sections changed (a run asking for something else)."""

    def make(ctx):
        cfg = ctx.cfg
        for section, values in update.items():
            cfg = cfg.model_copy(update={section: getattr(cfg, section).model_copy(update=values)})
        return cfg

    return make


def no_gcs_credentials(ctx):
    mp = ctx.monkeypatch
    for name in ("STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT", "GCE_METADATA_HOST"):
        mp.delenv(name, raising=False)
    mp.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(ctx.tmp / "nowhere" / "key.json"))
    (ctx.tmp / "gcloud").mkdir()
    mp.setenv("CLOUDSDK_CONFIG", str(ctx.tmp / "gcloud"))
    return tiny_config("gs://mlm-no-such-bucket/prefix")


def file_in_the_way(ctx):
    (ctx.tmp / "a-file").write_text("not a folder")
    return tiny_config(ctx.tmp / "a-file" / "o")


def damaged_copy(damage):
    """The prepared tiny set copied to this case's own output_root, then damaged: (config, fingerprint)."""

    def make(ctx):
        from mlm_tasks.paths import DataPaths

        if not hasattr(ctx, "damaged"):
            paths = DataPaths(str(ctx.tmp / "damaged"), ctx.fp1)
            shutil.copytree(DataPaths(ctx.cfg.output_root, ctx.fp1).root, paths.root)
            damage(paths)
            ctx.damaged = ctx.cfg.model_copy(update={"output_root": paths.output_root})
        return ctx.damaged

    return make


def _half_manifest(paths):
    text = Path(paths.manifest).read_text()
    Path(paths.manifest).write_text(text[: len(text) // 2])


def _truncated_shard(paths):
    shard = sorted(Path(paths.shards("train")).glob("*.tfrecord"))[0]
    shard.write_bytes(shard.read_bytes()[:-100])


def finish(cfg_of, fp_of):
    def call(ctx):
        from mlm_tasks.paths import RunContext
        from mlm_tasks.steps.merge_shards import merge_shards

        cfg = cfg_of(ctx)
        fingerprint = fp_of(ctx)
        plan = {"fingerprint": fingerprint, "cache_hit": True, "corpus_fingerprint": None, "partitions": []}
        return merge_shards(cfg, RunContext.of(cfg, fingerprint=fingerprint), plan=plan)

    return call


def byo_shards(length: int, features=("input_ids", "attention_mask"), **more):
    """Shards brought from elsewhere (corpus.source=tfrecord_shards), written with TensorFlow: 4 records
    of `length` ids per split, with `features`; the tokenizer is the prepared tiny set's; `more` settings."""

    def make(ctx):
        import tensorflow as tf

        from mlm_tasks.paths import DataPaths

        for split in ("train", "validation"):
            (ctx.tmp / "byo" / split).mkdir(parents=True)
            with tf.io.TFRecordWriter(str(ctx.tmp / "byo" / split / "dataset-0-4.tfrecord")) as w:
                for _ in range(4):
                    feature = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=[7] * length)) for k in features}
                    w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        return tiny_config(
            ctx.tmp / "o",
            **{
                "corpus.source": "tfrecord_shards",
                "corpus.shards_uri": str(ctx.tmp / "byo"),
                "corpus.tokenizer_uri": DataPaths(ctx.cfg.output_root, ctx.fp1).tokenizer,
                **more,
            },
        )

    return make


def byo_damaged(how: str):
    """byo_shards(64) with the second record of its train shard damaged (see damage_second_record)."""

    def make(ctx):
        from peers.seed_shards import damage_second_record

        cfg = byo_shards(64)(ctx)
        damage_second_record(ctx.tmp / "byo" / "train" / "dataset-0-4.tfrecord", how)
        return cfg

    return make


def byo_adopted_then_damaged(ctx):
    """byo_shards(64) adopted (its fingerprint: ctx.byo_fp), then a byte of a train record's data flipped:
    the next plan sees a new fingerprint and adopts again; `train --data-fingerprint` the old one."""
    if not hasattr(ctx, "byo_fp"):
        from mlm_tasks.steps import build_shard_set
        from peers.seed_shards import damage_second_record

        ctx.byo_cfg = byo_shards(64, **{"train.batch_size": 2})(ctx)  # 4 records: batches of 2
        ctx.byo_fp = build_shard_set(ctx.byo_cfg)["fingerprint"]
        damage_second_record(ctx.tmp / "byo" / "train" / "dataset-0-4.tfrecord", "data")
    return ctx.byo_cfg


CFG, FP1, FP2 = (lambda c: c.cfg), (lambda c: c.fp1), (lambda c: c.fp2)
NO_DATA = "0123456789abcdef"
TINY_TEXT = b"the quick brown fox jumps over the lazy dog\n"

CASES = [
    Case(
        "unknown-preset",
        "unknown model preset",
        r"Unknown model preset 'huge': choose one of \['base', 'small', 'tiny'\]",
        [("config_from_params", form(model_preset="huge"))],
    ),
    Case(
        "misspelled-flat-param",
        "misspelled param key (flat form name)",
        r"Unknown setting 'vocab_sz'\. Known flat names: .*or use a dotted path",
        [("config_from_params", form(vocab_sz=8000))],
    ),
    Case(
        "misspelled-dotted-key",
        "misspelled param key (dotted path in overrides)",
        r"Unknown setting 'train\.learnig_rate': check its spelling",
        [("config_from_params", form(overrides={"train.learnig_rate": 1e-3}))],
    ),
    Case(
        "keep-best-without-eval",
        "keep the best checkpoint without validation during training",
        r"train\.keep_checkpoint=best needs train\.eval_every",
        [("config_from_params", form(overrides={"train.keep_checkpoint": "best"}))],
    ),
    Case(
        "steps-per-call-zero",
        "zero steps per call",
        r"train\.steps_per_call 0 must be auto or at least 1",
        [("config_from_params", form(overrides={"train.steps_per_call": 0}))],
    ),
    Case(
        "revision-without-base",
        "a base model revision without a base model",
        r"model\.init_revision 'main' is set but model\.init_from is empty",
        [("config_from_params", form(init_revision="main"))],
    ),
    Case(
        "max-length-over-positions",
        "max_length above the model's positions",
        r"max_length 128 does not fit the model: .*66 positions, so max_length can be at most 64\. Lower max_length "
        r"or set model\.max_position_embeddings",
        [("config_from_params", form(max_length=128))],
    ),
    Case(
        "vocab-below-specials",
        "vocab size smaller than the special tokens",
        r"tokenizer\.vocab_size 4 leaves no room beside the 5 special tokens .*: raise it",
        [("config_from_params", form(overrides={"tokenizer.vocab_size": 4}))],
    ),
    Case(
        "unsupported-scheme",
        "output_root with an unsupported scheme",
        r"output_root 's3://bucket/x' has unsupported scheme 's3': use a local folder or gs://bucket/prefix",
        [("config_from_params", form(output_root="s3://bucket/x"))],
    ),
    Case(
        "gs-without-bucket",
        "gs:// output_root without a bucket",
        r"output_root 'gs:///prefix' names no bucket: use gs://bucket/prefix",
        [("config_from_params", form(output_root="gs:///prefix"))],
    ),
    Case(
        "config-not-yaml",
        "a config file that is not valid YAML",
        r"bad\.yaml line 2 is not valid YAML \(.*\): fix the file",
        [("config_from_params", config_file("train:\n\tsteps: 10\n"))],
    ),
    Case(
        "config-duplicate-key",
        "a key repeated in a YAML config",
        r"bad\.yaml line 3: key 'steps' is repeated \(first at line 2\): keep one of them",
        [("config_from_params", config_file("train:\n  steps: 10\n  steps: 20\n"))],
    ),
    Case(
        "config-not-mapping",
        "a config file that is a list, not settings",
        r"bad\.yaml holds a YAML list, not a mapping of settings",
        [("config_from_params", config_file("- train\n- steps\n"))],
    ),
    Case(
        "tpu-multi-host-without-pod-runtime",
        "multi-host TPU slice with a single-host runtime",
        r"tpu\.accelerator_type v4-32 is a pod slice of 4 hosts, but tpu\.runtime_version '[^']+' is a single-host "
        r"runtime: .*needs the -pod runtime",
        [("config_from_params", tpu_form(accelerator_type="v4-32"))],
    ),
    Case(
        "tpu-pod-runtime-on-one-host",
        "-pod runtime on a one-host TPU type",
        r"tpu\.runtime_version 'tpu-vm-tf-2\.16\.1-pod-pjrt' is a -pod runtime, but tpu\.accelerator_type v5litepod-8 "
        r"is one host: use the single-host runtime",
        [
            (
                "config_from_params",
                tpu_form(
                    accelerator_type="v5litepod-8", overrides={"tpu.runtime_version": "tpu-vm-tf-2.16.1-pod-pjrt"}
                ),
            )
        ],
    ),
    Case(
        "tpu-unknown-accelerator-type",
        "TPU type that does not exist",
        r"tpu\.accelerator_type 'v5litepod-12': v5litepod comes in sizes \[1, 4, 8, 16",
        [("config_from_params", tpu_form(accelerator_type="v5litepod-12"))],
    ),
    Case(
        "tpu-ssh-external-without-external-ips",
        "SSH via external IPs that the workers will not have",
        r"tpu\.ssh_via=external needs tpu\.external_ips=true",
        [("config_from_params", tpu_form(overrides={"tpu.external_ips": False}))],
    ),
    Case(
        "train-timeout-over-ttl",
        "train execution_timeout longer than the TPU VM's TTL",
        r"train\.timeout_hours 48 is longer than tpu\.ttl_hours 12: the janitor would delete the TPU VM",
        [("config_from_params", tpu_form(overrides={"train.timeout_hours": 48}))],
    ),
    Case(
        "unsupported-tpu-runtime",
        "a TPU runtime without a VM lock (or not a TensorFlow runtime)",
        r"tpu\.runtime_version 'tpu-vm-tf-2\.14\.1-pjrt' has no VM lock in this project .*use one of "
        r"tpu-vm-tf-2\.16\.1-pjrt, tpu-vm-tf-2\.16\.1-pod-pjrt, tpu-vm-tf-2\.17\.0-pjrt",
        [("config_from_params", form(overrides={"tpu.runtime_version": "tpu-vm-tf-2.14.1-pjrt"}))],
    ),
    Case(
        "published-unsupported-tpu-runtime",
        "a runtime Google publishes that this project has no lock for",
        r"tpu\.runtime_version 'tpu-vm-tf-2\.18\.0-pjrt-v5e-and-v6' is not supported here \(2\.18\.0 is split by "
        r"chip family and has no lock here yet\): use one of",
        [("config_from_params", form(overrides={"tpu.runtime_version": "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6"}))],
    ),
    Case(
        "tensorflow-on-v6e",
        "a TPU generation TensorFlow does not run on (v6e and later)",
        r"tpu\.accelerator_type v6e-\*: Google's Vertex AI TPU page: TensorFlow is not supported on v6e .* use v5p, "
        r"v5litepod \(v5e\) or v4",
        [("config_from_params", tpu_form(accelerator_type="v6e-8"))],
    ),
    Case(
        "run-sets-deployment-setting",
        "a run (form, REST conf) setting a deployment setting",
        r"tpu\.api_endpoint is a deployment setting: the trigger's settings may not set it \(the deployment sets it "
        r"in .*deployment\.yaml",
        [("run_config", deployed(overrides={"tpu.api_endpoint": "http://anywhere"}))],
    ),
    Case(
        "run-output-root-not-allowed",
        "an output_root outside the deployment's roots",
        r"output_root 'gs://other-bucket/x' is outside the roots this deployment allows",
        [("run_config", deployed(output_root="gs://other-bucket/x"))],
    ),
    Case(
        "run-config-file-not-allowed",
        "a config_file outside the deployment's configs folder",
        r"config_file '/dev/zero' is outside the deployment's config folders",
        [("run_config", deployed(config_file="/dev/zero"))],
    ),
    Case(
        "run-reads-outside-roots",
        "a base model (or dataset) folder outside the deployment's roots",
        r"model\.init_from '/etc' is a path outside the folders this deployment lets runs read",
        [("run_config", deployed(init_from="/etc"))],
    ),
    Case(
        "rest-made-shards-event",
        "a shards event made through the REST API, not by mlm_dataset_refresh",
        r"The shards event that triggered this run was made by the REST API, not by mlm_dataset_refresh",
        [("run_config", rest_made_event)],
    ),
    Case(
        "unbounded-timeout",
        "a timeout without bound (storage.timeout_s=1e12)",
        r"storage\.timeout_s: Input should be less than or equal to 600",
        [("config_from_params", form(overrides={"storage.timeout_s": 1e12}))],
    ),
    Case(
        "gs-without-credentials",
        "gs:// output_root without credentials",
        r"output_root gs://mlm-no-such-bucket/prefix needs Google Cloud credentials and none were found .*"
        r"set GOOGLE_APPLICATION_CREDENTIALS",
        [("validate", validate(no_gcs_credentials))],
        error=AuthError,
    ),
    Case(
        "output-root-not-writable",
        "output_root that cannot be written (a file where its folder should be)",
        r"Cannot write to output_root .*/a-file/o \((NotADirectoryError|FileExistsError): .*\): check the path",
        [("validate", validate(file_in_the_way))],
    ),
    Case(
        "local-root-distributed-executor",
        "local output_root when the executor spreads a run over machines",
        r"output_root .* is a local folder, but the CeleryExecutor may run this run's tasks on several workers.* "
        r"Use output_root gs://bucket/prefix, or, if this folder is a shared mount .*MLM_SHARED_OUTPUT_ROOTS=",
        [("validate", validate(lambda c: tiny_config(c.tmp / "o"), distributed_executor="CeleryExecutor"))],
    ),
    Case(
        "missing-corpus-file",
        "local corpus path that matches no file",
        r"corpus\.local_paths entry '.*missing\.txt' matches no file: check the path",
        [
            (
                "validate",
                validate(
                    lambda c: tiny_config(
                        c.tmp / "o",
                        **{"corpus.source": "local_files", "corpus.local_paths": [str(c.tmp / "missing.txt")]},
                    )
                ),
            )
        ],
    ),
    Case(
        "empty-corpus",
        "empty corpus",
        r"The corpus is empty: its train split has no text rows\. Check the corpus",
        [
            ("validate", validate(lambda c: local_corpus(c, "empty.txt", b"\n  \n\n"))),
            ("train_tokenizer", prepare(lambda c: local_corpus(c, "empty.txt", b"\n  \n\n"), "train_tokenizer")),
        ],
    ),
    Case(
        "undecodable-bytes",
        "undecodable bytes in a local file",
        r"bad\.txt line 2 is not valid UTF-8 \(invalid start byte at byte 0\): re-encode the file as UTF-8",
        [
            ("validate", validate(lambda c: local_corpus(c, "bad.txt", b"fine\n\xff\xfe broken\n"))),
            (
                "scan_partition",
                prepare(lambda c: local_corpus(c, "bad.txt", b"fine\n\xff\xfe broken\n"), "scan_partition"),
            ),
        ],
    ),
    Case(
        "bad-jsonl",
        "a .jsonl line that is not JSON",
        r"bad\.jsonl line 2 is not a JSON object",
        [("validate", validate(lambda c: local_corpus(c, "bad.jsonl", b'{"text": "ok"}\nnot json\n')))],
    ),
    Case(
        "corpus-shorter-than-chunk",
        "corpus shorter than one chunk",
        r"The train split \(1 rows, 43 characters\) is shorter than one chunk of 64 tokens: add text or lower "
        r"max_length",
        [("merge_shards", prepare(lambda c: local_corpus(c, "short.txt", TINY_TEXT, vocab_size=32), "merge_shards"))],
    ),
    Case(
        "vocab-above-corpus",
        "vocab size larger than the corpus supports",
        r"tokenizer\.vocab_size 5000 is larger than this corpus supports \(the trainer found only 32 pieces\): "
        r"lower vocab_size",
        [
            (
                "train_tokenizer",
                prepare(lambda c: local_corpus(c, "small.txt", TINY_TEXT, vocab_size=5000), "train_tokenizer"),
            )
        ],
    ),
    Case(
        "vocab-below-characters",
        "vocab size smaller than the corpus's characters",
        r"tokenizer\.vocab_size 20 is smaller than this corpus's distinct characters .*: raise vocab_size",
        [
            (
                "train_tokenizer",
                prepare(lambda c: local_corpus(c, "chars.txt", TINY_TEXT, vocab_size=20), "train_tokenizer"),
            )
        ],
    ),
    Case(
        "batch-larger-than-data",
        "batch larger than the data",
        r"batch 100000 is larger than the \d+ train records: lower batch_size or add data",
        [
            ("check_run", run_check(_with(train={"batch_size": 100_000}), "big-batch", FP1)),
            ("train", train_step(_with(train={"batch_size": 100_000}), "big-batch", FP1)),
        ],
        needs="data",
    ),
    Case(
        "missing-shards",
        "missing shards",
        r"run build_shard_set first \(or the DAG\) or check output_root and the data fingerprint",
        [
            (
                "summary_for_fingerprint",
                find_data(lambda c: NO_DATA),
                r"No complete shard set for fingerprint 0123456789abcdef .*Rerun mlm_dataset_refresh or trigger",
            ),
            ("check_run", run_check(CFG, "no-data", lambda c: NO_DATA)),
            ("train", train_step(CFG, "no-data", lambda c: NO_DATA)),
        ],
        needs="data",
        error=MissingArtifactError,
    ),
    Case(
        "damaged-manifest",
        "a damaged manifest.json (not valid JSON)",
        r"manifest\.json is damaged \(JSONDecodeError: .*\): delete .*/shards and .*/partitions, then rerun "
        r"build_shard_set \(or the DAG\) to rebuild the shard set",
        [
            ("merge_shards", finish(damaged_copy(_half_manifest), FP1)),
            ("check_run", run_check(damaged_copy(_half_manifest), "damaged", FP1)),
            ("train", train_step(damaged_copy(_half_manifest), "damaged", FP1)),
        ],
        needs="data",
    ),
    Case(
        "corrupted-shard",
        "a shard whose size or checksum no longer matches the manifest",
        r"Shard .*\.tfrecord is corrupted or truncated .*retrying cannot fix it: delete .*/shards and "
        r".*/partitions, then rerun build_shard_set",
        [
            ("check_run", run_check(damaged_copy(_truncated_shard), "corrupted", FP1)),
            ("train", train_step(damaged_copy(_truncated_shard), "corrupted", FP1)),
        ],
        needs="data",
    ),
    Case(
        "byo-shards-missing-feature",
        "brought shards (tfrecord_shards) without attention_mask",
        r"feature 'attention_mask' is absent, not an int64 list: these shards need input_ids and attention_mask",
        [("validate", validate(byo_shards(64, ("input_ids",))))],
        needs="data",
    ),
    Case(
        "byo-shards-other-length",
        "brought shards (tfrecord_shards) of another length than max_length",
        r"hold 32-token records but shards\.max_length is 64: set shards\.max_length=32",
        [("validate", validate(byo_shards(32)))],
        needs="data",
    ),
    Case(
        "byo-shards-data-crc",
        "a brought shard with a byte of a record's data changed",
        r"dataset-0-4\.tfrecord: the TFRecord at byte \d+ has a wrong data checksum \(data CRC\)\. The file was cut "
        r"short or altered after it was written: copy it again from its source, or remove it from the shard set",
        [("validate", validate(byo_damaged("data")))],
        needs="data",
    ),
    Case(
        "byo-shards-length-crc",
        "a brought shard with a byte of a record's length changed",
        r"dataset-0-4\.tfrecord: the TFRecord at byte \d+ has a wrong length checksum \(length CRC\)\. .*copy it "
        r"again from its source",
        [("validate", validate(byo_damaged("length")))],
        needs="data",
    ),
    Case(
        "byo-shards-truncated",
        "a brought shard cut short inside its last record",
        r"dataset-0-4\.tfrecord: the TFRecord at byte \d+ is truncated: it needs \d+ more bytes, the file ends "
        r"after \d+\. .*copy it again from its source",
        [("validate", validate(byo_damaged("truncated")))],
        needs="data",
    ),
    Case(
        "byo-shards-huge-length",
        "a brought shard whose record claims 2^60 bytes (valid length checksum)",
        r"dataset-0-4\.tfrecord: the TFRecord at byte \d+ claims 1152921504606846976 bytes of data, more than the "
        r"whole file \(\d+ bytes\) holds \(length beyond the file\)",
        [("validate", validate(byo_damaged("huge")))],
        needs="data",
    ),
    Case(
        "byo-shards-damaged-after-adoption",
        "a brought shard damaged after it was adopted",
        r"dataset-0-4\.tfrecord: the TFRecord at byte \d+ has a wrong data checksum \(data CRC\)",
        [
            ("plan_shards", prepare(byo_adopted_then_damaged, "plan_shards")),
            (
                "train",
                train_step(byo_adopted_then_damaged, "byo-damaged", lambda c: c.byo_fp),
                r"Training read a damaged train shard \(TensorFlow: corrupted record at \d+\)\. "
                r".*dataset-0-4\.tfrecord: "
                r"the TFRecord at byte \d+ has a wrong data checksum \(data CRC\)\..*Retrying cannot fix it",
            ),
        ],
        needs="data",
    ),
    Case(
        "shards-other-max-length",
        "shards built with another max_length than the run asks for",
        r"were built with max_length 64 but this run asks for 32: prepare data with the run's max_length",
        [
            ("check_run", run_check(_with(shards={"max_length": 32}), "short-run", FP1)),
            ("train", train_step(_with(shards={"max_length": 32}), "short-run", FP1)),
        ],
        needs="data",
    ),
    Case(
        "shards-other-tokenizer",
        "shards built with another tokenizer than the run uses",
        r"is not the one the shards were encoded with \(sha256 differs\): delete the dataset folder and rerun",
        [
            ("check_run", run_check(lambda c: c.swapped, "swapped", FP1)),
            ("train", train_step(lambda c: c.swapped, "swapped", FP1)),
        ],
        needs="data",
    ),
    Case(
        "vocab-mismatch-resume",
        "tokenizer and model vocab sizes differ (resuming a checkpoint)",
        r"has a vocabulary of 1000 but the tokenizer of data \w+ has 900: the model and tokenizer vocab sizes "
        r"differ\. Use a new run id",
        [("check_run", run_check(CFG, "resume-run", FP2)), ("train", train_step(CFG, "resume-run", FP2))],
        needs="trained",
    ),
    Case(
        "vocab-mismatch-trained-model",
        "tokenizer and model vocab sizes differ (a trained model, other data)",
        r"Run done-run already trained on data \w+, not \w+: use a new run id",
        [
            ("check_run", run_check(CFG, "done-run", FP2)),
            (
                "evaluate",
                eval_step(CFG, "done-run", FP2),
                r"Model vocab 1000 != tokenizer vocab 900: .*Evaluate with the data fingerprint the run trained on, or "
                r"retrain",
            ),
        ],
        needs="trained",
    ),
]


@pytest.fixture(scope="module")
def data(tiny_prepared, tmp_path_factory):
    """The prepared tiny set (vocab 1000), a second set with vocab 900, and a copy of the first whose
    tokenizer was swapped for the second's, all under one output_root."""
    from mlm_tasks.steps import build_shard_set

    _, prepared = tiny_prepared
    fp1, root = prepared["fingerprint"], tmp_path_factory.mktemp("catalogue")
    shutil.copytree(prepared["data_root"], root / "out" / "datasets" / fp1)
    fp2 = build_shard_set(tiny_config(root / "out", vocab_size=900))["fingerprint"]
    shutil.copytree(root / "out" / "datasets" / fp1, root / "swapped" / "datasets" / fp1)
    shutil.copy(
        root / "out" / "datasets" / fp2 / "tokenizer" / "tokenizer.json",
        root / "swapped" / "datasets" / fp1 / "tokenizer" / "tokenizer.json",
    )
    return SimpleNamespace(cfg=tiny_config(root / "out"), swapped=tiny_config(root / "swapped"), fp1=fp1, fp2=fp2)


@pytest.fixture(scope="module")
def trained(data):
    """Run done-run trained on the vocab-1000 set; resume-run holds a copy of its checkpoints only."""
    from mlm_tasks.paths import RunContext, RunPaths
    from mlm_tasks.steps.train import train

    train(data.cfg, RunContext.of(data.cfg, "done-run", data.fp1))
    done, resume = RunPaths(data.cfg.output_root, "done-run"), RunPaths(data.cfg.output_root, "resume-run")
    shutil.copytree(done.checkpoints, resume.checkpoints)
    return data


_recorded: list[dict] = []


@pytest.fixture(scope="module", autouse=True)
def _write_record():
    yield
    if RECORD:
        Path(RECORD).write_text(json.dumps(_recorded, indent=1))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input_is_refused_with_what_to_fix(case, request, tmp_path, tmp_path_factory, monkeypatch):
    ctx = request.getfixturevalue(case.needs) if case.needs else SimpleNamespace()
    ctx = SimpleNamespace(**vars(ctx), tmp=tmp_path, monkeypatch=monkeypatch)
    for i, (entry, call, *expect) in enumerate(case.steps):
        with pytest.raises(case.error) as caught:
            call(ctx)
        message = str(caught.value)
        assert re.search(expect[0] if expect else case.expect, message, re.S), (entry, message)
        _recorded.append(
            {
                "case": case.what,
                "entry": entry,
                "task": TASK_OF[entry],
                "first": i == 0,
                "kind": type(caught.value).__name__,
                "message": message.replace(str(tmp_path), "<tmp>").replace(
                    str(tmp_path_factory.getbasetemp()), "<tmp>"
                ),
            }
        )
    # Every case is first refused by a check that mlm_pretrain runs before create_tpu_vm.
    assert TASK_OF[case.steps[0][0]] in BEFORE_VM
    assert all(TASK_OF[entry] in BEFORE_VM for entry, *_ in case.steps if not TASK_OF[entry].endswith("alone)"))


def test_checks_run_before_the_tpu_vm():
    """The tasks that run the checks above come before create_tpu_vm (and train) in the real DAG."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(Path(__file__).resolve().parents[1] / "dags" / "mlm_pretrain.py"))
    assert not bag.import_errors, bag.import_errors
    dag = bag.dags["mlm_pretrain"]
    before_vm = dag.get_task("create_tpu_vm").get_flat_relative_ids(upstream=True)
    assert set(BEFORE_VM) <= before_vm
    assert "create_tpu_vm" in dag.get_task("train").get_flat_relative_ids(upstream=True)
    assert dag.get_task("validate").retries == 0  # a bad input is not retried


@pytest.mark.slow
def test_tpu_run_with_a_bad_input_fails_before_any_vm_is_created(airflow_env, gcs, gcs_root, fake_tpu, tmp_path):
    """A real `dags test` of mlm_pretrain on the TPU path (GCS emulator, fake TPU API) with a batch
    larger than the data: check_run refuses it, and the TPU API never receives a create call. The
    project and the API endpoint are the deployment's (a trigger may not set them, file or no file)."""
    import yaml

    from peers.airflow_home import dags_test

    deployment = tmp_path / "deployment.yaml"
    deployment.write_text(
        yaml.safe_dump(
            {
                "settings": {"tpu": {"project": "proj", "api_endpoint": fake_tpu.url, "transport": "rest"}},
                "output_roots": [gcs_root],
                "config_dirs": [str(TINY_YAML.parent)],
            }
        )
    )
    conf = {
        "config_file": str(TINY_YAML),
        "output_root": gcs_root,
        "compute": "tpu_vm",
        "vocab_size": 1000,
        "max_length": 64,
        "steps": 12,
        "batch_size": 4000,
        "overrides": {"tpu.poll_interval_s": 0.1},
    }
    result = dags_test(
        airflow_env,
        "mlm_pretrain",
        conf=conf,
        timeout=600,
        extra_env={
            "STORAGE_EMULATOR_HOST": gcs.endpoint,
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "MLM_RETRY_DELAY_S": "0",
            "MLM_DEPLOYMENT": str(deployment),
        },
    )
    log = result.stdout + result.stderr
    assert re.search(r"Global batch 4000 is larger than the \d+ train records: lower batch_size", log), log[-5000:]
    # Failed at once (a bad input is not retried), reported by the failure notifier.
    assert "Task failed: mlm_pretrain.check_run run manual__" in log and "try 1 of 3" in log, log[-5000:]
    assert not [r for r in fake_tpu.requests if r[0] == "POST"], fake_tpu.requests
    assert "Creating TPU VM" not in log and "Training on" not in log
