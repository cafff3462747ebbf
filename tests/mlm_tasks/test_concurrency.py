"""Concurrency: two runs never share an output path; two writers of one fingerprint cannot corrupt it.

The writers are real `python -m mlm_tasks build_shard_set` processes started together on the tiny
config, so both train a tokenizer and write shards at the same time and race to publish.
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlm_tasks import storage
from mlm_tasks.data.shard_set import ShardSet
from mlm_tasks.paths import DataPaths, RunPaths, safe_run_id
from mlm_tasks.tpu.api import node_name

ROOT = Path(__file__).resolve().parents[2]

# Run ids that differ only in characters safe_run_id rewrites, or that look like another's safe form.
RUN_IDS = [
    "manual__2024-01-01T00:00:00+00:00",
    "manual__2024-01-01T00:00:00-00:00",
    "manual__2024-01-01T00-00-00-00-00",
    "manual__2024-01-01T00:00:00.000000+00:00",
    "a:b",
    "a+b",
    "a b",
    "a::b",
    "a-b",
    "a/b",
    "a\\b",
    safe_run_id("a:b"),  # an id spelled like another id's safe form
    "x" * 80 + ":1",
    "x" * 80 + ":2",  # long ids: the readable part is cut at 60 characters
    ":",
    "+",
    "run",
]


def test_two_runs_never_share_an_output_path():
    roots = [RunPaths("gs://bucket/p", r).root for r in RUN_IDS]
    assert len(set(roots)) == len(RUN_IDS), [r for r in roots if roots.count(r) > 1]
    for run_id, root in zip(RUN_IDS, roots, strict=False):
        name = root.rsplit("/", 1)[1]
        # Safe for gs:// tooling and file systems: no ':', '+', '/', spaces.
        assert name and all(c.isalnum() or c in "_.-" for c in name), (run_id, name)
        assert safe_run_id(run_id) == name  # stable: a retry of the run finds its own folder
    assert len({node_name("mlm_pretrain", r) for r in RUN_IDS}) == len(RUN_IDS)


def _prepare(output_root: str) -> subprocess.Popen:
    args = [
        sys.executable,
        "-m",
        "mlm_tasks",
        "build_shard_set",
        "--config",
        str(ROOT / "configs" / "tiny.yaml"),
        "--set",
        f"output_root={output_root}",
    ]
    return subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "TF_USE_LEGACY_KERAS": "1"},
    )


def _race(output_root: str) -> list[tuple[dict, str]]:
    procs = [_prepare(output_root), _prepare(output_root)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        results.append((json.loads(out), err))
    return results


def _check_one_consistent_set(results, output_root: str) -> DataPaths:
    (a, log_a), (b, log_b) = results
    assert a["fingerprint"] == b["fingerprint"]
    # Both wrote (neither was a cache hit), so the publish really raced...
    assert a["cache_hit"] is False and b["cache_hit"] is False, (log_a[-2000:], log_b[-2000:])
    # ...and both report the one published set; at least one says it published it (the other may
    # have found it complete by the time it merged).
    assert {**a, "cache_hit": None, "written_here": None} == {**b, "cache_hit": None, "written_here": None}
    assert a["written_here"] or b["written_here"]
    paths = DataPaths(output_root, a["fingerprint"])
    manifest = storage.read_json(paths.manifest)
    assert storage.exists(paths.success)
    for split in ("train", "validation"):
        assert manifest["splits"][split]["records"] == a["records"][split] > 0
        ShardSet.load(paths).verify(split)
    # The shards were encoded with the tokenizer that was published (first writer wins).
    tokenizer = storage.read_bytes(paths.tokenizer + "/tokenizer.json")
    assert manifest["tokenizer_sha256"] == hashlib.sha256(tokenizer).hexdigest()
    # Exactly the set the manifest lists: no stray shard from the other writer.
    listed = {s["file"] for e in manifest["splits"].values() for s in e["shards"]}
    fs = storage.filesystem(paths.shards_dir)
    found = {p.split("/shards/", 1)[1] for p in fs.find(paths.shards_dir)}
    assert found == listed | {"manifest.json", "_SUCCESS"}
    return paths


@pytest.mark.slow
def test_two_writers_of_one_fingerprint_publish_one_intact_set(tmp_path):
    out = str(tmp_path / "out")
    results = _race(out)
    paths = _check_one_consistent_set(results, out)
    logs = [err for _, err in results]
    # Both wrote their partition (the same bytes under the same names) and merged; neither failed.
    assert all("Partition 1 of 1" in log for log in logs), [log[-1500:] for log in logs]
    # Nothing half-written is left beside the set (staging folders are gone).
    assert not [n for n in os.listdir(paths.root) if n.startswith(".")], os.listdir(paths.root)


@pytest.mark.slow
def test_two_writers_of_one_fingerprint_on_gcs(gcs_root):
    results = _race(gcs_root)
    _check_one_consistent_set(results, gcs_root)
