"""Release settings: downstream fine-tuning, the publishing gate, and publishing to the Hub."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mlm_tasks.config.section import DeploymentOnly, Section
from mlm_tasks.errors import ConfigError


class GateConfig(Section):
    max_eval_loss: float | None = Field(None, gt=0, description="Publish only if eval loss is at most this.")
    min_accuracy: float | None = Field(None, ge=0, le=1, description="Least masked accuracy to publish.")
    require_better_than_published: bool = Field(True, description="No worse than the last published.")


TASK_FILE_TYPES = (".csv", ".jsonl", ".parquet")


class DownstreamTask(Section):
    """One text-classification task the trained encoder is fine-tuned on (mlm_tasks/downstream/)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="What the table calls it, e.g. sst2.")
    source: Literal["files", "hf_dataset", "held_out_article", "held_out_word_order"] = Field(
        "files", description="Where examples come from."
    )
    train_file: str | None = Field(None, description="source=files: the training examples.")
    validation_file: str | None = Field(None, description="source=files: the examples scored.")
    hf_path: str | None = Field(None, description="source=hf_dataset: `datasets` path, e.g. nyu-mll/glue.")
    hf_name: str | None = Field(None, description="source=hf_dataset: its config, e.g. sst2, mrpc, rte.")
    hf_revision: str | None = Field(None, description="source=hf_dataset: a commit or tag (pins the data).")
    train_split: str = Field("train", description="source=hf_dataset: the split fine-tuned on.")
    validation_split: str = Field("validation", description="source=hf_dataset: the split scored.")
    text_columns: list[str] = Field(default_factory=list, max_length=2, description="One column, or two for pairs.")
    label_column: str = Field("label", description="Column of the class: integers from 0, or names.")
    metric: Literal["accuracy", "f1", "macro_f1", "mcc", "pearson", "spearman"] = Field("accuracy", description="Score")
    min_score: float | None = Field(None, ge=-1, le=1, description="The gate refuses a mean score below this.")
    max_train_examples: int | None = Field(None, ge=1, le=10_000_000, description="Fine-tune on at most this many.")
    max_eval_examples: int | None = Field(None, ge=1, le=10_000_000, description="Score at most this many.")

    @model_validator(mode="after")
    def _source_settings(self) -> DownstreamTask:
        if self.source == "files":
            for setting in ("train_file", "validation_file"):
                value = getattr(self, setting)
                if not value or not value.endswith(TASK_FILE_TYPES):
                    raise ConfigError(
                        f"downstream task {self.name!r}: source=files needs {setting}, a "
                        f"{'/'.join(TASK_FILE_TYPES)} file (local or gs://), got {value!r}."
                    )
        elif self.source == "hf_dataset" and not self.hf_path:
            raise ConfigError(
                f"downstream task {self.name!r}: source=hf_dataset needs hf_path (and hf_name), "
                "e.g. nyu-mll/glue and sst2."
            )
        return self


class DownstreamConfig(Section):
    tasks: list[DownstreamTask] = Field(default_factory=list, description="Tasks to fine-tune on (empty: none).")
    seeds: int = Field(3, ge=1, le=20, description="Fine-tuning runs per task and model.")
    steps: int = Field(100, ge=1, le=1_000_000, description="Steps of each fine-tuning run.")
    batch_size: int = Field(16, ge=1, le=4096, description="Examples per fine-tuning step.")
    learning_rate: float = Field(3e-4, gt=0, lt=1, description="Peak AdamW learning rate (10% warmup, linear decay).")
    max_length: int = Field(128, ge=8, le=8192, description="Tokens per example.")
    random_init: bool = Field(True, description="Also from random weights (the baseline).")
    min_scores: dict[str, float] = Field(default_factory=dict, description="Least mean score per task name.")
    max_regression: float = Field(0.0, ge=0, le=1, description="How far below the published score a task may fall.")
    check_contamination: bool = Field(True, description="Look for scored examples in train.")
    max_half_width: float = Field(0.1, gt=0, le=1, description="Flag a wider 95% interval.")

    @model_validator(mode="after")
    def _names(self) -> DownstreamConfig:
        names = [t.name for t in self.tasks]
        if len(set(names)) != len(names):
            raise ConfigError(f"downstream.tasks repeat a name ({names}): give each task its own.")
        unknown = sorted(set(self.min_scores) - set(names))
        if unknown:
            raise ConfigError(f"downstream.min_scores names {unknown}, not tasks of downstream.tasks ({names}).")
        if any(not -1 <= v <= 1 for v in self.min_scores.values()):
            raise ConfigError(
                "downstream.min_scores are scores between -1 and 1 (accuracy and F1 from 0, mcc and "
                "correlations from -1)."
            )
        return self

    def min_score(self, task: DownstreamTask) -> float | None:
        return task.min_score if task.min_score is not None else self.min_scores.get(task.name)


class PublishConfig(Section):
    enabled: bool = Field(False, description="Push the model to the Hugging Face Hub.")
    repo_id: str | None = Field(None, description="Hub model repo id, e.g. my-org/roberta-wiki-mlm.")
    tokenizer_repo_id: str | None = Field(None, description="Push the tokenizer alone to this repo after training it.")
    private: bool = Field(True, description="Create the Hub repo as private.")
    hf_conn_id: DeploymentOnly[str] = Field("huggingface_default", description="Connection: password = Hub token.")
    sync_checkpoints: bool = Field(False, description="Push checkpoints (revisions step-N) while training.")
    request_timeout_s: float = Field(120, gt=0, le=3600, description="Seconds a Hub request may go silent.")
    license: str = Field("cc-by-sa-4.0", description="License in the model card (Wikipedia text is CC BY-SA 4.0).")
    require_approval: bool = Field(False, description="A person approves the release.")
    approval_timeout_hours: float = Field(72, gt=0, le=720, description="Hours approval waits (then: rejected).")
    releases_root: DeploymentOnly[str | None] = Field(None, description="Where published models' metrics are kept.")
