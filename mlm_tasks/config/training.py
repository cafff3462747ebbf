"""Model and training settings: the model's shape, the optimizer and its loop, evaluation, fill-mask."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mlm_tasks.config.section import Section
from mlm_tasks.errors import ConfigError


class ModelShape(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 514


# `tiny` runs the code path of `base` (roberta-base) in seconds per step on a CPU, and learns visibly in minutes.
PRESETS = {
    "tiny": ModelShape(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512, max_position_embeddings=130
    ),
    "small": ModelShape(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024),
    "base": ModelShape(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}


# ModernBERT's proportions (docs/configuration.md); RoPE: max_position_embeddings is the context announced.
MODERNBERT_PRESETS = {
    "tiny": ModelShape(
        hidden_size=128, num_hidden_layers=3, num_attention_heads=2, intermediate_size=192, max_position_embeddings=1024
    ),
    "small": ModelShape(
        hidden_size=256, num_hidden_layers=6, num_attention_heads=4, intermediate_size=384, max_position_embeddings=1024
    ),
    "base": ModelShape(  # answerdotai/ModernBERT-base's shape
        hidden_size=768,
        num_hidden_layers=22,
        num_attention_heads=12,
        intermediate_size=1152,
        max_position_embeddings=8192,
    ),
}
PRESETS_BY_ARCHITECTURE = {"roberta": PRESETS, "modernbert": MODERNBERT_PRESETS}
POSITION_OFFSET = {"roberta": 2, "modernbert": 0}  # RoBERTa numbers positions from padding_idx + 1


class ModelConfig(Section):
    architecture: Literal["roberta", "modernbert"] = Field(
        "roberta", description="roberta (TFRobertaForMaskedLM) or modernbert (RoPE, GeGLU, local and global attention)."
    )
    preset: str = Field(  # [*...]: a list of JSON values
        "tiny", description="Model shape: tiny, small or base.", json_schema_extra={"enum": [*sorted(PRESETS)]}
    )
    hidden_size: int | None = Field(None, ge=8, le=16_384, description="Override the preset's hidden size.")
    num_hidden_layers: int | None = Field(None, ge=1, le=128, description="Override the preset's layer count.")
    num_attention_heads: int | None = Field(None, ge=1, le=256, description="Override the preset's head count.")
    intermediate_size: int | None = Field(None, ge=8, le=65_536, description="Override the preset's FFN width.")
    max_position_embeddings: int | None = Field(None, ge=10, le=8194, description="Override positions.")
    dropout: float = Field(0.1, ge=0, lt=1, description="Hidden and attention dropout.")
    rope_theta: float | None = Field(
        None, gt=0, le=1e9, description="modernbert: the global layers' RoPE base (empty: 10,000, or the base's)."
    )
    local_attention: int = Field(128, ge=2, le=65_536, description="modernbert: the local layers' window.")
    sinusoidal_init: bool = Field(False, description="Start position embeddings from sinusoids.")
    init_from: str | None = Field(None, description="Continue from this model: Hub id or folder.")
    init_revision: str | None = Field(None, description="init_from's branch, tag or commit.")
    vocab_multiple: int | None = Field(None, ge=2, le=1024, description="Pad embedding rows to a multiple of this.")

    def shape(self) -> ModelShape:
        presets = PRESETS_BY_ARCHITECTURE[self.architecture]
        if self.preset not in presets:
            raise ConfigError(f"Unknown model preset {self.preset!r}: choose one of {sorted(presets)}.")
        overrides = {k: getattr(self, k) for k in ModelShape.model_fields if getattr(self, k) is not None}
        return presets[self.preset].model_copy(update=overrides)


class TrainConfig(Section):
    steps: int | None = Field(None, ge=1, le=100_000_000, description="Optimizer steps (empty: `epochs`).")
    budget_minutes: float | None = Field(None, gt=0, le=43_200, description="Train for this long.")
    epochs: float = Field(1.0, gt=0, le=10_000, description="Passes over train when `steps` is empty.")
    batch_size: int = Field(32, ge=1, le=65_536, description="Examples per replica per step (global = × replicas).")
    learning_rate: float = Field(1e-3, gt=0, lt=1, description="Peak AdamW learning rate.")
    warmup_fraction: float = Field(0.06, ge=0, lt=1, description="Share of steps of linear warmup.")
    schedule: Literal["linear", "one_cycle", "wsd"] = Field("linear", description="Learning rate after warmup.")
    decay_fraction: float = Field(0.2, ge=0, le=1, description="wsd: share of the steps in the final decay.")
    decay_shape: Literal["linear", "cosine", "1-sqrt"] = Field("1-sqrt", description="wsd: the decay's shape.")
    continue_run: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:+-]{1,200}$", description="Run to continue from.")
    weight_decay: float = Field(0.01, ge=0, le=1, description="AdamW weight decay (not on norms and biases).")
    adam_beta2: float = Field(0.98, gt=0, lt=1, description="AdamW beta2.")
    adam_epsilon: float = Field(1e-6, gt=0, le=1, description="AdamW epsilon.")
    clip_norm: float = Field(1.0, ge=0, le=1e6, description="Clip the summed gradient to this global norm (0: off).")
    mlm_probability: float = Field(0.15, gt=0, lt=1, description="Share of tokens selected for masking.")
    mask_replace_prob: float = Field(0.8, ge=0, le=1, description="Share of the selected tokens shown as <mask>.")
    random_replace_prob: float = Field(0.1, ge=0, le=1, description="Share of selected tokens shown as random ones.")
    whole_word_mask: bool = Field(False, description="Mask whole words, not single tokens.")
    max_predictions_per_seq: int = Field(32, ge=0, le=8192, description="LM head slots per sequence (0: all).")
    checkpoint_every: int = Field(100, ge=1, le=100_000_000, description="Steps between checkpoints.")
    log_every: int = Field(25, ge=1, le=100_000_000, description="Steps between progress lines in the log.")
    steps_per_call: Literal["auto"] | int = Field("auto", description="Steps per compiled call (auto by device).")
    eval_every: int | None = Field(None, ge=1, le=100_000_000, description="Steps between validations (empty: none).")
    eval_batches: int = Field(8, ge=1, le=1_000_000, description="Validation batches per eval_every.")
    keep_checkpoint: Literal["last", "best"] = Field("last", description="The model the run keeps: last or best.")
    xla: Literal["auto", "on", "off"] = Field("auto", description="XLA-compile the step (auto: on for TPU/GPU).")
    mixed_precision: Literal["auto", "off", "bf16"] = Field("auto", description="Compute dtype.")
    device: Literal["auto", "tpu", "gpu", "cpu"] = Field("auto", description="Accelerator to train on.")
    strategy: Literal["auto", "mirrored"] = Field("auto", description="tf.distribute strategy.")
    shuffle_buffer: int = Field(10_000, ge=1, le=1_000_000, description="Examples in the tf.data shuffle buffer.")
    seed: int = Field(42, description="Seed for init, shuffling and masking.")
    heartbeat_s: float = Field(30.0, ge=1, le=3600, description="Seconds between status record rewrites.")
    stall_minutes: float = Field(30.0, gt=0, le=1440, description="A trainer this long silent is stalled.")
    follow_poll_s: float = Field(30.0, gt=0, le=3600, description="TPU VM: seconds between trainer checks.")
    timeout_hours: float | None = Field(None, gt=0, le=720, description="The training's deadline.")
    max_restarts: int = Field(10, ge=0, le=1000, description="TPU VM: node losses handled in one try.")
    check_in_minutes: float = Field(60.0, gt=0, le=1440, description="TPU VM: the train trigger's timeout.")

    @property
    def progress_log_s(self) -> float:
        """Seconds between a TPU VM trainer's progress lines in the log: every 6 checks (derived: no run turns it)."""
        return self.follow_poll_s * 6

    def timeout_for(self, compute: str, ttl_hours: float) -> float:
        """Hours the training may run (on a TPU VM it must end before the VM's TTL)."""
        if self.timeout_hours is not None:
            return self.timeout_hours
        return ttl_hours if compute == "tpu_vm" else 72.0


class EvalConfig(Section):
    split: Literal["validation", "test"] = Field("validation", description="Split to evaluate on.")
    batch_size: int = Field(64, ge=1, le=65_536, description="Examples per evaluation batch.")
    max_batches: int | None = Field(None, ge=1, le=100_000_000, description="Evaluation batches (empty: all).")


DEFAULT_PROBES = [
    "The war ended in <mask>.",
    "He was born in <mask>.",
    "Alabama is a <mask> in the United States.",
    "The city is located on the <mask> of the river.",
    "Anarchism is a political <mask>.",
]


class InferConfig(Section):
    probes: list[str] = Field(default_factory=lambda: list(DEFAULT_PROBES), description="Fill-mask probes, one <mask>.")
    top_k: int = Field(5, ge=1, le=50, description="Predictions kept per probe.")
