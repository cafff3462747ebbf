"""Benchmark 1: the DAG's shard-writing task against Hugging Face's reference writer, on the same rows.

    .venv/bin/python bench/bench_shards.py [--rounds 3] [--profile]

Rows: every row of the embedded corpus (all three splits), written once into a parquet file. Variants,
each in a fresh subprocess, timed after their imports, in alternating order per round:
  task        exactly what the Airflow `write_shards` task runs (plugins/mlm_airflow/tasks/shard_set.py ->
              mlm_tasks.steps.write_shards), here partition 0 of 1: load the tokenizer, read
              the parquet (corpus reading included, local_files source), split the rows, tokenize,
              pack, write the shards of all three splits, move them into the set, write the partial
              manifest. The merge (a few ms: a tail shard, manifest.json, _SUCCESS) is not included.
  task-xml    the same task reading the embedded Wikipedia dump itself (bz2 + XML + wiki markup): what
              `make run` does; shows what parsing the dump costs beside tokenizing.
  ref N=1/2   the Hugging Face reference, as published (prepare_tfrecord_shards.py): Dataset.from_dict ->
              map(tokenize, batched, num_proc=N) -> map(group_texts, batched, batch_size=1000, num_proc=N)
              with its sum(lists, []) concatenation -> tf.train.Example(input_ids, attention_mask) ->
              tf.io.TFRecordWriter, 2048 records per shard, fresh datasets cache per run; the rows are
              handed over in memory (its reading is not timed)
  ref-chain N=2  the reference with group_texts concatenating by itertools.chain (linear): a stronger baseline
  raw         tokenizer.encode_batch over the same rows in batches of 1000, nothing kept or written
tokens/s = tokens the rows encode to / seconds, the same numerator for every variant. The task and the
reference write the same two features per record (input_ids, attention_mask).
--profile: cProfile of `task` in this process, the top functions by own time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from itertools import chain

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

RECORDS_PER_SHARD = 2048


def rows_parquet() -> str:
    """Every row of the embedded corpus, all splits, as a parquet file (written once)."""
    path = os.path.join(common.BENCH_ROOT, "all-rows.parquet")
    if not os.path.exists(path):
        import pyarrow as pa
        import pyarrow.parquet as pq

        from mlm_tasks.data.corpus import open_corpus

        rows = [row for _, row in open_corpus(common.bench_config().corpus).split_rows()]
        os.makedirs(common.BENCH_ROOT, exist_ok=True)
        pq.write_table(pa.table({"text": rows}), path + ".tmp")
        os.replace(path + ".tmp", path)
    return path


def all_rows() -> list[str]:
    import pyarrow.parquet as pq

    return pq.read_table(rows_parquet()).column("text").to_pylist()


def _tokenizer():
    from mlm_tasks.data.tokenizer import load_tokenizer

    return load_tokenizer(common.prepared()["tokenizer_uri"], common.MAX_LENGTH)


def run_raw(rows) -> dict:
    backend = _tokenizer().backend_tokenizer
    t0, tokens = time.perf_counter(), 0
    for i in range(0, len(rows), 1000):
        encodings = backend.encode_batch(rows[i : i + 1000])
        tokens += sum(len(e) for e in encodings)
    return {"seconds": time.perf_counter() - t0, "tokens_in": tokens}


def run_task(out_root: str, source: str) -> dict:
    """The write_shards task's function on partition 0 of 1, from the parquet or from the XML dump."""
    from mlm_tasks.data.corpus import open_corpus
    from mlm_tasks.data.dedup import dedup_in_process
    from mlm_tasks.paths import DataPaths, RunContext
    from mlm_tasks.steps.write_shards import write_shards

    corpus = {"corpus.source": "local_files", "corpus.local_paths": [rows_parquet()]} if source == "parquet" else {}
    # The same rows as the reference writes: no filter, no dedup (their stages run before, untimed).
    cfg = common.bench_config(output_root=out_root, **corpus, **{"dedup.exact": False, "corpus.filters.enabled": False})
    paths = DataPaths(out_root, "bench")
    shutil.copytree(common.prepared()["tokenizer_uri"], paths.tokenizer)
    dedup_in_process(cfg, paths, open_corpus(cfg.corpus), 1)
    t0 = time.perf_counter()
    result = write_shards(cfg, RunContext.of(cfg, fingerprint="bench"), part=0, num_parts=1)
    return {"seconds": time.perf_counter() - t0, "records": sum(result["records"].values())}


