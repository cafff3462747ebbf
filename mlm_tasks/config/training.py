"""Model and training settings: the model's shape, the optimizer and its loop, evaluation, fill-mask."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mlm_tasks.config.section import Section
from mlm_tasks.errors import ConfigError
from mlm_tasks.presets import PRESETS, ModelShape


class ModelConfig(Section):
    preset: str = Field(
        "tiny",
        description="Model shape: tiny (CPU minutes), small, base (roberta-base).",
        json_schema_extra={"enum": [*sorted(PRESETS)]},
    )  # [*...]: a list of JSON values
    hidden_size: int | None = Field(None, ge=8, le=16_384, description="Override the preset's hidden size.")
    num_hidden_layers: int | None = Field(None, ge=1, le=128, description="Override the preset's layer count.")
    num_attention_heads: int | None = Field(None, ge=1, le=256, description="Override the preset's head count.")
    intermediate_size: int | None = Field(None, ge=8, le=65_536, description="Override the preset's FFN width.")
    max_position_embeddings: int | None = Field(
        None, ge=10, le=8194, description="Override positions (RoBERTa needs max_length + 2)."
    )
    dropout: float = Field(0.1, ge=0, lt=1, description="Hidden and attention dropout.")
    sinusoidal_init: bool = Field(
        False,
        description="Start learned position embeddings from sinusoids "
        "(small models then learn context in far fewer steps).",
    )
    init_from: str | None = Field(
        None,
        description="Continue pretraining from this model instead of random "
        "weights: a Hub repo id (owner/name), a gs:// folder or a local folder of a "
        "transformers RoBERTa masked LM (TensorFlow or PyTorch weights). Its tokenizer "
        "encodes the shards (none is trained) and its config.json gives the shape: "
        "preset and tokenizer.vocab_size are not used, and a conflicting shape setting "
        "is refused.",
    )
    init_revision: str | None = Field(
        None,
        description="With a Hub init_from: the branch, tag or commit to start "
        "from (empty: main); resolved to its commit once per shard set.",
    )
    vocab_multiple: int | None = Field(
        None,
        ge=2,
        le=1024,
        description="Pad the model's embedding rows (and LM "
        "head) to a multiple of this, e.g. 128 for the matrix units' tiles; the "
        "tokenizer stays, the extra rows are never a label (empty: the tokenizer's "
        "size). Not with init_from: the base's vocabulary is kept.",
    )

    def shape(self) -> ModelShape:
        if self.preset not in PRESETS:
            raise ConfigError(f"Unknown model preset {self.preset!r}: choose one of {sorted(PRESETS)}.")
        overrides = {
            k: v
            for k, v in self.model_dump().items()
            if k not in ("preset", "dropout", "sinusoidal_init", "vocab_multiple") and v is not None
        }
        return PRESETS[self.preset].model_copy(update=overrides)


class TrainConfig(Section):
    steps: int | None = Field(
        None,
        ge=1,
        le=100_000_000,
        description="Optimizer steps; empty = `epochs` over the train shards. With "
        "train.budget_minutes, the most it trains.",
    )
    budget_minutes: float | None = Field(
        None,
        gt=0,
        le=43_200,
        description="Train for this long, a deadline from the run's first start: the step count is "
        "planned from the run's own measured step time and re-planned as it trains (the schedule follows), and "
        "the run stops at a step boundary with its checkpoint; train.steps, when set, caps it.",
    )
    epochs: float = Field(
        1.0,
        gt=0,
        le=10_000,
        description="Passes over the train split when `steps` is empty (a mixture: its total train records, "
        "drawn by weight).",
    )
    batch_size: int = Field(32, ge=1, le=65_536, description="Examples per replica per step (global = × replicas).")
    learning_rate: float = Field(1e-3, gt=0, lt=1, description="Peak AdamW learning rate.")
    warmup_fraction: float = Field(0.06, ge=0, lt=1, description="Share of steps of linear warmup.")
    schedule: Literal["linear", "one_cycle"] = Field(
        "linear",
        description="Learning rate after warmup: linear decay to 0 at the last step, or one_cycle "
        "(cosine decay to 0 at the last step: longer near the peak; Cramming's budget-tied one-cycle). Both are tied "
        "to the run's step count, so a time-budgeted run anneals on time.",
    )
    weight_decay: float = Field(0.01, ge=0, le=1, description="AdamW weight decay (not on norms and biases).")
    adam_beta2: float = Field(
        0.98, gt=0, lt=1, description="AdamW beta2 (RoBERTa's 0.98 is steadier than 0.999 at high LR)."
    )
    adam_epsilon: float = Field(1e-6, gt=0, le=1, description="AdamW epsilon.")
    clip_norm: float = Field(
        1.0, ge=0, le=1e6, description="Clip the step's gradient (summed over replicas) to this global norm (0: off)."
    )
    mlm_probability: float = Field(0.15, gt=0, lt=1, description="Share of tokens selected for masking.")
    mask_replace_prob: float = Field(0.8, ge=0, le=1, description="Share of the selected tokens shown as <mask>.")
    random_replace_prob: float = Field(
        0.1, ge=0, le=1, description="Share of the selected tokens shown as a random token (the rest: unchanged)."
    )
    whole_word_mask: bool = Field(
        False,
        description="Select whole words for masking (every piece of a drawn word; the same expected share "
        "of tokens, mlm_probability) instead of single tokens. Needs a Metaspace tokenizer, whose word-initial "
        "pieces start with ▁ (this project's Unigram); validation masks stay token-level.",
    )
    max_predictions_per_seq: int = Field(
        32,
        ge=0,
        le=8192,
        description="LM head runs only at this many masked "
        "positions per sequence (0 = every position, the plain way); without "
        "XLA off a TPU, at exactly the masked ones, at most this many a sequence.",
    )
    checkpoint_every: int = Field(
        100, ge=1, le=100_000_000, description="Steps between checkpoints (what a retry loses at most)."
    )
    log_every: int = Field(25, ge=1, le=100_000_000, description="Steps between progress lines in the log.")
    steps_per_call: Literal["auto"] | int = Field(
        "auto",
        description="Optimizer steps per call of the compiled training loop (one host round trip per call; "
        "auto: 1 on CPU, 16 on GPU, 64 on TPU). Checkpoints, validation and the loop's hooks land on a call's last "
        "step; the losses are the same whatever it is.",
    )
    eval_every: int | None = Field(
        None,
        ge=1,
        le=100_000_000,
        description="Steps between validation losses during training "
        "(empty: none). Fixed 15% masking on eval.split, so losses compare across runs; "
        "into the history, TensorBoard (val/loss) and the report's loss curve.",
    )
    eval_batches: int = Field(
        8, ge=1, le=1_000_000, description="Validation batches (of eval.batch_size) per train.eval_every."
    )
    keep_checkpoint: Literal["last", "best"] = Field(
        "last",
        description="The model the run saves, evaluates and publishes: the last step's, or the one "
        "with the lowest validation loss (best: needs train.eval_every).",
    )
    xla: Literal["auto", "on", "off"] = Field("auto", description="XLA-compile the step (auto: on for TPU/GPU).")
    mixed_precision: Literal["auto", "off", "bf16"] = Field(
        "auto",
        description="Compute dtype (auto: bf16 on TPU and GPU, and on a CPU with bf16 units, AMX or AVX512-BF16).",
    )
    device: Literal["auto", "tpu", "gpu", "cpu"] = Field(
        "auto", description="Accelerator to train on (auto: TPU if this host has one, else GPU, else CPU)."
    )
    strategy: Literal["auto", "mirrored"] = Field(
        "auto",
        description="tf.distribute strategy (auto: TPU, Mirrored on several GPUs, else none; mirrored: "
        "MirroredStrategy on CPU/GPU even for one device, the TPU's strategy.run path, for tests).",
    )
    shuffle_buffer: int = Field(10_000, ge=1, le=1_000_000, description="Examples in the tf.data shuffle buffer.")
    seed: int = Field(42, description="Seed for init, shuffling and masking.")
    heartbeat_s: float = Field(
        30.0,
        ge=1,
        le=3600,
        description="Seconds between rewrites of the trainer's status record "
        "(runs/<run>/train/status.json) while it runs.",
    )
    stall_minutes: float = Field(
        30.0,
        gt=0,
        le=1440,
        description="A trainer whose status has no heartbeat, or no new step, "
        "for this long is stalled: its try fails (and is retried) and it is stopped. "
        "Longer than the first step's XLA compilation.",
    )
    follow_poll_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="On a TPU VM: seconds between the checks of the detached "
        "trainer by the train task's trigger (status record, and `kill -0` over SSH).",
    )
    progress_log_s: float = Field(
        180.0,
        gt=0,
        le=86_400,
        description="On a TPU VM: seconds between progress lines (step, loss, tokens/s, ETA) in the train task's log.",
    )
    timeout_hours: float | None = Field(
        None,
        gt=0,
        le=720,
        description="The training's deadline (empty: tpu.ttl_hours on a TPU VM, 72 h locally): locally the "
        "train task's execution_timeout; on a TPU VM counted from the task's first start, across its check-ins, "
        "restarts and retries, and at most tpu.ttl_hours.",
    )
    max_restarts: int = Field(
        10,
        ge=0,
        le=1000,
        description="On a TPU VM: node losses (a preemption, a deleted node) the train task handles inside its "
        "try, each with a new node and a new trainer from the last checkpoint; one more fails the try "
        "(Airflow's retries are for errors).",
    )
    check_in_minutes: float = Field(
        60.0,
        gt=0,
        le=1440,
        description="On a TPU VM: the train task's trigger timeout. At it the task checks the deadline "
        "(train.timeout_hours) on a worker, reattaches to the trainer and defers again, in the same try.",
    )

    def timeout_for(self, compute: str, ttl_hours: float) -> float:
        """Hours the training may run (on a TPU VM it must end before the VM's TTL)."""
        if self.timeout_hours is not None:
            return self.timeout_hours
        return ttl_hours if compute == "tpu_vm" else 72.0


class EvalConfig(Section):
    split: Literal["validation", "test"] = Field("validation", description="Split to evaluate on.")
    batch_size: int = Field(64, ge=1, le=65_536, description="Examples per evaluation batch.")
    max_batches: int | None = Field(
        None, ge=1, le=100_000_000, description="Cap on evaluation batches (empty = whole split)."
    )


DEFAULT_PROBES = [
    "The war ended in <mask>.",
    "He was born in <mask>.",
    "Alabama is a <mask> in the United States.",
    "The city is located on the <mask> of the river.",
    "Anarchism is a political <mask>.",
]


class InferConfig(Section):
    probes: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PROBES), description="Fill-mask probe sentences, each with one <mask>."
    )
    top_k: int = Field(5, ge=1, le=50, description="Predictions kept per probe.")
