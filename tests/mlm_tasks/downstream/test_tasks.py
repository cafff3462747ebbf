"""Where downstream examples come from: a local dataset in GLUE's layout through `datasets`, CSV, JSONL and
parquet files (local and gs://), and the embedded default's task, held out from pretraining."""

from __future__ import annotations

import csv
import json

import pytest

from mlm_tasks import storage
from mlm_tasks.config import DownstreamTask, load_config
from mlm_tasks.downstream.tasks import load_task
from mlm_tasks.errors import ConfigError
from peers.downstream_data import glue_folder, pair_rows, sentiment_rows
from peers.tiny_data import ROOT

DEFAULT = load_config(ROOT / "configs" / "default.yaml")


def test_glue_layout_through_datasets_single_and_pair(tmp_path):
    glue = str(glue_folder(tmp_path / "glue"))
    sst2 = load_task(DownstreamTask(name="sst2", source="hf_dataset", hf_path=glue, hf_name="sst2"), DEFAULT.corpus)
    assert (len(sst2.train), len(sst2.validation), sst2.is_pair) == (24, 12, False)
    assert sst2.label_names == ["negative", "positive"]  # GLUE's ClassLabel names
    assert sst2.train.texts[0] == sentiment_rows(24, 1)[0]["sentence"] and sst2.train.labels[:2] == [0, 1]

    mrpc = load_task(DownstreamTask(name="mrpc", source="hf_dataset", hf_path=glue, hf_name="mrpc"), DEFAULT.corpus)
    first = pair_rows(24, 1)[0]
    assert mrpc.is_pair and (mrpc.train.texts[0], mrpc.train.pairs[0]) == (first["sentence1"], first["sentence2"])
    assert mrpc.label_names == ["not_equivalent", "equivalent"]

    with pytest.raises(ConfigError, match="no split 'test'"):
        load_task(
            DownstreamTask(name="x", source="hf_dataset", hf_path=glue, hf_name="sst2", validation_split="test"),
            DEFAULT.corpus,
        )


def test_csv_and_jsonl_files_with_named_labels(tmp_path):
    names = {0: "neg", 1: "pos"}
    with open(tmp_path / "train.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["sentence", "label"])
        writer.writeheader()
        writer.writerows(sentiment_rows(20, 1))
    (tmp_path / "dev.jsonl").write_text(
        "".join(json.dumps({**r, "label": names[r["label"]]}) + "\n" for r in sentiment_rows(10, 2))
    )
    (tmp_path / "train.jsonl").write_text(
        "".join(json.dumps({**r, "label": names[r["label"]]}) + "\n" for r in sentiment_rows(20, 1))
    )
    from_csv = load_task(
        DownstreamTask(
            name="csv",
            train_file=str(tmp_path / "train.csv"),
            validation_file=str(tmp_path / "train.csv"),
            max_eval_examples=5,
        ),
        DEFAULT.corpus,
    )
    assert from_csv.train.labels == [r["label"] for r in sentiment_rows(20, 1)]  # "1" in a CSV is the label 1
    assert len(from_csv.validation) == 5 and from_csv.label_names == ["0", "1"]

    named = load_task(
        DownstreamTask(
            name="jsonl", train_file=str(tmp_path / "train.jsonl"), validation_file=str(tmp_path / "dev.jsonl")
        ),
        DEFAULT.corpus,
    )
    assert named.label_names == ["neg", "pos"]
    assert named.validation.labels == [r["label"] for r in sentiment_rows(10, 2)]

    with pytest.raises(ConfigError, match=r"not \['review'\] and 'label'"):
        load_task(
            DownstreamTask(
                name="cols",
                train_file=str(tmp_path / "train.csv"),
                text_columns=["review"],
                validation_file=str(tmp_path / "train.csv"),
            ),
            DEFAULT.corpus,
        )


def test_parquet_on_gcs(gcs_root):
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    for split, rows in (("train", pair_rows(16, 1)), ("validation", pair_rows(8, 2))):
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), buf)
        storage.write_bytes(f"{gcs_root}/task/{split}.parquet", buf.getvalue())
    task = load_task(
        DownstreamTask(
            name="pq",
            train_file=f"{gcs_root}/task/train.parquet",
            validation_file=f"{gcs_root}/task/validation.parquet",
        ),
        DEFAULT.corpus,
    )
    assert task.is_pair and len(task.train) == 16 and task.validation.labels == [r["label"] for r in pair_rows(8, 2)]


def test_task_settings_are_checked_before_any_work():
    with pytest.raises(ConfigError, match="source=files needs train_file"):
        load_config(None, {"downstream.tasks": [{"name": "x", "source": "files"}]})
    with pytest.raises(ConfigError, match="min_scores names"):
        load_config(
            None,
            {
                "downstream.tasks": [{"name": "a", "source": "hf_dataset", "hf_path": "glue"}],
                "downstream.min_scores": {"b": 0.5},
            },
        )


def test_validate_reads_task_files_before_any_training(tmp_path):
    from mlm_tasks.steps.validate import validate

    cfg = load_config(
        None,
        {
            "output_root": str(tmp_path),
            "downstream.tasks": [
                {
                    "name": "gone",
                    "train_file": str(tmp_path / "none.csv"),
                    "validation_file": str(tmp_path / "none.csv"),
                }
            ],
        },
    )
    with pytest.raises(ConfigError, match=r"none.csv does not exist: check the task's train_file"):
        validate(cfg, probe_write=False)


@pytest.mark.slow  # reads the whole embedded corpus: ~15 s: in make test, not in make test-fast
def test_default_task_is_held_out_from_pretraining():
    """Every passage of the default's task is a row of the corpus's test split, none of train or validation."""
    from mlm_tasks.data.corpus import open_corpus

    task_cfg = DEFAULT.downstream.tasks[0]
    assert task_cfg.source == "held_out_article"
    task = load_task(task_cfg, DEFAULT.corpus)
    rows: dict[str, set[str]] = {"train": set(), "validation": set(), "test": set()}
    for split, row in open_corpus(DEFAULT.corpus).split_rows():  # one read, split as the shard writer splits
        rows[split].add(row)
    pretraining, test = rows["train"] | rows["validation"], rows["test"]
    passages = set(task.train.texts) | set(task.validation.texts)
    assert passages and passages <= test and not passages & pretraining
    assert not set(task.train.texts) & set(task.validation.texts)  # scored passages are new to the fine-tuning too
    assert task.num_labels >= 2 and set(task.validation.labels) <= set(task.train.labels)
