"""What the steps return: one TypedDict per result, exactly the JSON a task hands on (CLI output, XCom).
A leaf module: it imports nothing of mlm_tasks, so every layer may use it."""

from __future__ import annotations

from typing import Any, TypedDict


class Partition(TypedDict):
    """One write_shards task's share of the corpus."""

    fingerprint: str
    part: int
    num_parts: int


class ShardPlan(TypedDict):
    """What plan_shards decided; scan_partition, find_duplicates and write_shards are mapped over `partitions`."""

    fingerprint: str
    cache_hit: bool  # the complete set was there before this run
    corpus_fingerprint: str | None  # the plan's, so the merge does not hash a large corpus again
    partitions: list[Partition]  # empty: nothing to write (the set is complete, or shards were brought)


class ScannedPartition(Partition):
    rows: dict[str, int]
    dropped_by_filters: int


class WrittenPartition(Partition):
    records: dict[str, int]
    rows: dict[str, int]


class DataSummary(TypedDict):
    """What merge_shards returns and later steps read: small, JSON-serialisable, no secrets."""

    fingerprint: str
    data_root: str
    tokenizer_uri: str
    manifest_uri: str
    success_uri: str
    cache_hit: bool  # the complete set was there before this run
    written_here: bool  # this run's merge_shards published it
    vocab_size: int
    max_length: int
    records: dict[str, int]
    tokens: dict[str, int]
    shards: dict[str, int]
    base_model: dict | None  # model.init_from: init_from, revision (commit or sha256 of its files), shape
    corpus: dict


class RunCheck(TypedDict):
    """check_run: what it found; nothing is written."""

    fingerprint: str
    train_records: int
    steps: int  # at one replica; train() plans again with the global batch of its devices
    plan: list[str]  # tokens, FLOPs; on a TPU VM the estimated hours and cost (training.plan.plan_lines)


# validate: the validated config, `PipelineConfig.model_dump(mode="json")`; every later task's `config`.
ValidatedConfig = dict[str, Any]


class TrainSummary(TypedDict):
    """train: also runs/<run>/train/summary.json, written last (training is complete when it exists)."""

    steps: int
    resumed_from_step: int
    global_batch: int  # batch_size per replica x replicas
    replicas: int
    device: str  # cpu, gpu or tpu
    xla: bool
    precision: str  # off or bf16
    precision_reason: str  # set by the config, or train.mixed_precision=auto's rule
    steps_per_call: int  # optimizer steps per call of the compiled loop
    tokens_per_s: float | None  # None: too few steps to time the steady state
    first_loss: float | None
    last_loss: float | None
    elapsed_s: float
    data_fingerprint: str
    val_loss: float | None  # the last validation loss (train.eval_every; None without it)
    best_step: int | None  # the step of the lowest validation loss
    best_val_loss: float | None
    kept: str  # the saved model's step: last, or best (train.keep_checkpoint)
    flops_per_token: float  # training FLOPs per token (mlm_tasks/model/flops.py)
    peak_flops: float | None  # the devices' dense peak in the run's precision (None: unknown)
    mfu: float | None  # model FLOPs utilisation at the steady-state tokens/s
    mfu_of: str  # "MFU 31.0% of 4 × 275 TFLOP/s bf16 (TPU v4)"
    accelerator_hours: float | None  # TPU: the training's hours (the VM's start and the other steps not in it)
    cost_usd: float | None  # TPU: those hours at the run's price
    cost_basis: str | None  # the slice, Spot or on-demand, and where the price came from
    parameters: int
    tensorflow: str
    python: str


class Restart(TypedDict):
    """A node loss the train task handled inside its try: one entry of runs/<run>/train/restarts.json."""

    cause: str  # what the follow saw: the node's state, or the trainer gone with it
    at_utc: str
    node: str
    try_number: int
    step: int  # the last step the lost trainer recorded
    resumed_from: int | None  # the step the next trainer started from (its last checkpoint); None until it starts
    steps_lost: int | None  # step - resumed_from: trained again


class _TrainStatusRestarts(TypedDict, total=False):  # NotRequired is Python 3.11; the VM has 3.10
    restarts: list[Restart]  # restarts.json as of this trainer's start (in a record written before them: none)


class TrainStatus(_TrainStatusRestarts):
    """The trainer's status record, runs/<run>/train/status.json (mlm_tasks/job/status.py)."""

    state: str  # running, done, preempted (exit 75: resume from its step) or failed
    step: int  # the last step finished
    total_steps: int
    last_loss: float | None
    tokens_per_s: float | None
    eta_s: float | None
    heartbeat: float  # unix time of the last rewrite: the trainer's process was alive then
    heartbeat_utc: str
    step_time: float  # unix time the step last advanced (or training started)
    try_number: int | None  # the Airflow try that started this trainer (None: the CLI)
    host: str
    pid: int
    starts: int  # trainers started for this run so far, this one included
    exit_code: int | None  # None while running; 0 done; 2 no retry can fix it; 1 any other failure
    error: str | None


