"""mlm_pretrain end to end with publishing on (real `airflow dags test`, SQLite) against the fake Hub.

The Hub token reaches the DAG only as the password of the Airflow connection `huggingface_default`
(AIRFLOW_CONN_HUGGINGFACE_DEFAULT, host = the fake's URL). Three runs over the same data:
  A (12 steps)  published: exactly the model files + card, the tokenizer to its own repo; report checked;
  B (3 steps)   worse than A: gate fails, publish skipped with the reason in the log, nothing committed;
  C (100 steps) better than A (lower loss, higher accuracy): published, and its metrics become the
                ones the next gate compares to.
Throughout, the planted token must appear in no log, no XCom, no file under output_root.
"""

import json
import secrets
from pathlib import Path

import pytest

from peers.airflow_db import db_path, db_rows, task_states, xcom_values
from peers.airflow_home import airflow_env, dags_test  # noqa: F401  (fixture)
from peers.fake_hub import FakeHub
from peers.tiny_data import TINY_FORM

TINY = TINY_FORM
REPO, TOKENIZER_REPO = "tester/roberta-tiny-mlm", "tester/unigram-tiny"
MODEL_FILES = {
    "README.md",
    "config.json",
    "tf_model.h5",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
}
TOKENIZER_FILES = {"README.md", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}


@pytest.fixture
def hub():
    # A token no other test uses, so finding it anywhere means this run leaked it.
    with FakeHub(token=f"hf_planted_{secrets.token_hex(16)}", user="tester") as fake:
        yield fake


