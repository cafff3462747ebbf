"""Bring your own shards through the real DAG (`airflow dags test`, SQLite): shards written as Hugging
Face's prepare_tfrecord_shards.py writes them (tests/peers/seed_shards.py) are validated, adopted by
plan_shards with no partition to write and no tokenizer to train, and trained on by mlm_pretrain."""

import json
import shutil

import pytest

from peers.airflow_db import db_rows
from peers.airflow_home import airflow_env, dags_test  # noqa: F401  (fixture)
from peers.seed_shards import write_like_prepare_tfrecord_shards
from peers.tiny_data import TINY_FORM

TINY = {**TINY_FORM, "steps": 6}


@pytest.mark.slow
def test_pretrain_dag_trains_on_brought_shards(airflow_env, tiny_prepared, tmp_path):
    from mlm_tasks.data.corpus import open_corpus

    cfg, data = tiny_prepared
    shutil.copytree(data["tokenizer_uri"], tmp_path / "tokenizer")
    corpus = open_corpus(cfg.corpus)
    written = {
        split: write_like_prepare_tfrecord_shards(
            list(corpus.rows(split)), str(tmp_path / "tokenizer"), str(tmp_path / "shards" / split)
        )
        for split in ("train", "validation")
    }
    out = tmp_path / "out"
    conf = {
        **TINY,
        "output_root": str(out),
        "corpus_source": "tfrecord_shards",
        "overrides": {
            "corpus.shards_uri": str(tmp_path / "shards"),
            "corpus.tokenizer_uri": str(tmp_path / "tokenizer"),
        },
    }
    result = dags_test(airflow_env, "mlm_pretrain", conf=conf, timeout=900)
    log = result.stdout + result.stderr
    assert result.returncode == 0 and "state=success" in log, log[-5000:]
    assert "Adopted the shards under" in log
    # plan_shards listed nothing to write: Airflow skipped the mapped write_shards, and the merge still ran.
    assert db_rows(
        airflow_env,
        "SELECT task_id, state FROM task_instance WHERE task_id IN ('write_shards', 'merge_shards') ORDER BY task_id",
    ) == [("merge_shards", "success"), ("write_shards", "skipped")]
    # Shards from elsewhere: the gate checked for their _SUCCESS instead of passing at once.
    assert "Waiting for the shard marker" in log and "Not waiting" not in log
    (dataset,) = list((out / "datasets").iterdir())
    manifest = json.loads((dataset / "shards" / "manifest.json").read_text())
    assert {s: manifest["splits"][s]["records"] for s in written} == written
    assert sorted(p.name for p in (dataset / "shards").iterdir()) == ["_SUCCESS", "manifest.json"]  # nothing copied
    (run,) = list((out / "runs").iterdir())
    assert json.loads((run / "train" / "summary.json").read_text())["steps"] == 6
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    assert metrics["loss"] < metrics["untrained_loss"]
