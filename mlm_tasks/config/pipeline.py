"""The whole run's settings (`PipelineConfig`): its sections, and the checks that cross them (no I/O: those
are `mlm_tasks.steps.validate`'s)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from mlm_tasks import paths
from mlm_tasks.config.data import SPECIAL_TOKENS, CorpusConfig, DedupConfig, ShardConfig, TokenizerConfig
from mlm_tasks.config.release import DownstreamConfig, GateConfig, PublishConfig
from mlm_tasks.config.section import DeploymentOnly, Section
from mlm_tasks.config.tpu import TpuConfig
from mlm_tasks.config.training import POSITION_OFFSET, EvalConfig, InferConfig, ModelConfig, TrainConfig
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import check_safe_uri
from mlm_tasks.tpu import slices as tpu_slices

HUB_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


class SensorConfig(Section):
    """The shard gate's (plugins/mlm_airflow/sensors/shard_set.py), in the run's config so that a run can set it."""

    poke_interval_s: int = Field(30, ge=1, le=3600, description="Seconds between marker checks.")
    timeout_s: int = Field(3600, ge=1, le=604_800, description="Fail if shards are not done by then.")
    gcp_conn_id: DeploymentOnly[str | None] = Field(None, description="The sensor's GCP connection.")


class StorageConfig(Section):
    """gs:// calls of every step, task and trigger (mlm_tasks/storage.py), and TensorFlow's gs:// client."""

    timeout_s: float = Field(60, gt=0, le=600, description="Seconds a gs:// request may go silent.")