def run_reference(rows, out_dir: str, num_proc: int, linear_concat: bool = False) -> dict:
    # HF_DATASETS_CACHE was pointed at a fresh folder by the parent before `datasets` is imported.
    import datasets
    import tensorflow as tf

    tokenizer, block = _tokenizer(), common.MAX_LENGTH

    def tokenize(examples):
        return tokenizer(examples["text"])

    def group_texts(examples):
        # Verbatim from the reference (prepare_tfrecord_shards.py): sum(lists, []) copies the growing
        # list once per row. "ref-chain" replaces it by a linear itertools.chain, the fairer baseline.
        if linear_concat:
            concatenated = {k: list(chain(*examples[k])) for k in examples.keys()}
        else:
            concatenated = {k: sum(examples[k], []) for k in examples.keys()}
        total = len(concatenated["input_ids"]) // block * block
        return {k: [t[i : i + block] for i in range(0, total, block)] for k, t in concatenated.items()}

    t0 = time.perf_counter()
    ds = datasets.Dataset.from_dict({"text": rows})
    ds = ds.map(tokenize, batched=True, num_proc=num_proc, remove_columns=["text"])
    ds = ds.map(group_texts, batched=True, batch_size=1000, num_proc=num_proc)
    for shard, start in enumerate(range(0, len(ds), RECORDS_PER_SHARD)):
        snapshot = ds[start : start + RECORDS_PER_SHARD]
        with tf.io.TFRecordWriter(os.path.join(out_dir, f"dataset-{shard}.tfrecord")) as writer:
            for ids, mask in zip(snapshot["input_ids"], snapshot["attention_mask"], strict=False):
                features = {
                    "input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids)),
                    "attention_mask": tf.train.Feature(int64_list=tf.train.Int64List(value=mask)),
                }
                writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    return {"seconds": time.perf_counter() - t0, "records": len(ds)}


def worker(variant: str) -> None:
    import logging

    logging.disable(logging.INFO)
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as out_dir:
        if variant in ("task", "task-xml"):
            result = run_task(out_dir, "parquet" if variant == "task" else "xml")
        elif variant == "raw":
            result = run_raw(all_rows())
        else:
            result = run_reference(all_rows(), out_dir, int(variant.split("=")[1]), variant.startswith("ref-chain"))
    common.emit({"variant": variant, **result})


def profile() -> None:
    import cProfile
    import pstats

    with tempfile.TemporaryDirectory() as out_dir:
        prof = cProfile.Profile()
        prof.enable()
        result = run_task(out_dir, "parquet")
        prof.disable()
    print(f"task: {result['seconds']:.2f}s under cProfile")
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", default="task,ref N=2,ref-chain N=2,task-xml,raw")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--worker")
    args = p.parse_args()
    if args.worker:
        return worker(args.worker)
    common.prepared(), rows_parquet()  # cached before anything is timed
    if args.profile:
        return profile()
    variants = args.variants.split(",")
    times: dict[str, list[float]] = {v: [] for v in variants}
    records: dict[str, int] = {}
    tokens_in = None
    for r in range(args.rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:  # alternate, so drift hits all alike
            with tempfile.TemporaryDirectory(prefix="bench-hf-cache-") as cache:
                res = common.run_worker(__file__, v, env={"HF_DATASETS_CACHE": cache, "TMPDIR": cache})
            times[v].append(res["seconds"])
            records[v] = res.get("records", records.get(v, "-"))
            tokens_in = res.get("tokens_in", tokens_in)
            print(f"round {r + 1} {v}: {res['seconds']:.2f}s", file=sys.stderr)
    if tokens_in is None:
        tokens_in = common.run_worker(__file__, "raw")["tokens_in"]
    rate = {v: tokens_in / common.median(t) for v, t in times.items()}
    print(
        f"\n{common.machine()}\ncorpus: {len(all_rows()):,} rows (all splits) -> {tokens_in:,} tokens; "
        f"max_length {common.MAX_LENGTH}; median of {args.rounds} alternating rounds\n"
    )
    print(
        common.table(
            ["variant", "median s", "tokens/s", "records", "runs (s)"],
            [[v, common.median(t), rate[v], records[v], " ".join(f"{x:.2f}" for x in t)] for v, t in times.items()],
        )
    )
    ratios = []
    for other, target in (("ref N=2", "≥ 3"), ("ref-chain N=2", "-"), ("ref N=1", "-"), ("raw", "-")):
        if "task" in rate and other in rate:
            paired = [r / o for o, r in zip(times["task"], times[other], strict=False)]
            ratios.append([f"task / {other}", rate["task"] / rate[other], common.median(paired), target])
    if "task-xml" in rate and "ref N=2" in rate:
        paired = [r / o for o, r in zip(times["task-xml"], times["ref N=2"], strict=False)]
        ratios.append(["task-xml / ref N=2", rate["task-xml"] / rate["ref N=2"], common.median(paired), "-"])
    print()
    print(common.table(["ratio", "of medians", "median of per-round", "target"], ratios))


if __name__ == "__main__":
    main()
