"""bench/bench_quality.py end to end on the tiny config: today's baseline and a candidate alternate in
fresh subprocesses (this checkout's mlm_tasks), each scored on the fixed-mask validation loss, into one
table. (`default` would be a third training of the same recipe as `today` here: it adds time, not a check.)

    TF_USE_LEGACY_KERAS=1 .venv/bin/python -m pytest tests/bench/test_bench_quality.py -q
"""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench(root, timeout: int, *args: str) -> subprocess.CompletedProcess:
    """bench_quality.py on configs/tiny.yaml with `args`, its bench root under `root`."""
    env = {**os.environ, "MLM_BENCH_ROOT": str(root), "TF_USE_LEGACY_KERAS": "1"}
    script, config = os.path.join(REPO, "bench", "bench_quality.py"), os.path.join(REPO, "configs", "tiny.yaml")
    return subprocess.run(
        [sys.executable, script, "--config", config, *args], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow  # two tiny trainings in fresh processes: ~1 min
def test_the_bench_trains_each_recipe_in_its_own_process_and_tables_the_validation_losses(tmp_path):
    # --today: another checkout's code and config as the baseline (here this one: its recipe `default` is
    # the same code, run under the name `today`); a candidate beside it.
    done = _bench(tmp_path, 300, "--budget-minutes", "0.02", "--candidates", "one_cycle", "--today", REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in done.stdout.splitlines()
        if line.startswith("| ") and "recipe" not in line
    }
    assert list(rows) == ["today", "one_cycle"]
    assert "| vs today " in done.stdout and rows["today"][4] == "+0.0000"  # the deltas are against today's
    assert float(rows["one_cycle"][3]) > 0 and float(rows["today"][3]) > 0  # val loss
    for name in rows:  # each in its own process, on this checkout's mlm_tasks (today's through PYTHONPATH)
        assert f"round 1 {name}:" in done.stderr
    assert f"({os.path.join(REPO, 'mlm_tasks')})" in done.stderr
    unknown = _bench(tmp_path, 120, "--budget-minutes", "0.02", "--candidates", "bf16+nonsense")
    assert unknown.returncode != 0 and "Unknown candidate 'nonsense'" in unknown.stderr


@pytest.mark.slow  # two arms, each four CLI processes: ~2 min
def test_the_commits_mode_trains_another_commits_code_and_config_beside_this_checkouts(tmp_path):
    """--commits: a worktree of the commit (here this checkout's own HEAD) with a candidate recipe on it
    (`REV:lr2e3`), trained through its own CLI with its own copy of the config, beside this checkout's working
    tree; the loss, the steps and the fill-mask tops per arm."""
    head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    arm = f"{head.strip()}:lr2e3"
    try:
        done = _bench(tmp_path, 900, "--commits", arm)
    finally:
        worktree = tmp_path / "checkouts" / head.strip()
        subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", str(worktree)], capture_output=True)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [
        line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| ") and "default" not in line
    ]
    assert [r[0].split()[0] for r in rows] == ["HEAD", arm]
    for row in rows:
        assert row[1].strip() == "12" and float(row[3]) > 0  # configs/tiny.yaml's 12 steps; a validation loss
    assert f"worktree of {head.strip()}" in done.stderr  # the commit's own code, not this tree's
    assert done.stdout.count(": ") >= 2  # each arm's fill-mask tops
    assert f"round 1 {arm} (seed 42)" in done.stderr
    assert sorted(os.listdir(tmp_path / "defaults")) == sorted(["HEAD", head.strip()])  # the arm's under its REV
    unknown = _bench(tmp_path, 120, "--commits", "HEAD:nonsense")
    assert unknown.returncode != 0 and "Unknown candidate 'nonsense'" in unknown.stderr


@pytest.mark.slow  # four XLA compilations: ~1 min on a loaded machine
def test_the_attention_mode_times_a_global_and_a_local_layer_at_128_and_1024_tokens(tmp_path):
    done = _bench(tmp_path, 300, "--attention", "--preset", "tiny")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [
        [c.strip().replace(",", "") for c in line.split("|")[1:-1]]
        for line in done.stdout.splitlines()
        if line.startswith("| ")
    ]
    assert [(r[0], r[1]) for r in rows[1:]] == [
        (n, kind) for n in ("128", "1024") for kind in ("full_attention", "sliding_attention")
    ]
    needed = {(r[0], r[1]): float(r[5]) for r in rows[1:]}
    assert needed[("128", "sliding_attention")] == needed[("128", "full_attention")]  # the window holds 128
    assert needed[("1024", "sliding_attention")] == pytest.approx(
        needed[("1024", "full_attention")] * 129 / 1024, rel=0.01
    )  # the table rounds
    assert all(float(r[2]) > 0 for r in rows[1:])


def test_a_content_word_is_a_word_or_number_not_markup_or_a_function_word():
    sys.path.insert(0, os.path.join(REPO, "bench"))
    from commit_arms import is_content_word

    assert [is_content_word(t) for t in ["Washington", "1783", " city", "=", ",", "", "the", "He"]] == [
        True,
        True,
        True,
        False,
        False,
        False,
        False,
        False,
    ]
