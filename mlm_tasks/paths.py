"""Every URI of the pipeline, derived from output_root in one place: `datasets/<data fingerprint>/` (DataPaths)
and `runs/<run id>/` (RunPaths); every step takes a `RunContext` with both. docs/architecture.md"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace

from mlm_tasks.errors import ConfigError, MissingArtifactError

SPLITS = ("train", "validation", "test")


def scheme(uri: str) -> str:
    """ "gs" for gs://bucket/..., "file" for a local path or file://: what storage and every check dispatch on."""
    return uri.split("://", 1)[0] if "://" in uri else "file"


def bucket_and_name(uri: str) -> tuple[str, str]:
    """("bucket", "path/in/it") of a gs:// URI."""
    bucket, _, name = uri.split("://", 1)[1].partition("/")
    return bucket, name


def join(root: str, *parts: str) -> str:
    """Join URI parts with '/', for local paths and gs:// alike."""
    out = root.rstrip("/")
    for part in parts:
        out = f"{out}/{part.strip('/')}"
    return out


_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")  # cloud.google.com/storage/docs/buckets#naming


def check_safe_uri(setting: str, value: str, *, glob: bool = False) -> None:
    """ConfigError unless `value` is a plain path, gs:// or file:// URI or Hub id (`glob`: * and ? too): what a
    run may write reaches paths, URLs and the TPU VM's shell line."""
    allowed = "[A-Za-z0-9._/*?-]" if glob else "[A-Za-z0-9._/-]"
    if not re.fullmatch(f"(?:gs://|file://)?{allowed}+", value):
        raise ConfigError(
            f"{setting} {value!r} holds characters outside the allowed set {allowed} (after an "
            "optional gs:// or file:// scheme): rename the folder, bucket prefix or repo so it "
            "uses only letters, digits, '.', '_', '-' and '/'."
        )
    if ".." in value.split("://", 1)[-1].split("/"):
        raise ConfigError(
            f"{setting} {value!r} has a '..' path segment: give the place itself (an absolute "
            "path or a gs://bucket/prefix), not a way up out of another."
        )
    if scheme(value) != "gs":
        return
    bucket, path = bucket_and_name(value)
    if bucket and not (
        _BUCKET.fullmatch(bucket)
        and all(len(part) <= 63 for part in bucket.split("."))
        and not bucket.startswith("goog")
        and "google" not in bucket
        and not re.fullmatch(r"[0-9.]+", bucket)
    ):
        raise ConfigError(
            f"{setting} {value!r}: the bucket name {bucket!r} is not a valid Cloud Storage bucket name (3-63 "
            "lowercase letters, digits, '-', '_' and '.', starting and ending with a letter or digit, not "
            "starting with 'goog'): fix the bucket name."
        )
    # gcsfs keeps an empty or '.' segment in the object names (gs://b//mlm/x writes '/mlm/x/...', outside mlm/).
    canonical = "/".join(part for part in path.split("/") if part not in ("", "."))
    if path.rstrip("/") != canonical:
        raise ConfigError(
            f"{setting} {value!r} has an empty or '.' path segment, which Cloud Storage keeps in the object "
            f"names (outside the prefix it seems to name): write gs://{bucket}/{canonical}."
        )


