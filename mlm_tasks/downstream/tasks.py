"""Where a downstream task's examples come from: CSV/JSONL/parquet files (local or gs://), a `datasets` dataset,
or the held-out passages of held_out.py. Columns, labels and limits: docs/configuration.md.

    task = load_task(task_cfg, cfg.corpus)     # TaskData: train and validation Examples, the label names
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

from mlm_tasks import storage
from mlm_tasks.config import CorpusConfig, DownstreamTask
from mlm_tasks.downstream.examples import Examples, TaskData, sample
from mlm_tasks.downstream.held_out import HELD_OUT_SOURCES, held_out_task
from mlm_tasks.downstream.metrics import REGRESSION_METRICS
from mlm_tasks.errors import ConfigError

GLUE_COLUMNS = (["sentence"], ["sentence1", "sentence2"])


def _read_file(uri: str) -> list[dict[str, Any]]:
    """The rows of a CSV (with a header), JSONL or parquet file, local or gs://."""
    if not storage.exists(uri):
        raise ConfigError(
            f"Downstream task file {uri} does not exist: check the task's train_file and validation_file."
        )
    data = storage.read_bytes(uri)
    if uri.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(io.BytesIO(data)).to_pylist()
    text = data.decode("utf-8")
    if uri.endswith(".csv"):
        return list(csv.DictReader(io.StringIO(text)))
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise ConfigError(f"{uri} line {n} is not a JSON object: fix the line (one object per line).") from None
    return rows


def _load_split(task: DownstreamTask, split: str) -> tuple[list[dict[str, Any]], list[str] | None]:
    """A `datasets` split as rows, and its label names when the label column is a ClassLabel (GLUE's is)."""
    import datasets

    try:
        ds = datasets.load_dataset(task.hf_path, task.hf_name, split=split, revision=task.hf_revision)
    except ValueError as err:  # an unknown split or config
        raise ConfigError(
            f"downstream task {task.name!r}: {task.hf_path} ({task.hf_name}) has no split {split!r} "
            f"or config ({err}). Check hf_name, train_split and validation_split."
        ) from None
    feature = ds.features.get(task.label_column)
    return ds.to_list(), list(feature.names) if isinstance(feature, datasets.ClassLabel) else None


def _columns(task: DownstreamTask, row: Mapping[str, Any], where: str) -> list[str]:
    columns = task.text_columns or next((c for c in reversed(GLUE_COLUMNS) if all(k in row for k in c)), [])
    missing = [c for c in [*columns, task.label_column] if c not in row]
    if not columns or missing:
        raise ConfigError(
            f"downstream task {task.name!r}: {where} has columns {sorted(row)}, not "
            f"{columns or 'sentence, or sentence1 + sentence2'} and {task.label_column!r}: set the "
            "task's text_columns and label_column."
        )
    return columns


def _examples(rows: Sequence[Mapping[str, Any]], columns: list[str], labels: list[Any]) -> Examples:
    return Examples(
        [str(r[columns[0]]) for r in rows], [str(r[columns[1]]) for r in rows] if len(columns) == 2 else None, labels
    )


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def sampled(task: DownstreamTask, data: TaskData) -> TaskData:
    """The task with max_train_examples and max_eval_examples drawn (seeded, stratified by class), checked for
    what fine-tuning and scoring need: two classes to train on, every scored class among them."""
    stratify = not data.regression
    train = sample(data.train, task.max_train_examples, stratify)
    validation = sample(data.validation, task.max_eval_examples, stratify)
    if stratify:
        shown, scored = set(train.labels), set(validation.labels)
        asked = {"max_train_examples": task.max_train_examples, "max_eval_examples": task.max_eval_examples}
        limits = ", ".join(f"{k}={v}" for k, v in asked.items() if v) or "no limits"
        if len(shown) < 2 or scored - shown:
            raise ConfigError(
                f"downstream task {task.name!r}: after sampling ({limits}) the training "
                f"examples hold {len(shown)} class(es) of {data.num_labels} and the scored ones {len(scored)}: "
                "fine-tuning needs two classes at least, and every scored class among them. Raise the limits "
                "(a class needs one example at least) or give each split every class."
            )
    return TaskData(data.name, train, validation, data.label_names, data.regression)


