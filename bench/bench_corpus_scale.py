"""Benchmark: a corpus of 0.128 and 1.024 GB read from gs:// (the GCS emulator) through every shard-set step.

    .venv/bin/python bench/bench_corpus_scale.py [--sizes 0.128 1.024] [--workers 2] [--previous 51791e5] [--dag]

The corpus (made once, cached under ~/.cache/mlm-pretrain/scale-corpus/): 64 MB .txt files of rows made
from the embedded Wikipedia sample's paragraphs (sentences reshuffled, one word in ten replaced, a number
appended: distinct rows with Wikipedia's vocabulary), with planted noise: 25% of rows exact copies of an
earlier row of the file, 5% copies of a pool of rows all files share, 3% one-word edits of an earlier row,
2% junk (markup, symbols, numbers) for the filters. The
0.128 GB corpus is the first two files of the 1.024 GB one. Both are uploaded to the emulator.

Each step runs as the Airflow task runs it (`python -m mlm_tasks <step>`, a fresh process), the mapped
ones `--workers` at a time (two Celery worker slots on this 2-core machine), with the default filters and
exact dedup, `shards.partition_mb` 64 (so both sizes cut 64 MB partitions) and `tokenizer.sample_mb` 32
(both sizes fill it). Per step: wall seconds and the largest peak RSS of its tasks (`/usr/bin/time`).
--dag: then mlm_dataset_refresh itself on the largest size (`airflow dags test`, SQLite): the real task
group, wall seconds and the peak RSS of its largest process.
--previous COMMIT: the writer before the dedup stages (`build_shard_set` of that commit: tokenizer on the
whole train split, every row written), on local copies of the same files (it reads local files only).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
CACHE = Path(os.environ.get("MLM_SCALE_CACHE", Path.home() / ".cache" / "mlm-pretrain" / "scale-corpus"))
FILE_MB = 64
MAPPED = ("scan_partition", "find_duplicates", "write_shards")
STEPS = ("plan_shards", "scan_partition", "find_duplicates", "cluster_duplicates", "train_tokenizer", "write_shards",
         "merge_shards")  # fmt: skip
JUNK = ["{{ Infobox | name = | image = }}", "| | | | |", "0 0 0 0 0 0 0 0", "<div class=nav>&nbsp;</div>", "* ."]


def make_corpus(files: int) -> list[Path]:
    """The first `files` 64 MB files of the scale corpus, made once. File i comes from its own seed (so a
    file is the same whichever were made before it) and copies rows of its own and of a pool every file
    shares, so duplicates fall both inside a file and across files; written whole, then renamed."""
    from mlm_tasks.config import CorpusConfig
    from mlm_tasks.data.corpus import open_corpus

    CACHE.mkdir(parents=True, exist_ok=True)
    paths = [CACHE / f"v2-part-{i:04d}.txt" for i in range(files)]
    if all(p.exists() for p in paths):
        return paths
    paragraphs = [r for _, r in open_corpus(CorpusConfig()).split_rows() if len(r.split()) >= 8]
    vocabulary = sorted({w for r in paragraphs for w in r.split()})

    def fresh(rng: random.Random) -> str:
        sentences = re.split(r"(?<=\. )", rng.choice(paragraphs))
        rng.shuffle(sentences)
        words = " ".join(s.strip() for s in sentences).split()
        for _ in range(max(1, len(words) // 10)):
            words[rng.randrange(len(words))] = rng.choice(vocabulary)
        return " ".join(words) + f" {rng.randrange(10**9)}"

    shared_rng = random.Random(-1)
    shared = [fresh(shared_rng) for _ in range(20_000)]  # rows every file may copy: cross-file duplicates
    for index, path in enumerate(paths):
        if path.exists():
            continue
        rng = random.Random(index)
        t0, size, rows, earlier = time.time(), 0, [], []
        while size < FILE_MB << 20:
            u = rng.random()
            if u < 0.25 and earlier:  # an exact copy of an earlier row of this file
                row = rng.choice(earlier)
            elif u < 0.30:  # an exact copy of a row other files copy too
                row = rng.choice(shared)
            elif u < 0.33 and earlier:  # a near copy: one word changed
                words = rng.choice(earlier).split()
                words[rng.randrange(len(words))] = rng.choice(vocabulary)
                row = " ".join(words)
            elif u < 0.35:
                row = rng.choice(JUNK)
            else:
                row = fresh(rng)
                earlier.append(row)
            rows.append(row)
            size += len(row.encode()) + 1
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n".join(rows) + "\n", encoding="utf-8")
        tmp.rename(path)
        print(f"made {path} ({len(rows):,} rows) in {time.time() - t0:.0f}s", flush=True)
    return paths


def timed(cmd: list[str], env: dict[str, str], log: Path) -> tuple[float, int, str]:
    """(seconds, peak RSS in MB, stdout) of one task's process."""
    with tempfile.NamedTemporaryFile("r") as stats, open(log, "ab") as err:
        t0 = time.time()
        done = subprocess.run(
            ["/usr/bin/time", "-f", "%M", "-o", stats.name, *cmd], env=env, stdout=subprocess.PIPE, stderr=err
        )
        seconds = time.time() - t0
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd[3:5])} failed ({done.returncode}); see {log}")
        return seconds, int(stats.read().strip().splitlines()[-1]) // 1024, done.stdout.decode()


