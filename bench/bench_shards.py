"""Benchmark 1: shard-writing tokens/s on the embedded corpus (train split, same tokenizer, max_length 128).

    .venv/bin/python bench/bench_shards.py [--rounds 3] [--profile]

Variants, each in a fresh subprocess, timed after their imports, in alternating order per round:
  ours        mlm_tasks.shards.write_split (encode_batch_fast, block varint encoding, no TensorFlow)
  ours-tf     the same chunking, but a tf.train.Example + tf.io.TFRecordWriter per record (the writer before)
  ref N=1/2   the Hugging Face reference, as published (prepare_tfrecord_shards.py): Dataset.from_dict ->
              map(tokenize, batched, num_proc=N) -> map(group_texts, batched, batch_size=1000, num_proc=N)
              with its sum(lists, []) concatenation -> tf.train.Example(input_ids, attention_mask) ->
              tf.io.TFRecordWriter, 2048 records per shard, fresh datasets cache per run
  ref-chain N=2  the reference with group_texts concatenating by itertools.chain (linear): a stronger baseline
  raw         tokenizer.encode_batch over the same rows in batches of 1000, nothing kept or written
tokens/s = tokens the corpus encodes to / seconds, the same numerator for every variant.
--profile: cProfile of `ours` in this process, the top functions by own time.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from itertools import chain

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

RECORDS_PER_SHARD = 2048


def _tokenizer():
    from mlm_tasks.tokenizer import load_tokenizer

    return load_tokenizer(common.prepared()["tokenizer_uri"], common.MAX_LENGTH)


def run_raw(rows) -> dict:
    backend = _tokenizer().backend_tokenizer
    t0, tokens = time.perf_counter(), 0
    for i in range(0, len(rows), 1000):
        encodings = backend.encode_batch(rows[i:i + 1000])
        tokens += sum(len(e) for e in encodings)
    return {"seconds": time.perf_counter() - t0, "tokens_in": tokens}


def run_ours(rows, out_dir: str) -> dict:
    from mlm_tasks.config import ShardConfig
    from mlm_tasks.shards import write_split

    tok, cfg = _tokenizer(), ShardConfig(max_length=common.MAX_LENGTH, records_per_shard=RECORDS_PER_SHARD)
    t0 = time.perf_counter()
    entry = write_split(rows, tok, cfg, out_dir, "train")
    return {"seconds": time.perf_counter() - t0, "records": entry["records"]}


def run_ours_tf(rows, out_dir: str) -> dict:
    import tensorflow as tf

    from mlm_tasks.config import ShardConfig
    from mlm_tasks.shards import chunk_stream

    tok, cfg = _tokenizer(), ShardConfig(max_length=common.MAX_LENGTH, records_per_shard=RECORDS_PER_SHARD)
    t0, records, writer = time.perf_counter(), 0, None
    for block in chunk_stream(rows, tok, cfg, {"rows": 0, "characters": 0}):
        for row in block:
            if records % RECORDS_PER_SHARD == 0:
                writer and writer.close()
                writer = tf.io.TFRecordWriter(os.path.join(out_dir, f"part-{records // RECORDS_PER_SHARD}"))
            feature = {"input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=row.tolist()))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
            records += 1
    writer.close()
    return {"seconds": time.perf_counter() - t0, "records": records}


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
        return {k: [t[i:i + block] for i in range(0, total, block)] for k, t in concatenated.items()}

    t0 = time.perf_counter()
    ds = datasets.Dataset.from_dict({"text": rows})
    ds = ds.map(tokenize, batched=True, num_proc=num_proc, remove_columns=["text"])
    ds = ds.map(group_texts, batched=True, batch_size=1000, num_proc=num_proc)
    for shard, start in enumerate(range(0, len(ds), RECORDS_PER_SHARD)):
        snapshot = ds[start:start + RECORDS_PER_SHARD]
        with tf.io.TFRecordWriter(os.path.join(out_dir, f"dataset-{shard}.tfrecord")) as writer:
            for ids, mask in zip(snapshot["input_ids"], snapshot["attention_mask"]):
                features = {"input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids)),
                            "attention_mask": tf.train.Feature(int64_list=tf.train.Int64List(value=mask))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    return {"seconds": time.perf_counter() - t0, "records": len(ds)}


def worker(variant: str) -> None:
    rows = common.train_rows()
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as out_dir:
        if variant == "raw":
            result = run_raw(rows)
        elif variant == "ours":
            result = run_ours(rows, out_dir)
        elif variant == "ours-tf":
            result = run_ours_tf(rows, out_dir)
        else:
            result = run_reference(rows, out_dir, int(variant.split("=")[1]), variant.startswith("ref-chain"))
    common.emit({"variant": variant, **result})


def profile() -> None:
    import cProfile
    import pstats

    rows = common.train_rows()
    with tempfile.TemporaryDirectory() as out_dir:
        run_ours(rows[:200], out_dir)  # warm the tokenizer load and imports
        prof = cProfile.Profile()
        prof.enable()
        result = run_ours(rows, out_dir)
        prof.disable()
    print(f"ours: {result['seconds']:.2f}s under cProfile")
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", default="ours,ref N=2,ref-chain N=2,ours-tf,ref N=1,raw")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--worker")
    args = p.parse_args()
    if args.worker:
        return worker(args.worker)
    common.prepared(), common.train_rows()  # cached before anything is timed
    if args.profile:
        return profile()
    variants = args.variants.split(",")
    times: dict[str, list[float]] = {v: [] for v in variants}
    records: dict[str, int] = {}
    tokens_in = None
    for r in range(args.rounds):
        for v in (variants if r % 2 == 0 else variants[::-1]):  # alternate, so drift hits all alike
            with tempfile.TemporaryDirectory(prefix="bench-hf-cache-") as cache:
                res = common.run_worker(__file__, v, env={"HF_DATASETS_CACHE": cache, "TMPDIR": cache})
            times[v].append(res["seconds"])
            records[v] = res.get("records", records.get(v, "-"))
            tokens_in = res.get("tokens_in", tokens_in)
            print(f"round {r + 1} {v}: {res['seconds']:.2f}s", file=sys.stderr)
    if tokens_in is None:
        tokens_in = common.run_worker(__file__, "raw")["tokens_in"]
    rate = {v: tokens_in / common.median(t) for v, t in times.items()}
    print(f"\n{common.machine()}\ncorpus: {len(common.train_rows()):,} train rows -> {tokens_in:,} tokens; "
          f"max_length {common.MAX_LENGTH}; median of {args.rounds} alternating rounds\n")
    print(common.table(["variant", "median s", "tokens/s", "records", "runs (s)"],
                       [[v, common.median(t), rate[v], records[v], " ".join(f"{x:.2f}" for x in t)]
                        for v, t in times.items()]))
    ratios = []
    if "ours" in rate and "ref N=2" in rate:
        paired = [r / o for o, r in zip(times["ours"], times["ref N=2"])]
        ratios.append(["ours / ref N=2", rate["ours"] / rate["ref N=2"], common.median(paired), "≥ 3"])
    if "ours" in rate and "ref-chain N=2" in rate:
        paired = [r / o for o, r in zip(times["ours"], times["ref-chain N=2"])]
        ratios.append(["ours / ref-chain N=2", rate["ours"] / rate["ref-chain N=2"], common.median(paired), "-"])
    if "ours" in rate and "raw" in rate:
        paired = [r / o for o, r in zip(times["ours"], times["raw"])]
        ratios.append(["ours / raw encode_batch", rate["ours"] / rate["raw"], common.median(paired), "≥ 0.75"])
    if "ours" in rate and "ours-tf" in rate:
        ratios.append(["ours / ours-tf (writer before)", rate["ours"] / rate["ours-tf"], float("nan"), "-"])
    print()
    print(common.table(["ratio", "of medians", "median of per-round", "target"], ratios))


if __name__ == "__main__":
    main()