class TrainJob(TypedDict):
    """The handle of a trainer started detached on a TPU VM, kept in the train task's state store for a retry."""

    node: str
    node_created: float | None  # the node's createTime: a node replaced under the same name (and address) differs
    host: str  # worker 0's address, as dialled
    worker: int
    pid: int  # also its process group id (setsid)
    try_number: int  # the Airflow try that started it (MLM_TRY_NUMBER)
    log: str  # its output, relative to tpu.workdir
    workdir: str
    run_id: str
    started_at: float  # unix time on the Airflow side
    starts_before: int  # `starts` in the status record before it started: its record has more


class RunRow(TypedDict):
    """One run in the comparison of every run under an output_root."""

    run: str  # its folder under runs/
    data_fingerprint: str | None
    base_model: str | None  # model.init_from, None: random init
    steps: int | None
    tokens: int | None  # tokens seen: steps x global batch x sequence length
    val_loss: float | None  # last validation loss during training (train.eval_every)
    best_val_loss: float | None
    best_step: int | None
    eval_loss: float | None  # the evaluate step's
    downstream: dict[str, float]  # task -> mean score
    downstream_interval: dict[str, list[float]]  # task -> 95% interval [lo, hi] (runs that recorded one)
    wall_time_s: float | None
    cost_usd: float | None  # what the run's accelerator cost, when recorded
    val_curve: list[list[float]]  # [tokens seen, validation loss] per validation


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
    accuracy_at_mask_token: float  # where the input shows <mask> (those cannot be copied)
    masked_tokens: int
    untrained_loss: float  # the same shape and seed, not trained, on the same batches
    untrained_accuracy: float
    baseline_accuracy: float  # always predicting the most frequent token of the train split
    baseline_token: str
    data_fingerprint: str


class DownstreamRuns(TypedDict):
    """One model's fine-tuning runs on one task: the task's metric over the seeds, and each run."""

    mean: float
    std: float  # sample standard deviation over the seeds (0 for one seed)
    min: float
    max: float
    interval: list[float]  # [lo, hi]: 95% bootstrap interval of the mean over seeds and examples
    runs: list[dict[str, Any]]  # per seed: seed, every metric that applies, final_loss, elapsed_s, predictions


class DownstreamTaskScores(TypedDict):
    name: str
    source: str  # files, hf_dataset, held_out_article or held_out_word_order
    metric: str  # accuracy, f1, macro_f1, mcc, pearson or spearman: what mean/std, the gate and min_score use
    labels: list[str]  # the class names (empty for a regression)
    pair: bool
    regression: bool
    examples: dict[str, int]  # train, validation
    validation_fingerprint: str  # the scored examples (uncertainty.examples_fingerprint): pairs two runs' scores
    validation_labels: list[Any]
    seeds: list[int]
    budget: dict[str, Any]  # steps, batch_size, learning_rate, max_length, seeds
    min_score: float | None
    pretrained: DownstreamRuns  # from the run's trained encoder
    random_init: DownstreamRuns | None  # the same budget from random weights of the same shape
    warnings: list[str]  # why the score is weak evidence (scores.flags): shown by the report and the approval page
    contamination: dict[str, Any] | None  # ngram, checked, found, examples: scored text in the pretraining data


class DownstreamResult(TypedDict):
    """downstream: also runs/<run>/eval/downstream.json (what the gate, the report and the card read)."""

    tasks: list[DownstreamTaskScores]
    skipped: list[dict[str, str]]  # name, reason: tasks that do not apply to this run (no score)
    model: str  # the model fine-tuned (runs/<run>/model)
    settings: dict[str, Any]  # downstream.* as run: a rerun with the same settings reuses the file
    elapsed_s: float


class Prediction(TypedDict):
    token_str: str
    score: float
    sequence: str


class ProbePredictions(TypedDict):
    """fill_mask returns a list of these (also runs/<run>/infer/predictions.json), one per probe."""

    probe: str
    predictions: list[Prediction]  # the top-k, best first


class KeyMetrics(TypedDict):
    """report: what the run report shows, small; None where that artifact is not there yet."""

    report_uri: str
    plots: dict[str, str]  # "loss", "learning_rate": the PNG's URI
    missing: list[str]  # the pieces the report names as not available
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
    downstream: dict[str, float] | None  # task name: mean score of the trained encoder (None: not run)


class GateDecision(TypedDict):
    """gate: publish reads `passed` (and logs `reasons` when it skips)."""

    passed: bool
    reasons: list[str]  # one sentence per check, failed ones first
    warnings: list[str]  # what makes the evidence weak (too few scored examples): shown, not decisive


class HubCommit(TypedDict):
    repo_id: str
    commit_url: str
    commit_oid: str
    files: list[str]  # the uploaded files, relative to the repo root


class ModelCommit(HubCommit):
    """publish: also runs/<run>/publish/published.json, its completion marker."""

    private: bool
    run_id: str


class TokenizerCommit(HubCommit):
    """publish_tokenizer."""

    fingerprint: str  # the shard set whose tokenizer it is


class RunSummary(TypedDict):
    """summary: also runs/<run>/summary.txt (the text)."""

    text: str
    train: TrainSummary | dict[str, Any]  # {} when the run has not trained
    metrics: EvalMetrics | dict[str, Any]  # {} when it has not been evaluated
    data: DataSummary
    model_uri: str