class PipelineConfig(Section):
    output_root: str = Field("out", description="Where every artifact goes: a local folder or gs://bucket/prefix.")
    compute: Literal["local", "tpu_vm"] = Field("local", description="Train here, or on a TPU VM made for the run.")
    gcp_conn_id: DeploymentOnly[str] = Field("google_cloud_default", description="GCP connection of Google clients.")
    corpus: CorpusConfig = Field(default_factory=CorpusConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    shards: ShardConfig = Field(default_factory=ShardConfig)
    dedup: DedupConfig = Field(default_factory=DedupConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    infer: InferConfig = Field(default_factory=InferConfig)
    tpu: TpuConfig = Field(default_factory=TpuConfig)
    sensor: SensorConfig = Field(default_factory=SensorConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    downstream: DownstreamConfig = Field(default_factory=DownstreamConfig)
    gate: GateConfig = Field(default_factory=GateConfig)
    publish: PublishConfig = Field(default_factory=PublishConfig)

    @model_validator(mode="after")
    def _cross_checks(self) -> PipelineConfig:
        self._model_checks()
        self._train_checks()
        self._output_checks()
        return self

    def _model_checks(self) -> None:
        """The model's shape against the data's: heads, positions, vocabulary."""
        shape = self.model.shape()  # raises on an unknown preset
        if self.model.architecture == "modernbert" and self.model.sinusoidal_init:
            raise ConfigError("model.sinusoidal_init: modernbert has no position table (RoPE); drop the setting.")
        if self.model.init_from is not None:  # the shape, positions and vocabulary are the base's: validate checks them
            if self.corpus.source == "tfrecord_shards":
                raise ConfigError(
                    "model.init_from encodes the corpus with the base model's tokenizer, but corpus.source="
                    "tfrecord_shards brings shards already encoded: use a text source, or leave model.init_from empty."
                )
            if self.compute == "tpu_vm" and self.model.init_from.startswith(("/", ".", "file://")):
                raise ConfigError(
                    f"model.init_from {self.model.init_from} is a local folder, but compute=tpu_vm trains on "
                    "a TPU VM that cannot see it: copy it to gs://bucket/prefix, or give a Hub repo id."
                )
        elif shape.hidden_size % shape.num_attention_heads:
            raise ConfigError(
                f"model.hidden_size {shape.hidden_size} is not a multiple of "
                f"num_attention_heads {shape.num_attention_heads}."
            )
        elif self.model.architecture == "modernbert" and (shape.hidden_size // shape.num_attention_heads) % 2:
            raise ConfigError("modernbert: hidden_size / num_attention_heads must be even (RoPE rotates pairs).")
        elif (
            self.shards.max_length + (offset := POSITION_OFFSET[self.model.architecture])
            > shape.max_position_embeddings
        ):
            # RoBERTa offsets positions by padding_idx + 1, so a 512-token model has 514 positions.
            raise ConfigError(
                f"max_length {self.shards.max_length} does not fit the model: preset {self.model.preset!r} has "
                f"{shape.max_position_embeddings} positions, so max_length can be at most "
                f"{shape.max_position_embeddings - offset}. Lower max_length or set model.max_position_embeddings."
            )
        elif self.tokenizer.vocab_size <= len(SPECIAL_TOKENS) + 10:
            raise ConfigError(
                f"tokenizer.vocab_size {self.tokenizer.vocab_size} leaves no room beside the "
                f"{len(SPECIAL_TOKENS)} special tokens {' '.join(SPECIAL_TOKENS)}: raise it (1000 or "
                "more for real text; the default is 8000)."
            )

    def _train_checks(self) -> None:
        """Masking, steps per call and the kept checkpoint against each other."""
        if self.train.max_predictions_per_seq > self.shards.max_length:
            raise ConfigError("train.max_predictions_per_seq cannot exceed max_length.")
        expected = self.train.mlm_probability * self.shards.max_length
        if self.train.mlm_probability > 0.15 and 0 < self.train.max_predictions_per_seq < expected:
            # Above 15% (BERT's cut is the default) fewer slots than the mean masked count mask tokens never scored.
            raise ConfigError(
                f"train.max_predictions_per_seq {self.train.max_predictions_per_seq} is below the {expected:.0f} "
                f"tokens train.mlm_probability {self.train.mlm_probability} masks in a {self.shards.max_length}-token "
                f"sequence on average: raise it to about {int(expected * 1.5)} (0 = every position)."
            )
        replace = self.train.mask_replace_prob + self.train.random_replace_prob
        if replace > 1 + 1e-9:
            raise ConfigError(
                f"train.mask_replace_prob {self.train.mask_replace_prob} + train.random_replace_prob "
                f"{self.train.random_replace_prob} is {replace:g}: they share the selected tokens, so at most 1 "
                "(BERT: 0.8 and 0.1; every selected token a <mask>: 1 and 0)."
            )
        if self.train.schedule == "wsd" and self.train.warmup_fraction + self.train.decay_fraction > 1:
            raise ConfigError(
                f"train.warmup_fraction {self.train.warmup_fraction} + train.decay_fraction "
                f"{self.train.decay_fraction} is over 1: lower one (a decay-only continuation: 0 and 1)."
            )
        if self.train.continue_run and self.model.init_from:
            raise ConfigError(
                "train.continue_run starts from a run's checkpoint and model.init_from from a base model's "
                "weights: set one of them."
            )
        if self.train.mlm_probability > 0.5:
            raise ConfigError(
                f"train.mlm_probability {self.train.mlm_probability} leaves under half the context: "
                "use 0.15-0.4 (Wettig et al. found 40% the most a base model gains from)."
            )
        if self.tokenizer.from_pretrained and (self.model.init_from or self.corpus.source == "tfrecord_shards"):
            raise ConfigError(
                "tokenizer.from_pretrained is for a new model on text: model.init_from and corpus.source="
                "tfrecord_shards bring their own tokenizer. Leave tokenizer.from_pretrained empty."
            )
        reused = self.model.init_from or self.tokenizer.from_pretrained  # validate checks a reused one's words
        if self.train.whole_word_mask and self.tokenizer.model != "unigram" and not reused:
            raise ConfigError(
                f"train.whole_word_mask needs word-initial pieces marked with ▁ (tokenizer.model=unigram); "
                f"tokenizer.model={self.tokenizer.model} has none: use unigram, or turn whole_word_mask off."
            )
        if self.model.vocab_multiple and self.model.init_from:
            raise ConfigError(
                "model.vocab_multiple pads a new model's vocabulary; with model.init_from the base's "
                "vocabulary is kept: leave model.vocab_multiple empty."
            )
        if self.train.steps_per_call != "auto" and int(self.train.steps_per_call) < 1:
            raise ConfigError(f"train.steps_per_call {self.train.steps_per_call} must be auto or at least 1.")
        if self.train.keep_checkpoint == "best" and not self.train.eval_every:
            raise ConfigError(
                "train.keep_checkpoint=best needs train.eval_every (the steps at which the "
                "validation loss picks the best): set it, e.g. train.eval_every=500."
            )

    def _output_checks(self) -> None:
        """Where the run writes and what runs it: output_root's scheme, the run's URIs, the TPU VM, the Hub repo ids."""
        scheme = paths.scheme(self.output_root)
        if scheme == "gs" and not paths.bucket_and_name(self.output_root)[0]:
            raise ConfigError(
                f"output_root {self.output_root!r} names no bucket: use gs://bucket/prefix "
                "(the bucket must exist; create it with `gcloud storage buckets create`)."
            )
        if scheme not in ("file", "gs"):
            raise ConfigError(
                f"output_root {self.output_root!r} has unsupported scheme {scheme!r}: use a "
                "local folder or gs://bucket/prefix."
            )
        for setting, value, glob in self._run_uris():
            check_safe_uri(setting, value, glob=glob)
        if self.tokenizer.revision and not self.tokenizer.from_pretrained:
            raise ConfigError(
                f"tokenizer.revision {self.tokenizer.revision!r} is set but tokenizer.from_pretrained is empty: "
                "name the Hub repo of the tokenizer, or leave tokenizer.revision empty."
            )
        if self.model.init_revision and not self.model.init_from:
            raise ConfigError(
                f"model.init_revision {self.model.init_revision!r} is set but model.init_from is empty: "
                "name the Hub repo to start from, or leave init_revision empty."
            )
        if self.compute == "tpu_vm" and scheme != "gs":
            raise ConfigError(
                "compute=tpu_vm needs output_root=gs://bucket/prefix: the TPU VM reads shards "
                "and writes checkpoints there."
            )
        if self.compute == "tpu_vm" and not self.tpu.project:
            raise ConfigError("compute=tpu_vm needs tpu.project (the Google Cloud project of the TPU VM).")
        if self.sensor.gcp_conn_id is None:
            self.sensor.gcp_conn_id = self.gcp_conn_id
        if self.compute == "tpu_vm":
            self._tpu_checks()
        if any(r and not HUB_REPO_ID.match(r) for r in (self.publish.repo_id, self.publish.tokenizer_repo_id)):
            raise ConfigError(
                f"publish.repo_id {self.publish.repo_id!r} / tokenizer_repo_id {self.publish.tokenizer_repo_id!r}: a "
                "Hub repo id is owner/name (letters, digits, '-', '_', '.'), e.g. my-org/roberta-wiki-mlm."
            )
        if self.publish.enabled and not self.publish.repo_id:
            raise ConfigError("publish.enabled needs publish.repo_id, e.g. my-org/roberta-wiki-mlm.")

    def _run_uris(self) -> list[tuple[str, str, bool]]:
        """(setting, value, may be a glob) of every place or Hub id a run may set."""
        c, p, m = self.corpus, self.publish, self.model
        named: list[tuple[str, str | None]] = [("output_root", self.output_root)]
        globs: list[tuple[str, str]] = []
        for where, s in [("corpus", c), *((f"corpus.mixture[{i}]", s) for i, s in enumerate(c.mixture))]:
            named += [(f"{where}.hf_path", s.hf_path), (f"{where}.dump_path", s.dump_path)]
            globs += [(f"{where}.local_paths[{j}]", v) for j, v in enumerate(s.local_paths)]
        named += [
            ("corpus.shards_uri", c.shards_uri),
            ("corpus.tokenizer_uri", c.tokenizer_uri),
            ("model.init_from", m.init_from),
            ("model.init_revision", m.init_revision),
            ("tokenizer.from_pretrained", self.tokenizer.from_pretrained),
            ("tokenizer.revision", self.tokenizer.revision),
            ("publish.repo_id", p.repo_id),
            ("publish.tokenizer_repo_id", p.tokenizer_repo_id),
            ("publish.releases_root", p.releases_root),
        ]
        named += [
            (f"downstream.tasks[{i}].{key}", getattr(t, key))
            for i, t in enumerate(self.downstream.tasks)
            for key in ("train_file", "validation_file", "hf_path", "hf_revision")
        ]
        return [(k, v, False) for k, v in named if v is not None] + [(k, v, True) for k, v in globs]

    def _tpu_checks(self) -> None:
        """What a TPU VM run needs to be true before the VM exists (no I/O)."""
        tpu_slices.check_runtime(self.tpu.accelerator_type, self.tpu.runtime_version)
        if self.tpu.ssh_via == "external" and not self.tpu.external_ips:
            raise ConfigError(
                "tpu.ssh_via=external needs tpu.external_ips=true (the workers get no external IP "
                "otherwise); inside the VPC use tpu.ssh_via=internal."
            )
        hours = self.train.timeout_for(self.compute, self.tpu.ttl_hours)
        if hours > self.tpu.ttl_hours:
            raise ConfigError(
                f"train.timeout_hours {hours:g} is longer than tpu.ttl_hours {self.tpu.ttl_hours:g}: the "
                "janitor would delete the TPU VM under a training that may still run. Raise "
                "tpu.ttl_hours or lower train.timeout_hours."
            )
