"""Atomicity: a shard writer SIGKILLed half way leaves no marker and no visible partial set; a rerun completes.

The writer is a real `python -m mlm_tasks build_shard_set` process, killed while its shards are being
written (small shards and small tokenize batches, so there are many progress lines to kill it on).
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mlm_tasks import storage
from mlm_tasks.data.shard_set import ShardSet
from mlm_tasks.data.writer import STAGING_PREFIX
from mlm_tasks.paths import DataPaths

ROOT = Path(__file__).resolve().parents[3]


def _prepare(out: Path) -> subprocess.Popen:
    args = [
        sys.executable,
        "-m",
        "mlm_tasks",
        "build_shard_set",
        "--config",
        str(ROOT / "configs" / "tiny.yaml"),
        "--set",
        f"output_root={out}",
        "--set",
        "shards.records_per_shard=8",
        "--set",
        "shards.tokenize_batch_rows=10",
    ]
    return subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "TF_USE_LEGACY_KERAS": "1"},
    )


@pytest.mark.slow
def test_writer_killed_half_way_leaves_nothing_visible_and_a_rerun_completes(tmp_path):
    out = tmp_path / "out"
    proc = _prepare(out)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(proc.stderr), daemon=True)
    reader.start()
    # Kill it once several train shards are finished in its staging folder and more are coming.
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if len(list(out.glob(f"datasets/*/{STAGING_PREFIX}*/train/*.tfrecord"))) >= 6:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait(timeout=60)
    reader.join(timeout=10)
    assert proc.returncode == -signal.SIGKILL, "".join(seen[-30:])
    fingerprint = next(
        re.search(r"Preparing data fingerprint (\w+)", line).group(1)
        for line in seen
        if "Preparing data fingerprint" in line
    )
    paths = DataPaths(str(out), fingerprint)
    root = Path(paths.root)

    # The killed writer had written shards (in its private staging folder)...
    (staging,) = [p for p in root.iterdir() if p.name.startswith(STAGING_PREFIX)]
    assert len(list((staging / "train").glob("*.tfrecord"))) >= 5
    # ...but nothing is visible where readers look: no shards folder, no manifest, no marker.
    assert not Path(paths.shards_dir).exists()
    assert not storage.exists(paths.success) and not storage.exists(paths.manifest)
    assert not list(out.rglob("_SUCCESS"))

    rerun = _prepare(out)
    stdout, stderr = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, stderr[-3000:]
    summary = json.loads(stdout)
    assert summary["fingerprint"] == fingerprint and summary["cache_hit"] is False
    assert "Reusing the tokenizer already trained for this fingerprint" in stderr
    assert "left by a writer that was killed half way" in stderr
    assert not staging.exists() and not [p for p in root.iterdir() if p.name.startswith(".")]
    shard_set = ShardSet.load(paths)
    for split in ("train", "validation"):
        shard_set.verify(split)
        assert sum(s["records"] for s in shard_set.shards(split)) == summary["records"][split] > 0
    assert shard_set.shards("train")[0]["records"] == 8