def _run(env, out: Path, hub: FakeHub, steps: int, **overrides):
    conf = {
        **TINY,
        "steps": steps,
        "output_root": str(out),
        "overrides": {"publish.enabled": True, "publish.repo_id": REPO, **overrides},
    }
    connection = json.dumps({"conn_type": "generic", "host": hub.url, "password": hub.token})
    before = set((out / "runs").iterdir()) if (out / "runs").exists() else set()
    result = dags_test(
        env,
        "mlm_pretrain",
        conf=conf,
        timeout=900,
        extra_env={"AIRFLOW_CONN_HUGGINGFACE_DEFAULT": connection, "HF_ENDPOINT": hub.url, "MLM_RETRY_DELAY_S": "1"},
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0 and "state=success" in log, log[-6000:]
    (run_dir,) = set((out / "runs").iterdir()) - before
    run_id = db_rows(env, "SELECT run_id FROM dag_run WHERE dag_id = 'mlm_pretrain' ORDER BY id DESC LIMIT 1")[0][0]
    return log, run_dir, run_id


def _assert_report(run_dir: Path, report_xcom: dict, metrics: dict, fingerprint: str) -> None:
    from PIL import Image

    for name in ("loss.png", "learning_rate.png"):
        with Image.open(run_dir / "report" / name) as img:
            assert img.format == "PNG" and img.size[0] > 100 and img.size[1] > 100, name
            img.verify()
    page = (run_dir / "report" / "report.md").read_text()
    assert "](loss.png)" in page and "](learning_rate.png)" in page
    assert f"{metrics['loss']:.4f}" in page and fingerprint in page
    assert report_xcom["eval_loss"] == metrics["loss"] and report_xcom["accuracy"] == metrics["accuracy"]
    assert report_xcom["perplexity"] == metrics["perplexity"] and report_xcom["steps"] == 12
    assert report_xcom["data_fingerprint"] == fingerprint
    assert report_xcom["report_uri"] == str(run_dir / "report" / "report.md")


def _assert_token_nowhere(env, out: Path, token: str, logs: list[str]) -> None:
    for i, log in enumerate(logs):
        assert token not in log, f"token in the stdout/stderr of dags test #{i + 1}"
    secret = token.encode()
    # `dags test` sends task logs to stdout (checked above); a deployment's log folder is checked too.
    log_files = [p for p in (Path(env["AIRFLOW_HOME"]) / "logs").rglob("*") if p.is_file()]
    assert not [p for p in log_files if secret in p.read_bytes()]
    values = db_rows(env, "SELECT dag_id, task_id, value FROM xcom")
    assert values and not [v[:2] for v in values if token in str(v[2])]
    db = db_path(env)  # nothing else in the metadata DB either (nor in its journal)
    assert not [p for p in db.parent.glob(db.name + "*") if p.is_file() and secret in p.read_bytes()]
    files = [p for p in out.rglob("*") if p.is_file()]
    assert files and not [p for p in files if secret in p.read_bytes()]


@pytest.mark.slow
def test_gate_decides_what_reaches_the_hub_and_no_secret_leaks(airflow_env, hub, tmp_path):
    out = tmp_path / "out"

    # A: first model, nothing published before: published with its card; tokenizer pushed alone.
    log_a, run_a, run_id_a = _run(airflow_env, out, hub, 12, **{"publish.tokenizer_repo_id": TOKENIZER_REPO})
    metrics_a = json.loads((run_a / "eval" / "metrics.json").read_text())
    (commit,) = hub.commits_to(REPO)
    assert set(commit.files) == MODEL_FILES and {"tf_model.h5", "model.safetensors"} <= commit.lfs_paths
    assert {p.name for p in (run_a / "model").iterdir()} == MODEL_FILES  # every file of the model dir, no more
    assert commit.files["tf_model.h5"] == (run_a / "model" / "tf_model.h5").read_bytes()
    assert commit.files["model.safetensors"] == (run_a / "model" / "model.safetensors").read_bytes()
    assert hub.repos[REPO].private
    card = commit.files["README.md"].decode()
    xcoms = xcom_values(airflow_env, "mlm_pretrain", run_id_a)
    fingerprint = xcoms["merge_shards"]["fingerprint"]
    for needle in (
        f"{metrics_a['loss']:.4f}",
        f"{metrics_a['accuracy']:.4f}",
        f"{metrics_a['perplexity']:.2f}",
        fingerprint,
        "license: cc-by-sa-4.0",
        "Intended use",
        "Credit:",
        "Fill-mask examples",
    ):
        assert needle in card, needle
    (tok_commit,) = hub.commits_to(TOKENIZER_REPO)
    assert set(tok_commit.files) == TOKENIZER_FILES and fingerprint in tok_commit.files["README.md"].decode()
    assert xcoms["publish"]["commit_oid"] == commit.oid and sorted(xcoms["publish"]["files"]) == sorted(MODEL_FILES)
    assert xcoms["gate"]["passed"] is True
    _assert_report(run_a, xcoms["report"], metrics_a, fingerprint)
    # The token the DAG used came from the connection: every Hub call carried it.
    assert {auth for _, path, auth in hub.requests if path.startswith("/api/")} == {f"Bearer {hub.token}"}

    # B: fewer steps, so worse than A: not published, and the log says why.
    log_b, run_b, run_id_b = _run(airflow_env, out, hub, 3)
    metrics_b = json.loads((run_b / "eval" / "metrics.json").read_text())
    assert metrics_b["loss"] > metrics_a["loss"]
    assert task_states(airflow_env, "mlm_pretrain", run_id_b)["publish"] == "skipped"
    assert "Not published: the evaluation gate failed" in log_b
    assert f"is worse than the previously published {metrics_a['loss']:.4f}" in log_b
    assert len(hub.commits_to(REPO)) == 1 and not (run_b / "publish").exists()
    published = json.loads((out / "published" / REPO.replace("/", "__") / "metrics.json").read_text())
    assert published["run_id"] == run_id_a and published["loss"] == metrics_a["loss"]

    # C: more steps, better than A: published, and now the reference for the next gate.
    log_c, run_c, run_id_c = _run(airflow_env, out, hub, 100)
    metrics_c = json.loads((run_c / "eval" / "metrics.json").read_text())
    # The gate wants both: loss not higher and accuracy not lower than the published model's.
    assert metrics_c["loss"] < metrics_a["loss"] and metrics_c["accuracy"] > metrics_a["accuracy"], (
        metrics_a,
        metrics_c,
    )
    assert task_states(airflow_env, "mlm_pretrain", run_id_c)["publish"] == "success", log_c[-4000:]
    commits = hub.commits_to(REPO)
    assert len(commits) == 2 and set(commits[-1].files) == MODEL_FILES
    assert f"{metrics_c['loss']:.4f}" in commits[-1].files["README.md"].decode()
    published = json.loads((out / "published" / REPO.replace("/", "__") / "metrics.json").read_text())
    assert published["run_id"] == run_id_c and published["commit_oid"] == commits[-1].oid

    _assert_token_nowhere(airflow_env, out, hub.token, [log_a, log_b, log_c])
