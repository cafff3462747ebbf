"""mlm_dataset_refresh with real Airflow (`airflow dags test`, SQLite), on a local_files corpus we edit.

Unchanged source: no writes under output_root (every path's mtime and size kept), build skipped, no
asset event. Changed source: an event whose extra has the new fingerprint, records and tokens of the
manifest; the scheduler's own code then makes the ASSET_TRIGGERED mlm_pretrain run from the queued
event (tests/peers/asset_trigger.py), and that run trains on exactly that fingerprint although its
own defaults point at another output_root.
"""

import json
import os
from pathlib import Path

import pytest

from mlm_tasks.steps import SHARD_SET_STEPS
from peers.airflow_db import asset_events, db_rows, task_states, xcom_values
from peers.airflow_home import AIRFLOW, airflow_env, dags_test  # noqa: F401  (fixture)
from peers.asset_trigger import asset_triggered_test, run_info

ROOT = Path(__file__).resolve().parents[2]
TINY_YAML = ROOT / "configs" / "tiny.yaml"
# Training after the data is what this test is about; the later tasks have their own tests.
AFTER_TRAIN = "^(evaluate|fill_mask|report|gate|publish|publish_tokenizer|summary)$"


def _write_corpus(path: Path, articles: int) -> None:
    from mlm_tasks.config import load_config
    from mlm_tasks.data.corpus import open_corpus

    cfg = load_config(TINY_YAML, {"corpus.max_articles": articles})
    rows = [row for article in open_corpus(cfg.corpus).articles() for row in article.rows]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st = os.stat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), root)] = (st.st_mtime_ns, st.st_size)
    return out


def _log(result) -> str:
    return result.stdout + result.stderr


@pytest.fixture
def refresh(airflow_env, tmp_path):
    """Runs mlm_dataset_refresh on tmp_path/corpus.txt into tmp_path/out. Every process sees a config dir
    whose default.yaml is the tiny preset with output_root elsewhere, so asset-triggered runs (which
    have no conf) are small, and any artifact they write outside the event's output_root would show."""
    config_dir = tmp_path / "configs"
    config_dir.mkdir()
    (config_dir / "default.yaml").write_text(
        TINY_YAML.read_text().replace("output_root: out", f"output_root: {tmp_path / 'defaults_root'}")
    )
    corpus, out = tmp_path / "corpus.txt", tmp_path / "out"
    env = {
        "MLM_CONFIG_DIR": str(config_dir),
        "MLM_RETRY_DELAY_S": "1",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
    }  # the test unpauses mlm_pretrain itself
    conf = {
        "config_file": str(TINY_YAML),
        "output_root": str(out),
        # Two partitions: the refresh fans the shard writing out over two mapped write_shards tasks.
        "overrides": {"corpus.source": "local_files", "corpus.local_paths": [str(corpus)], "shards.partitions": 2},
    }

    def run():
        return dags_test(airflow_env, "mlm_dataset_refresh", conf=conf, extra_env=env, timeout=600)

    run.corpus, run.out, run.env, run.defaults_root = corpus, out, env, tmp_path / "defaults_root"
    return run


