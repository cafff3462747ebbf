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
def test_the_held_out_tasks_are_held_out_from_pretraining():
    """Every example of held_out_article is a piece of a row of the corpus's test split that is no row of train
    or validation, and the pieces of one row are all fine-tuned on or all scored. held_out_word_order (the
    default's) holds the same pieces in the same parts, about half of them with their words shuffled."""
    from mlm_tasks.data.corpus import open_corpus

    order_cfg = DEFAULT.downstream.tasks[0]
    assert order_cfg.source == "held_out_word_order"
    task = load_task(order_cfg.model_copy(update={"source": "held_out_article"}), DEFAULT.corpus)
    rows: dict[str, set[str]] = {"train": set(), "validation": set(), "test": set()}
    for split, row in open_corpus(DEFAULT.corpus).split_rows():  # one read, split as the shard writer splits
        rows[split].add(row)
    held_out = [" ".join(r.split()) for r in rows["test"] - rows["train"] - rows["validation"]]
    blob = "\n".join(held_out)
    pieces = task.train.texts + task.validation.texts
    assert len(pieces) > 800 and all(piece in blob for piece in pieces)
    scored_rows = [r for r in held_out if any(piece in r for piece in task.validation.texts)]
    assert not [p for p in task.train.texts if any(p in r for r in scored_rows)]  # scored rows are new to fine-tuning
    assert task.num_labels >= 2 and set(task.validation.labels) <= set(task.train.labels)

    order = load_task(order_cfg, DEFAULT.corpus)
    assert order.label_names == ["shuffled", "as written"]
    for part, article_part in ((order.train, task.train), (order.validation, task.validation)):
        assert sorted(sorted(t.split()) for t in part.texts) == sorted(sorted(t.split()) for t in article_part.texts)
        shuffled = [t for t, label in zip(part.texts, part.labels, strict=True) if label == 0]
        assert 0.4 < len(shuffled) / len(part) < 0.6 and not [t for t in shuffled if t in blob]
        assert all(t in blob for t, label in zip(part.texts, part.labels, strict=True) if label == 1)
    assert load_task(order_cfg, DEFAULT.corpus) == order  # the same examples every run


def test_a_label_sorted_file_is_sampled_with_both_classes_in_each_share(tmp_path):
    """max_*_examples draw a seeded sample stratified by label, not the first rows: a file sorted by label
    trains on both classes, in their proportions, and every run draws the same examples."""
    rows = sorted(sentiment_rows(300, 1), key=lambda r: r["label"])[:250]  # 150 negative, then 100 positive
    with open(tmp_path / "sorted.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["sentence", "label"])
        writer.writeheader()
        writer.writerows(rows)
    task = DownstreamTask(
        name="sorted",
        train_file=str(tmp_path / "sorted.csv"),
        validation_file=str(tmp_path / "sorted.csv"),
        max_train_examples=50,
        max_eval_examples=11,
    )
    data = load_task(task, DEFAULT.corpus)
    assert (data.train.labels.count(0), data.train.labels.count(1)) == (30, 20)  # 60% / 40%, as the file
    assert sorted(set(data.validation.labels)) == [0, 1] and len(data.validation) == 11
    assert load_task(task, DEFAULT.corpus).train.texts == data.train.texts  # seeded: the same sample every run
    assert data.train.texts != [r["sentence"] for r in rows[:50]]

    with pytest.raises(
        ConfigError, match=r"after sampling \(max_train_examples=1\) the training examples hold 1 class"
    ):
        load_task(task.model_copy(update={"max_train_examples": 1, "max_eval_examples": None}), DEFAULT.corpus)


def test_the_metric_fits_the_labels_or_the_task_says_which_would(tmp_path):
    """pearson and spearman score a regression (number labels, one output); classes need a class metric; f1 is
    binary. Each mismatch is a ConfigError before anything is fine-tuned."""
    sts = [{"sentence1": f"a {i}", "sentence2": f"b {i}", "label": round(i * 0.37 % 5, 2)} for i in range(20)]
    (tmp_path / "sts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sts))
    files = {"train_file": str(tmp_path / "sts.jsonl"), "validation_file": str(tmp_path / "sts.jsonl")}
    data = load_task(DownstreamTask(name="sts", metric="spearman", **files), DEFAULT.corpus)
    assert data.regression and data.num_labels == 1 and data.is_pair and data.train.labels[:3] == [0.0, 0.37, 0.74]
    with pytest.raises(ConfigError, match=r"the label 0.37 is a real number.*set metric to pearson or spearman"):
        load_task(DownstreamTask(name="sts", metric="accuracy", **files), DEFAULT.corpus)

    names = [{"sentence": f"s {i}", "label": ["neg", "neutral", "pos"][i % 3]} for i in range(12)]
    (tmp_path / "three.jsonl").write_text("".join(json.dumps(r) + "\n" for r in names))
    three = {"train_file": str(tmp_path / "three.jsonl"), "validation_file": str(tmp_path / "three.jsonl")}
    with pytest.raises(ConfigError, match=r"metric f1 is the F1 of class 1 of a binary task.*3 classes"):
        load_task(DownstreamTask(name="three", metric="f1", **three), DEFAULT.corpus)
    with pytest.raises(ConfigError, match=r"metric pearson scores a regression.*has the label 'neg'"):
        load_task(DownstreamTask(name="three", metric="pearson", **three), DEFAULT.corpus)
    assert load_task(DownstreamTask(name="three", metric="mcc", **three), DEFAULT.corpus).num_labels == 3
