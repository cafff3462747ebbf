"""What the steps return: one TypedDict per result, so the types say what a task hands on.

TypedDicts, not dataclasses: a result travels as plain JSON (the CLI's output, Airflow's XCom, the REST
API that outside clients read), and a TypedDict is exactly that JSON, with no conversion on either side.
A leaf module: it imports nothing of mlm_tasks at run time, so every layer may use it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:  # the data summary moves here, under "The shard set", in the shard-set change
    from mlm_tasks.data.shard_set import DataSummary


# Training and after

# validate: the validated config, `PipelineConfig.model_dump(mode="json")`; every later task's `config`.
ValidatedConfig = dict[str, Any]


class TrainSummary(TypedDict):
    """train: also runs/<run>/train/summary.json, written last (training is complete when it exists)."""
    steps: int
    resumed_from_step: int
    global_batch: int                 # batch_size per replica x replicas
    replicas: int
    device: str                       # cpu, gpu or tpu
    xla: bool
    precision: str                    # off or bf16
    tokens_per_s: float | None        # None: too few steps to time the steady state
    first_loss: float | None
    last_loss: float | None
    elapsed_s: float
    data_fingerprint: str
    parameters: int
    tensorflow: str
    python: str


class RemoteTrain(TypedDict):
    """The train task with `compute: tpu_vm`: where it ran; the TrainSummary stays in the run's folder."""
    node: str
    workers: int


class EvalMetrics(TypedDict):
    """evaluate: also runs/<run>/eval/metrics.json (what the gate and the model card read)."""
    split: str
    loss: float
    perplexity: float
    accuracy: float
    accuracy_at_mask_token: float     # where the input shows <mask> (those cannot be copied)
    masked_tokens: int
    untrained_loss: float             # the same shape and seed, not trained, on the same batches
    untrained_accuracy: float
    baseline_accuracy: float          # always predicting the most frequent token of the train split
    baseline_token: str
    data_fingerprint: str


class Prediction(TypedDict):
    token_str: str
    score: float
    sequence: str


class ProbePredictions(TypedDict):
    """fill_mask returns a list of these (also runs/<run>/infer/predictions.json), one per probe."""
    probe: str
    predictions: list[Prediction]     # the top-k, best first


class KeyMetrics(TypedDict):
    """report: what the run report shows, small; None where that artifact is not there yet."""
    report_uri: str
    plots: dict[str, str]             # "loss", "learning_rate": the PNG's URI
    missing: list[str]                # the pieces the report names as not available
    history_points: int
    steps: int | None
    first_loss: float | None
    last_loss: float | None
    tokens_per_s: float | None
    data_fingerprint: str | None
    eval_loss: float | None
    perplexity: float | None
    accuracy: float | None
    baseline_accuracy: float | None
    untrained_accuracy: float | None


class GateDecision(TypedDict):
    """gate: publish reads `passed` (and logs `reasons` when it skips)."""
    passed: bool
    reasons: list[str]                # one sentence per check, failed ones first


class HubCommit(TypedDict):
    """A commit pushed to the Hugging Face Hub."""
    repo_id: str
    commit_url: str
    commit_oid: str
    files: list[str]                  # the uploaded files, relative to the repo root


class ModelCommit(HubCommit):
    """publish: also runs/<run>/publish/published.json, its completion marker."""
    private: bool
    run_id: str


class TokenizerCommit(HubCommit):
    """publish_tokenizer."""
    fingerprint: str                  # the shard set whose tokenizer it is


class RunSummary(TypedDict):
    """summary: also runs/<run>/summary.txt (the text)."""
    text: str
    train: TrainSummary | dict[str, Any]     # {} when the run has not trained
    metrics: EvalMetrics | dict[str, Any]    # {} when it has not been evaluated
    data: DataSummary
    model_uri: str