def _as_int(value: Any) -> Any:
    """A CSV cell "1" is the label 1, as the same file's JSONL or parquet twin would have it."""
    return int(value) if isinstance(value, str) and value.strip().lstrip("-").isdigit() else value


def _labels(
    task: DownstreamTask, train: list[Any], validation: list[Any], names: list[str] | None, where: str
) -> tuple[list[Any], list[Any], list[str]]:
    """The labels as values (a regression: no class names) or as class ids 0..K-1 with the classes' names."""
    if task.metric in REGRESSION_METRICS:
        try:
            return [float(v) for v in train], [float(v) for v in validation], []
        except (TypeError, ValueError):
            bad = next(v for v in [*train, *validation] if not _is_number(v))
            raise ConfigError(
                f"downstream task {task.name!r}: metric {task.metric} scores a regression, but {where} has the label "
                f"{bad!r}: give numbers in {task.label_column!r}, or score classes with accuracy, f1, macro_f1 or mcc."
            ) from None
    train, validation = [_as_int(v) for v in train], [_as_int(v) for v in validation]
    # 3.8 or "3.8" is a value, not a class (1.0 and "1" are classes).
    real = [v for v in [*train, *validation] if not isinstance(v, bool) and _is_number(v) and not float(v).is_integer()]
    if real:
        raise ConfigError(
            f"downstream task {task.name!r}: the label {real[0]!r} is a real number, and metric {task.metric} scores "
            "classes: for a regression (similarity scores, ratings) set metric to pearson or spearman."
        )
    if all(isinstance(v, int) and not isinstance(v, bool) for v in [*train, *validation]):
        if min([*train, *validation]) < 0:
            raise ConfigError(
                f"downstream task {task.name!r}: a label is negative (GLUE marks unlabelled test rows "
                "-1): fine-tune and score on labelled splits only."
            )
        count = max(max(train) + 1, len(names or []))
        names = names or [str(i) for i in range(count)]
        train_ids, validation_ids = list(train), list(validation)
    else:
        names = sorted({str(v) for v in train})
        index = {name: i for i, name in enumerate(names)}
        train_ids = [index[str(v)] for v in train]
        validation_ids = [index.get(str(v), -1) for v in validation]
    unseen = sorted({v for v in validation_ids if v == -1 or v >= len(names)})
    if unseen or len(names) < 2:
        raise ConfigError(
            f"downstream task {task.name!r}: the training examples show {len(names)} classes "
            f"({names}) and the validation examples others: give both splits every class."
        )
    if task.metric == "f1" and len(names) != 2:
        raise ConfigError(
            f"downstream task {task.name!r}: metric f1 is the F1 of class 1 of a binary task, and this one has "
            f"{len(names)} classes ({names}): use macro_f1, mcc or accuracy."
        )
    return train_ids, validation_ids, names


def load_task(task: DownstreamTask, corpus: CorpusConfig) -> TaskData:
    """The task's training and validation examples."""
    if task.source in HELD_OUT_SOURCES:
        return sampled(task, held_out_task(task, corpus))
    names: list[str] | None = None
    if task.source == "files":
        assert task.train_file and task.validation_file  # the config's validator says so
        train_rows, validation_rows = _read_file(task.train_file), _read_file(task.validation_file)
        where = task.train_file
    else:
        train_rows, names = _load_split(task, task.train_split)
        validation_rows, _ = _load_split(task, task.validation_split)
        where = f"{task.hf_path} ({task.hf_name})"
    if not train_rows or not validation_rows:
        raise ConfigError(f"downstream task {task.name!r}: {where} has no training or no validation examples.")
    columns = _columns(task, train_rows[0], where)
    train_labels, validation_labels, names = _labels(
        task, [r[task.label_column] for r in train_rows], [r[task.label_column] for r in validation_rows], names, where
    )
    train = _examples(train_rows, columns, train_labels)
    validation = _examples(validation_rows, columns, validation_labels)
    return sampled(task, TaskData(task.name, train, validation, names, task.metric in REGRESSION_METRICS))
