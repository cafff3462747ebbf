"""What the steps return: small, JSON-ready values that travel between tasks (XCom) and print on the CLI.

A leaf module (it imports nothing of mlm_tasks), so steps, libraries and plugins/ all name the same types.
"""
from __future__ import annotations

from typing import TypedDict

# The shard set: plan_shards → write_shards (one per partition) → merge_shards.


class Partition(TypedDict):
    """One write_shards task's share of the corpus."""
    fingerprint: str
    part: int
    num_parts: int


class ShardPlan(TypedDict):
    """What plan_shards decided, handed to merge_shards; write_shards is mapped over `partitions`."""
    fingerprint: str
    cache_hit: bool                   # the complete set was there before this run
    corpus_fingerprint: str | None    # the plan's, so the merge does not hash a large corpus again
    partitions: list[Partition]       # empty: nothing to write (the set is complete, or shards were brought)


class WrittenPartition(TypedDict):
    fingerprint: str
    part: int
    num_parts: int
    records: dict[str, int]
    rows: dict[str, int]


class DataSummary(TypedDict):
    """What merge_shards returns and later steps read: small, JSON-serialisable, no secrets."""
    fingerprint: str
    data_root: str
    tokenizer_uri: str
    manifest_uri: str
    success_uri: str
    cache_hit: bool          # the complete set was there before this run
    written_here: bool       # this run's merge_shards published it
    vocab_size: int
    max_length: int
    records: dict[str, int]
    tokens: dict[str, int]
    shards: dict[str, int]
    corpus: dict