def run_steps(pattern: str, out: Path, workers: int, env: dict[str, str], log: Path) -> dict:
    base = [
        sys.executable, "-m", "mlm_tasks", "STEP", "--config", str(REPO / "configs" / "default.yaml"),
        "--set", f"output_root={out}", "--set", "corpus.source=local_files", "--set", f"corpus.local_paths=[{pattern}]",
        "--set", "shards.partition_mb=64", "--set", "tokenizer.sample_mb=32",
    ]  # fmt: skip

    def cmd(step: str, *extra: str) -> list[str]:
        return [*base[:3], step, *base[4:], *extra]

    seconds, rss, stdout = timed(cmd("plan_shards"), env, log)
    plan = json.loads(stdout.strip().splitlines()[-1])
    n = len(plan["partitions"])
    rest = ["--set", f"shards.partitions={n}", "--data-fingerprint", plan["fingerprint"]]
    figures = {"plan_shards": (seconds, rss, 1)}
    for step in STEPS[1:]:
        flag = "--bucket" if step == "find_duplicates" else "--part"
        tasks = [cmd(step, *rest, flag, str(i)) for i in range(n)] if step in MAPPED else [cmd(step, *rest)]
        t0 = time.time()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(lambda c: timed(c, env, log), tasks))
        figures[step] = (time.time() - t0, max(r[1] for r in results), len(tasks))
        if step == "merge_shards":
            summary = json.loads(results[0][2].strip().splitlines()[-1])
    return {"partitions": n, "steps": figures, "summary": summary}


def run_previous(commit: str, files: list[Path], out: Path, env: dict[str, str], log: Path) -> tuple[float, int]:
    """build_shard_set of `commit` on local copies of the files: (seconds, peak RSS MB)."""
    tree = Path(tempfile.gettempdir()) / f"mlm-previous-{commit}"
    if not tree.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), commit], check=True)
    code = (
        "import sys; from mlm_tasks.config import load_config; from mlm_tasks.steps import build_shard_set; "
        f"cfg = load_config({str(tree / 'configs' / 'default.yaml')!r}, {{'output_root': {str(out)!r}, "
        f"'corpus.source': 'local_files', 'corpus.local_paths': {[str(f) for f in files]!r}}}); "
        "print(build_shard_set(cfg)['records'])"
    )
    seconds, rss, _ = timed([sys.executable, "-c", code], {**env, "PYTHONPATH": str(tree)}, log)
    return seconds, rss


def run_dag(pattern: str, work: Path, env: dict[str, str], log: Path) -> tuple[float, int, str]:
    """mlm_dataset_refresh, for real (`airflow dags test`, SQLite, every task in turn): (seconds, peak RSS
    MB of its largest process, the manifest's data card as a line)."""
    from peers.airflow_home import AIRFLOW, migrated_home

    env = {**migrated_home(work / "airflow", env), "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True"}
    out = work / "dag-out"
    conf = {
        "config_file": str(REPO / "configs" / "default.yaml"),
        "output_root": str(out),
        "overrides": {
            "corpus.source": "local_files",
            "corpus.local_paths": [pattern],
            "shards.partition_mb": 64,
            "tokenizer.sample_mb": 32,
        },
    }
    seconds, rss, _ = timed([AIRFLOW, "dags", "test", "mlm_dataset_refresh", "--conf", json.dumps(conf)], env, log)
    manifests = list(out.glob("datasets/*/shards/manifest.json"))
    if not manifests:
        raise RuntimeError(f"mlm_dataset_refresh published no shard set; see {log}")
    manifest = json.loads(manifests[0].read_text())
    card = manifest["data_card"]
    line = (
        f"{manifest['partitions']} partitions, rows read {sum(card['rows_read'].values()):,}, dropped by filters "
        f"{card['dropped_by_filters']:,}, exact duplicates removed "
        f"{sum(card['duplicates_removed']['exact'].values()):,}, "
        f"train records {manifest['splits']['train']['records']:,}"
    )
    return seconds, rss, line