def safe_run_id(run_id: str) -> str:
    """A run id without Airflow's ':' and '+' (they break gs:// tooling and TPU names), unique by a short hash."""
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "-", run_id).strip("-.")[:60] or "run"
    # An id already in the hashed form ("x-1a2b3c4d") is hashed again: kept as is, it could be the
    # safe form of another run's id ("x:") and the two runs would share a folder.
    if readable == run_id and not re.fullmatch(r".*-[0-9a-f]{8}", run_id):
        return run_id
    return f"{readable}-{hashlib.sha1(run_id.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class DataPaths:
    output_root: str
    fingerprint: str

    root = property(lambda self: join(self.output_root, "datasets", self.fingerprint))
    tokenizer = property(lambda self: join(self.root, "tokenizer"))
    shards_dir = property(lambda self: join(self.root, "shards"))
    partitions_dir = property(lambda self: join(self.root, "partitions"))
    dedup_dir = property(lambda self: join(self.root, "dedup"))  # scans, matches, clusters (mlm_tasks/data/dedup)
    # What the tokenizer trained on; beside the dedup stages, not in tokenizer/ (published with the model).
    tokenizer_sample = property(lambda self: join(self.dedup_dir, "tokenizer_sample.json"))
    manifest = property(lambda self: join(self.shards_dir, "manifest.json"))
    success = property(lambda self: join(self.shards_dir, "_SUCCESS"))

    def shards(self, split: str) -> str:
        return join(self.shards_dir, split)


@dataclass(frozen=True)
class RunPaths:
    output_root: str
    run_id: str

    root = property(lambda self: join(self.output_root, "runs", safe_run_id(self.run_id)))
    checkpoints = property(lambda self: join(self.root, "checkpoints"))
    model = property(lambda self: join(self.root, "model"))
    eval_metrics = property(lambda self: join(self.root, "eval", "metrics.json"))
    downstream = property(lambda self: join(self.root, "eval", "downstream.json"))
    train_summary = property(lambda self: join(self.root, "train", "summary.json"))
    train_history = property(lambda self: join(self.root, "train", "history.jsonl"))
    train_status = property(lambda self: join(self.root, "train", "status.json"))
    train_restarts = property(lambda self: join(self.root, "train", "restarts.json"))  # node losses in a try
    train_budget = property(lambda self: join(self.root, "train", "budget.json"))  # train.budget_minutes' count
    train_best = property(lambda self: join(self.root, "train", "best"))  # the best step's weights, by step number
    fault_marker = property(lambda self: join(self.root, "train", ".fault_injected"))  # a FailAtStep hook fired
    predictions = property(lambda self: join(self.root, "infer", "predictions.json"))
    report = property(lambda self: join(self.root, "report"))
    tensorboard = property(lambda self: join(self.root, "tensorboard"))
    data_ref = property(lambda self: join(self.root, "data.json"))
    summary_text = property(lambda self: join(self.root, "summary.txt"))
    published = property(lambda self: join(self.root, "publish", "published.json"))


@dataclass(frozen=True)
class RunFolder(RunPaths):
    """The paths of a run found by listing output_root/runs: `run_id` is its folder's name, already safe."""

    root = property(lambda self: join(self.output_root, "runs", self.run_id))


def published_metrics(output_root: str, repo_id: str, releases_root: str | None = None) -> str:
    """Metrics of the last model published to `repo_id`, which the gate compares against: under `releases_root`
    when the deployment names one (a fresh output_root would skip the comparison), else under output_root."""
    return join(releases_root or join(output_root, "published"), repo_id.replace("/", "__"), "metrics.json")


@dataclass(frozen=True)
class RunContext:
    """What every step gets besides the config: the run id, the shard set it uses, and their paths:
    `ctx = RunContext.of(cfg, run_id="r1", fingerprint=fp); ctx.run.model, ctx.data.manifest`."""

    output_root: str
    run_id: str = "cli-run"
    fingerprint: str | None = None

    @classmethod
    def of(cls, cfg, run_id: str = "cli-run", fingerprint: str | None = None) -> RunContext:
        return cls(cfg.output_root, run_id, fingerprint)

    def with_data(self, fingerprint: str) -> RunContext:
        return replace(self, fingerprint=fingerprint)

    @property
    def run(self) -> RunPaths:
        return RunPaths(self.output_root, self.run_id)

    @property
    def data(self) -> DataPaths:
        if not self.fingerprint:
            raise MissingArtifactError(
                "This step needs the data fingerprint of a shard set: pass --data-fingerprint "
                "(the CLI), or run plan_shards first."
            )
        return DataPaths(self.output_root, self.fingerprint)
