"""The shard-set manifest, typed: what a complete shard set holds, read through one API.

    shard_set = ShardSet.load(paths)              # needs _SUCCESS; a damaged manifest.json is a ConfigError
    shard_set.max_length, shard_set.vocab_size, shard_set.records("train")
    shard_set.shard_uris("train")                 # what tf.data reads
    shard_set.verify("train")                     # sha256 of every shard against the manifest

`manifest.json` (written by mlm_tasks/shards_parallel.py's merge, or by mlm_tasks/byo_shards.py for a
set written elsewhere) is the source of truth for our own reader: counts, checksums, settings. Shard
file names also carry their record counts, for readers that only list files (Hugging Face's scripts).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from mlm_tasks import storage
from mlm_tasks.config import ConfigError, PipelineConfig
from mlm_tasks.paths import DataPaths, join

# 2: two features (input_ids, attention_mask) and record counts in the names; 1 had input_ids only.
MANIFEST_VERSION = 2


def rebuild_hint(paths: DataPaths) -> str:
    """What to delete so the next run rebuilds this shard set (the tokenizer is kept)."""
    return (f"delete {paths.shards_dir} and {paths.partitions_dir}, then rerun build_shard_set (or the DAG) to "
            "rebuild the shard set")


def build_manifest(paths: DataPaths, max_length: int, records_per_shard: int, splits: dict, extra: dict) -> dict:
    """The manifest of a shard set: the one place its fields are named."""
    return {"version": MANIFEST_VERSION, "fingerprint": paths.fingerprint, "max_length": max_length,
            "records_per_shard": records_per_shard, "features": ["input_ids", "attention_mask"],
            "splits": splits, **extra}


def publish_manifest(paths: DataPaths, manifest: dict) -> ShardSet:
    """manifest.json, then _SUCCESS: last, because it is all readers and sensors trust."""
    storage.write_json(paths.manifest, manifest)
    storage.write_text(paths.success, "")
    return ShardSet(paths, manifest)


@dataclass(frozen=True)
class ShardSet:
    paths: DataPaths
    data: dict

    @classmethod
    def load(cls, paths: DataPaths) -> ShardSet:
        if not storage.exists(paths.success):
            raise FileNotFoundError(f"No complete shard set under {paths.shards_dir} (no _SUCCESS): run "
                                    "build_shard_set first (or the DAG) or check output_root and the data fingerprint.")
        try:
            data = json.loads(storage.read_bytes(paths.manifest))
            if not isinstance(data, dict) or not isinstance(data.get("splits"), dict):
                raise ValueError("not a manifest object with 'splits'")
        except FileNotFoundError:
            raise ConfigError(f"{paths.manifest} is missing although {paths.success} exists: "
                              f"{rebuild_hint(paths)}.") from None
        except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
            raise ConfigError(f"{paths.manifest} is damaged ({type(err).__name__}: {err}): "
                              f"{rebuild_hint(paths)}.") from None
        return cls(paths, data)

    fingerprint = property(lambda self: self.data["fingerprint"])
    max_length = property(lambda self: int(self.data["max_length"]))
    vocab_size = property(lambda self: int(self.data["vocab_size"]))
    tokenizer_sha256 = property(lambda self: self.data.get("tokenizer_sha256"))
    special_ids = property(lambda self: self.data.get("special_ids", {}))
    splits = property(lambda self: list(self.data["splits"]))

    def entry(self, split: str) -> dict:
        if split not in self.data["splits"]:
            raise ConfigError(f"The shard set {self.paths.shards_dir} has no {split!r} split (has "
                              f"{self.splits}): choose one of those.")
        return self.data["splits"][split]

    def records(self, split: str) -> int:
        return int(self.entry(split)["records"])

    def tokens(self, split: str) -> int:
        return int(self.entry(split)["tokens"])

    def shards(self, split: str) -> list[dict]:
        return self.entry(split)["shards"]

    def shard_uris(self, split: str) -> list[str]:
        """Shards written here are named relative to the set's folder; shards brought from elsewhere
        (bring-your-own) carry their own absolute `uri`."""
        return [s.get("uri") or join(self.paths.shards_dir, s["file"]) for s in self.shards(split)]

    def verify(self, split: str, checksums: bool = True) -> None:
        """Fail, without retry, on a missing, truncated or corrupted shard instead of training on less data.
        checksums=False compares sizes only: no shard is read (cheap enough for a check before the VM)."""
        for shard, uri in zip(self.shards(split), self.shard_uris(split), strict=False):
            if not storage.exists(uri):
                raise ConfigError(f"Shard {uri} listed in {self.paths.manifest} is missing: "
                                  f"{rebuild_hint(self.paths)}.")
            size = storage.filesystem(uri).size(uri)
            if shard.get("bytes") is not None and size != shard["bytes"]:
                raise ConfigError(f"Shard {uri} is corrupted or truncated ({size} bytes, manifest says "
                                  f"{shard['bytes']}); retrying cannot fix it: {rebuild_hint(self.paths)}.")
            if not checksums or "sha256" not in shard:  # a set brought from elsewhere has sizes only
                continue
            h = hashlib.sha256()
            with storage.filesystem(uri).open(uri, "rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    h.update(block)
            digest = h.hexdigest()
            if digest != shard["sha256"]:
                raise ConfigError(f"Shard {uri} is corrupted or truncated (sha256 {digest[:12]}…, manifest says "
                                  f"{shard['sha256'][:12]}…); retrying cannot fix it: {rebuild_hint(self.paths)}.")

    def summary(self) -> dict:
        """Per-split counts: records, tokens, shard files, rows, characters, articles."""
        return {s: {k: e.get(k) for k in ("records", "tokens", "rows", "characters", "articles")}
                | {"shards": len(e["shards"])} for s, e in self.data["splits"].items()}


def manifest_extra(cfg: PipelineConfig, corpus, corpus_fingerprint: str, paths: DataPaths, tokenizer) -> dict:
    """What the manifest says besides the shards: vocabulary, tokenizer hash, source, credit, special ids."""
    return {
        "vocab_size": len(tokenizer),
        "tokenizer_sha256": hashlib.sha256(
            storage.read_bytes(join(paths.tokenizer, "tokenizer.json"))).hexdigest(),
        "corpus_source": cfg.corpus.source,
        "corpus_fingerprint": corpus_fingerprint,
        "credit": corpus.credit,
        "special_ids": {"pad": tokenizer.pad_token_id, "mask": tokenizer.mask_token_id,
                        "bos": tokenizer.cls_token_id, "eos": tokenizer.sep_token_id},
    }