def main() -> None:
    from peers.gcs import start_emulator, stop

    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=float, nargs="+", default=[0.128, 1.024], help="GB (multiples of 0.064)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--previous", default="", help="also time the writer of this commit (e.g. 51791e5)")
    p.add_argument("--dag", action="store_true", help="also run mlm_dataset_refresh for real on the largest size")
    args = p.parse_args()
    counts = [round(gb * 1024 / FILE_MB) for gb in args.sizes]
    files = make_corpus(max(counts))
    work = Path(tempfile.mkdtemp(prefix="mlm-scale-"))
    log = work / "steps.log"
    proc, emu = start_emulator(work)
    env = {
        **os.environ,
        "STORAGE_EMULATOR_HOST": emu.endpoint,
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "TF_USE_LEGACY_KERAS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    try:
        bucket = emu.client().bucket(emu.bucket)
        rows = []
        for gb, count in zip(args.sizes, counts, strict=True):
            prefix = f"s{count:03d}"
            for f in files[:count]:
                bucket.blob(f"{prefix}/{f.name}").upload_from_filename(str(f), timeout=600)
            size_mb = sum(f.stat().st_size for f in files[:count]) / 2**20
            result = run_steps(f"gs://{emu.bucket}/{prefix}/*.txt", work / prefix, args.workers, env, log)
            previous = None
            if args.previous:
                previous = run_previous(args.previous, files[:count], work / f"prev-{prefix}", env, log)
            rows.append((gb, size_mb, result, previous))
            shutil.rmtree(work / prefix, ignore_errors=True)
        report(rows, args.workers, args.previous)
        if args.dag:
            prefix = f"s{counts[-1]:03d}"
            seconds, rss, line = run_dag(f"gs://{emu.bucket}/{prefix}/*.txt", work, env, log)
            print(
                f"mlm_dataset_refresh (airflow dags test, one task at a time), {args.sizes[-1]:g} GB from gs://: "
                f"{seconds:,.0f} s, peak RSS of its largest process {rss} MB; {line}"
            )
    finally:
        stop(proc)
    print(f"logs: {log}")


def report(rows, workers: int, previous: str) -> None:
    print(f"\nshard set from gs:// (GCS emulator), {workers} task(s) at a time, {os.cpu_count()} cores")
    print(f"{'step':<20}" + "".join(f"{f'{gb:g} GB: s':>14}{'RSS MB':>9}{'tasks':>6}" for gb, *_ in rows))
    for step in STEPS:
        line = f"{step:<20}"
        for _, _, result, _ in rows:
            seconds, rss, tasks = result["steps"][step]
            line += f"{seconds:>14.1f}{rss:>9}{tasks:>6}"
        print(line)
    for gb, size_mb, result, prev in rows:
        total = sum(s for s, _, _ in result["steps"].values())
        card = result["summary"]["corpus"]["data_card"]
        removed = sum(card["duplicates_removed"]["exact"].values())
        sample = card["tokenizer_sample"]
        print(
            f"{gb:g} GB ({size_mb:,.0f} MiB, {result['partitions']} partitions): {total:,.0f} s in all, "
            f"{size_mb / total / workers:.2f} MiB/s per core; rows read {sum(card['rows_read'].values()):,}, "
            f"dropped by filters {card['dropped_by_filters']:,}, exact duplicates removed {removed:,}; "
            f"tokenizer sample {sample['rows']:,} rows ({sample['bytes'] / 1e6:.0f} MB); "
            f"train tokens {result['summary']['tokens']['train']:,}"
        )
        if prev:
            print(
                f"   previous writer ({previous}, one process, local copies): {prev[0]:,.0f} s, peak RSS {prev[1]} MB"
            )
    if len(rows) > 1:
        small, large = rows[0][2]["steps"], rows[-1][2]["steps"]
        ratios = ", ".join(f"{s} {large[s][1] / max(small[s][1], 1):.2f}x" for s in STEPS)
        print(f"peak RSS per task, {rows[-1][0]:g} GB over {rows[0][0]:g} GB: {ratios}")


if __name__ == "__main__":
    main()