@pytest.mark.slow
def test_unchanged_source_is_a_no_op_and_a_changed_one_triggers_training(airflow_env, refresh):
    import subprocess

    _write_corpus(refresh.corpus, articles=6)
    first = refresh()
    assert first.returncode == 0 and "Source changed" in _log(first), _log(first)[-5000:]
    events = asset_events(airflow_env, "mlm_shards")
    old_event, old_fp = events[-1], events[-1]["extra"]["fingerprint"]
    # Dynamic task mapping: one write_shards task per partition, named in the grid, merged into one set.
    assert db_rows(
        airflow_env,
        "SELECT map_index, state, rendered_map_index FROM task_instance WHERE "
        "task_id = 'write_shards' ORDER BY map_index",
    ) == [(0, "success", "partition 1 of 2"), (1, "success", "partition 2 of 2")]
    manifest = json.loads((refresh.out / "datasets" / old_fp / "shards" / "manifest.json").read_text())
    assert manifest["partitions"] == 2
    files = [s["file"] for s in manifest["splits"]["train"]["shards"]]
    assert any(f.startswith("train/train-p00000of00002-") for f in files), files
    assert any(f.startswith("train/train-p00001of00002-") for f in files), files
    assert manifest["splits"]["train"]["records"] == sum(s["records"] for s in manifest["splits"]["train"]["shards"])
    # mlm_pretrain is paused at creation, so nothing was queued for it yet; from now on it listens.
    assert db_rows(airflow_env, "SELECT COUNT(*) FROM asset_dag_run_queue") == [(0,)]
    unpause = subprocess.run(
        [AIRFLOW, "dags", "unpause", "mlm_pretrain"],
        env={**airflow_env, **refresh.env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unpause.returncode == 0, unpause.stdout + unpause.stderr

    # Unchanged source: nothing written, build skipped, no asset event.
    before, n_events = _snapshot(refresh.out), len(events)
    again = refresh()
    log = _log(again)
    assert again.returncode == 0, log[-5000:]
    assert f"Source unchanged: data fingerprint {old_fp} is already prepared" in log
    assert _snapshot(refresh.out) == before
    assert len(asset_events(airflow_env, "mlm_shards")) == n_events
    assert task_states(airflow_env, "mlm_dataset_refresh") == {
        "validate": "success",
        "source_changed": "success",
        **dict.fromkeys(SHARD_SET_STEPS, "skipped"),
    }
    assert db_rows(airflow_env, "SELECT COUNT(*) FROM asset_dag_run_queue") == [(0,)]  # no training requested

    # Changed source: new fingerprint, built and announced with its counts.
    with refresh.corpus.open("a", encoding="utf-8") as f:
        f.write("A sentence added this week, so the weekly refresh has new text to tokenize.\n")
    changed = refresh()
    assert changed.returncode == 0 and "Source changed" in _log(changed), _log(changed)[-5000:]
    events = asset_events(airflow_env, "mlm_shards")
    assert len(events) == n_events + 1
    event = events[-1]
    extra, new_fp = event["extra"], event["extra"]["fingerprint"]
    assert new_fp != old_fp and event["source_dag_id"] == "mlm_dataset_refresh"
    assert event["source_task_id"] == "merge_shards"
    manifest = json.loads((refresh.out / "datasets" / new_fp / "shards" / "manifest.json").read_text())
    assert extra["records"] == {s: manifest["splits"][s]["records"] for s in manifest["splits"]}
    assert extra["tokens"] == {s: manifest["splits"][s]["tokens"] for s in manifest["splits"]}
    assert extra["records"]["train"] > 0 and extra["output_root"] == str(refresh.out)
    assert extra["data_config"]["corpus"]["local_paths"] == [str(refresh.corpus)]
    # The scheduler's queue now holds a run request for mlm_pretrain, the DAG scheduled on the asset.
    assert db_rows(airflow_env, "SELECT target_dag_id FROM asset_dag_run_queue") == [("mlm_pretrain",)]

    # The triggered training run: made by the scheduler's code from the queue, run with no conf.
    triggered = asset_triggered_test(
        airflow_env, "mlm_pretrain", mark_success_pattern=AFTER_TRAIN, extra_env=refresh.env, timeout=900
    )
    log = _log(triggered)
    assert triggered.returncode == 0, log[-6000:]
    info = run_info(triggered)
    # The run consumed both refreshes' events (none was consumed before); it must train on the newest.
    assert info["event_ids"] == [old_event["id"], event["id"]]
    assert f"Triggered by dataset refresh: fingerprint {new_fp}" in log
    assert db_rows(airflow_env, "SELECT run_type, triggered_by FROM dag_run WHERE run_id = ?", info["run_id"]) == [
        ("asset_triggered", "ASSET")
    ]
    assert db_rows(airflow_env, "SELECT COUNT(*) FROM asset_dag_run_queue") == [(0,)]
    xcoms = xcom_values(airflow_env, "mlm_pretrain", info["run_id"])
    assert xcoms["merge_shards"]["fingerprint"] == new_fp and xcoms["merge_shards"]["cache_hit"] is True
    assert xcoms["train"]["data_fingerprint"] == new_fp and xcoms["train"]["steps"] == 12
    (run_dir,) = [p for p in (refresh.out / "runs").iterdir()]
    summary = json.loads((run_dir / "train" / "summary.json").read_text())
    assert summary["data_fingerprint"] == new_fp
    assert not refresh.defaults_root.exists()  # the event's output_root won over the run's defaults
    # Exactly one dataset per fingerprint: the triggered run built nothing itself.
    assert sorted(p.name for p in (refresh.out / "datasets").iterdir()) == sorted([old_fp, new_fp])


def test_schedule_is_weekly_by_default_and_set_by_the_environment(monkeypatch):
    pytest.importorskip("airflow")
    from airflow.dag_processing.dagbag import DagBag

    dag_file = ROOT / "dags" / "mlm_dataset_refresh.py"
    for value, expected in ((None, "@weekly"), ("0 3 * * 1", "0 3 * * 1"), ("none", None)):
        if value is None:
            monkeypatch.delenv("MLM_REFRESH_SCHEDULE", raising=False)
        else:
            monkeypatch.setenv("MLM_REFRESH_SCHEDULE", value)
        bag = DagBag(dag_folder=str(dag_file))
        assert not bag.import_errors, bag.import_errors
        dag = bag.dags["mlm_dataset_refresh"]
        assert dag.schedule == expected, (value, dag.schedule)
        build = dag.get_task("merge_shards")
        assert [a.name for a in build.outlets] == ["mlm_shards"]
        assert set(dag.params.keys()) == {"config_file", "output_root", "overrides"}
