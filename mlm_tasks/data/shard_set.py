"""The shard set: its fingerprint, its manifest (the source of truth), its summary, adopting brought shards.

    fp = data_fingerprint(cfg, corpus); shard_set = load_manifest(cfg, fp)   # ShardSet.load: needs _SUCCESS
    shard_set.shard_uris("train"), shard_set.records("train"), shard_set.verify("train")
docs/data.md#the-shard-set-fingerprint-and-manifest
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass

from mlm_tasks import storage
from mlm_tasks.base_model import BaseModelRef, read_tokenizer_json, tokenizer_ref
from mlm_tasks.config import PipelineConfig
from mlm_tasks.data.corpus import open_corpus
from mlm_tasks.data.corpus.shards import ShardsCorpus, check_shards
from mlm_tasks.data.tokenizer import SPARE, add_spare_tokens, load_tokenizer, save_tokenizer, train_subwords
from mlm_tasks.errors import ConfigError, MissingArtifactError
from mlm_tasks.paths import SPLITS, DataPaths, join
from mlm_tasks.results import DataSummary

log = logging.getLogger(__name__)
MANIFEST_VERSION = 3  # part of the fingerprint: a new layout never reads an old set


def rebuild_hint(paths: DataPaths) -> str:
    """What to delete so the next run rebuilds this shard set (the tokenizer is kept)."""
    return (
        f"delete {paths.shards_dir} and {paths.partitions_dir}, then rerun build_shard_set (or the DAG) to "
        "rebuild the shard set"
    )


def publish_manifest(paths: DataPaths, max_length: int, records_per_shard: int, splits: dict, extra: dict) -> ShardSet:
    """Write manifest.json (the one place its fields are named), then _SUCCESS: last, as readers trust it."""
    manifest = {
        "version": MANIFEST_VERSION,
        "fingerprint": paths.fingerprint,
        "max_length": max_length,
        "records_per_shard": records_per_shard,
        "features": ["input_ids", "attention_mask"],
        "splits": splits,
        **extra,
    }
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
            raise MissingArtifactError(
                f"No complete shard set under {paths.shards_dir} (no _SUCCESS): run "
                "build_shard_set first (or the DAG) or check output_root and the data "
                "fingerprint."
            )
        try:
            data = json.loads(storage.read_bytes(paths.manifest))
            if not isinstance(data, dict) or not isinstance(data.get("splits"), dict):
                raise ValueError("not a manifest object with 'splits'")
        except FileNotFoundError:
            raise ConfigError(
                f"{paths.manifest} is missing although {paths.success} exists: {rebuild_hint(paths)}."
            ) from None
        except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
            raise ConfigError(
                f"{paths.manifest} is damaged ({type(err).__name__}: {err}): {rebuild_hint(paths)}."
            ) from None
        return cls(paths, data)

    fingerprint = property(lambda self: self.data["fingerprint"])
    max_length = property(lambda self: int(self.data["max_length"]))
    vocab_size = property(lambda self: int(self.data["vocab_size"]))
    tokenizer_sha256 = property(lambda self: self.data.get("tokenizer_sha256"))
    special_ids = property(lambda self: self.data.get("special_ids", {}))
    splits = property(lambda self: list(self.data["splits"]))
    base_model = property(lambda self: self.data.get("base_model"))  # model.init_from's identity and shape

    def entry(self, split: str) -> dict:
        if split not in self.data["splits"]:
            raise ConfigError(
                f"The shard set {self.paths.shards_dir} has no {split!r} split (has "
                f"{self.splits}): choose one of those."
            )
        return self.data["splits"][split]

    def records(self, split: str) -> int:
        return int(self.entry(split)["records"])

    def sources(self, split: str) -> dict[str, dict]:
        """A mixture's per-source counts of `split` by name; {} for a single source."""
        return self.entry(split).get("sources", {})

    def source_shard_uris(self, split: str) -> dict[str, list[str]]:
        """A mixture's shards of `split` by source, in manifest order ({} for a single source)."""
        found: dict[str, list[str]] = {name: [] for name in self.sources(split)}
        for shard, uri in zip(self.shards(split), self.shard_uris(split), strict=True):
            if "source" in shard:
                found.setdefault(shard["source"], []).append(uri)
        return found

    def tokens(self, split: str) -> int:
        return int(self.entry(split)["tokens"])

    def shards(self, split: str) -> list[dict]:
        return self.entry(split)["shards"]

    def shard_uris(self, split: str) -> list[str]:
        """Written shards are named relative to the set's folder; brought ones carry their own `uri`."""
        return [s.get("uri") or join(self.paths.shards_dir, s["file"]) for s in self.shards(split)]

    def verify(self, split: str, checksums: bool = True) -> None:
        """ConfigError (no retry) on a missing, truncated or corrupted shard; checksums=False: sizes only."""
        for shard, uri in zip(self.shards(split), self.shard_uris(split), strict=False):
            if not storage.exists(uri):
                raise ConfigError(
                    f"Shard {uri} listed in {self.paths.manifest} is missing: {rebuild_hint(self.paths)}."
                )
            size = storage.size(uri)
            if shard.get("bytes") is not None and size != shard["bytes"]:
                raise ConfigError(
                    f"Shard {uri} is corrupted or truncated ({size} bytes, manifest says "
                    f"{shard['bytes']}); retrying cannot fix it: {rebuild_hint(self.paths)}."
                )
            if not checksums or "sha256" not in shard:  # a set brought from elsewhere has sizes only
                continue
            digest = storage.sha256(uri)
            if digest != shard["sha256"]:
                raise ConfigError(
                    f"Shard {uri} is corrupted or truncated (sha256 {digest[:12]}…, manifest says "
                    f"{shard['sha256'][:12]}…); retrying cannot fix it: {rebuild_hint(self.paths)}."
                )


def manifest_extra(cfg: PipelineConfig, corpus, corpus_fingerprint: str, paths: DataPaths, tokenizer) -> dict:
    """What the manifest says besides the shards: vocabulary, tokenizer, source, credit, special ids, base model."""
    base = BaseModelRef.of(cfg)
    ref = base or tokenizer_ref(cfg)
    sha256 = storage.sha256(join(paths.tokenizer, "tokenizer.json"))
    added = tokenizer.backend_tokenizer.get_added_tokens_decoder().values()
    return {
        **({"base_model": {**base.identity(), "kind": base.kind, **base.shape()}} if base else {}),
        "vocab_size": len(tokenizer),
        "tokenizer_sha256": sha256,
        "tokenizer": {
            "model": json.loads(tokenizer.backend_tokenizer.to_str())["model"]["type"].lower(),
            "from_pretrained": ref.uri if ref else None,
            "revision": ref.identity()["revision"] if ref else None,
            "spare_tokens": sum(bool(SPARE.fullmatch(t.content)) for t in added),
            "sha256": sha256,
        },
        "corpus_source": cfg.corpus.source,
        "corpus_fingerprint": corpus_fingerprint,
        "credit": corpus.credit,
        # A mixture's sources: name, kind, credit (their counts are in each split's `sources`).
        **({"mixture": corpus.manifest_sources()} if hasattr(corpus, "manifest_sources") else {}),
        "special_ids": {
            "pad": tokenizer.pad_token_id,
            "mask": tokenizer.mask_token_id,
            "bos": tokenizer.cls_token_id,
            "eos": tokenizer.sep_token_id,
        },
    }


def data_fingerprint(cfg: PipelineConfig, corpus=None, corpus_fingerprint: str | None = None) -> str:
    """The shard set's key: the corpus content (fingerprinted unless given) and every setting that changes it."""
    if corpus_fingerprint is None:
        corpus_fingerprint = (corpus or open_corpus(cfg.corpus)).fingerprint()
    key = {"corpus": corpus_fingerprint, "max_length": cfg.shards.max_length, "manifest_version": MANIFEST_VERSION}
    if cfg.corpus.source != "tfrecord_shards":  # shards brought as they are: no setting of ours changes them
        c, base = cfg.corpus, BaseModelRef.of(cfg)
        key |= {
            "splits": [c.validation_fraction, c.test_fraction, c.split_by, c.document_column],
            "text_column": c.text_column,  # the same files, another column: other rows
            # The base's tokenizer encodes the shards (tokenizer.* is not used then); else ours, reused or trained.
            **({"base_model": base.identity()} if base else {"tokenizer": tokenizer_key(cfg)}),
            "records_per_shard": cfg.shards.records_per_shard,
            "filters": c.filters.model_dump(),
            "dedup": cfg.dedup.model_dump(),
        }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def data_summary(
    shard_set: ShardSet, cache_hit: bool, written_here: bool = False, weights: dict[str, float] | None = None
) -> DataSummary:
    """The summary of a complete shard set; `weights`: a mixture's (config_weights), shown per source."""
    paths, manifest, splits = shard_set.paths, shard_set.data, shard_set.data["splits"]
    return {
        "fingerprint": paths.fingerprint,
        "data_root": paths.root,
        "tokenizer_uri": paths.tokenizer,
        "manifest_uri": paths.manifest,
        "success_uri": paths.success,
        "cache_hit": cache_hit,
        "written_here": written_here,
        "vocab_size": shard_set.vocab_size,
        "max_length": shard_set.max_length,
        "records": {s: shard_set.records(s) for s in splits},
        "tokens": {s: shard_set.tokens(s) for s in splits},
        "shards": {s: len(shard_set.shards(s)) for s in splits},
        "base_model": shard_set.base_model,
        "corpus": {
            "rows": sum(splits[s].get("rows") or 0 for s in splits),
            "articles": sum(splits[s].get("articles") or 0 for s in splits) or None,
            "characters": sum(splits[s].get("characters") or 0 for s in splits),
            "source": manifest["corpus_source"],
            "credit": manifest.get("credit", ""),
            "data_card": manifest.get("data_card"),  # what the filters and the dedup removed, the tokenizer's sample
            "tokenizer": manifest.get("tokenizer"),  # its model, where it came from, spare tokens, sha256
            "sources": source_summary(shard_set, weights or {}),
        },
    }


def source_summary(shard_set: ShardSet, weights: dict[str, float]) -> dict[str, dict]:
    """A mixture's sources by name: kind, credit, the run's weight and counts per split; {} for a single source."""
    about = {m["name"]: m for m in shard_set.data.get("mixture", [])}
    out: dict[str, dict] = {}
    for name in shard_set.sources("train"):
        counts = {s: shard_set.sources(s).get(name, {}) for s in shard_set.splits}
        out[name] = {
            "kind": about.get(name, {}).get("source"),
            "credit": about.get(name, {}).get("credit", ""),
            "weight": weights.get(name),
            **{k: {s: c.get(k, 0) for s, c in counts.items()} for k in ("records", "tokens", "rows", "characters")},
        }
    return out


def config_weights(cfg: PipelineConfig) -> dict[str, float]:
    """The mixture's weights by source name ({} for a single source)."""
    return {s.name: s.weight for s in cfg.corpus.mixture}


def source_weights(cfg: PipelineConfig, shard_set: ShardSet) -> dict[str, float] | None:
    """The run's corpus.mixture weight of each source of the set (None: a single source); both must name the same."""
    written, asked = list(shard_set.sources("train")), config_weights(cfg)
    if not written and not asked:
        return None
    if sorted(written) != sorted(asked):
        raise ConfigError(
            f"The shard set {shard_set.paths.shards_dir} holds the sources {written or '(a single source)'} but "
            f"the run's corpus.mixture names {list(asked) or '(none)'}: weights are matched by name, so give "
            "corpus.mixture exactly the set's sources (or train on the shard set of this mixture)."
        )
    return {name: asked[name] for name in written}


def is_complete(cfg: PipelineConfig, fingerprint: str) -> bool:
    """Whether a complete shard set (its `_SUCCESS`) has this fingerprint under output_root."""
    return storage.exists(DataPaths(cfg.output_root, fingerprint).success)


def summary_for_fingerprint(cfg: PipelineConfig, fingerprint: str) -> DataSummary:
    """The summary of an already prepared shard set, by fingerprint (e.g. from a dataset-refresh event)."""
    paths = DataPaths(cfg.output_root, fingerprint)
    if not storage.exists(paths.success):
        raise MissingArtifactError(
            f"No complete shard set for fingerprint {fingerprint} under {paths.shards_dir}: "
            "was it deleted? Rerun mlm_dataset_refresh or trigger mlm_pretrain manually."
        )
    log.info("Using the shard set with fingerprint %s at %s", fingerprint, paths.shards_dir)
    return data_summary(ShardSet.load(paths), cache_hit=True, weights=config_weights(cfg))


def tokenizer_key(cfg: PipelineConfig) -> dict:
    """The tokenizer in the fingerprint: a reused one's identity, or the trainer's settings (those at their
    first defaults left out, so older sets keep their key)."""
    t, ref = cfg.tokenizer, tokenizer_ref(cfg)
    if ref is not None:
        return {"from_pretrained": ref.identity(), "reserved_tokens": t.reserved_tokens}
    first = {"model": "unigram", "reserved_tokens": 0}
    return {k: v for k, v in t.model_dump(exclude={"from_pretrained", "revision"}).items() if first.get(k, -1) != v}


def ensure_tokenizer(cfg: PipelineConfig, rows, paths: DataPaths) -> None:
    """The tokenizer of this fingerprint, unless it exists: trained on `rows` (first writer wins), or reused
    (model.init_from's, or tokenizer.from_pretrained plus tokenizer.reserved_tokens spares)."""
    if storage.exists(join(paths.tokenizer, "tokenizer.json")):
        log.info("Reusing the tokenizer already made for this fingerprint: %s", paths.tokenizer)
        return
    t0, ref = time.time(), tokenizer_ref(cfg)
    if ref is None:
        tok = train_subwords(rows, cfg.tokenizer)
        how = f"Trained a {cfg.tokenizer.model} tokenizer in {time.time() - t0:.1f}s"
    else:
        tok = read_tokenizer_json(ref.tokenizer_json(), f"{ref.setting} {ref.uri}")
        # Rows are packed into chunks after encoding: a reused truncation or padding would cut long rows.
        tok.no_truncation()
        tok.no_padding()
        revision = ref.identity()["revision"]
        how = f"Using the tokenizer of {ref.setting} {ref.uri} (revision {revision}): no tokenizer is trained"
    spares = 0 if cfg.model.init_from else add_spare_tokens(tok, cfg.tokenizer.reserved_tokens)
    save_tokenizer(tok, paths.tokenizer, cfg.shards.max_length)
    log.info("%s (vocab %d, %d spare tokens) -> %s", how, tok.get_vocab_size(), spares, paths.tokenizer)


def adopt(cfg: PipelineConfig, corpus: ShardsCorpus, paths: DataPaths, corpus_fingerprint: str) -> None:
    """Publish the tokenizer and a manifest of the brought shards under `paths`, then _SUCCESS."""
    from tokenizers import Tokenizer

    max_length = check_shards(cfg, corpus)
    save_tokenizer(Tokenizer.from_str(corpus.tokenizer_json), paths.tokenizer, max_length)
    tokenizer = load_tokenizer(paths.tokenizer, max_length)
    splits = {split: corpus.split_entry(split, max_length) for split in SPLITS}
    extra = {
        **manifest_extra(cfg, corpus, corpus_fingerprint, paths, tokenizer),
        "shards_uri": cfg.corpus.shards_uri,
        "tokenizer_uri": cfg.corpus.tokenizer_uri,
    }
    publish_manifest(paths, max_length, 0, splits, extra)
    log.info(
        "Adopted the shards under %s as data %s: %s",
        cfg.corpus.shards_uri,
        paths.fingerprint,
        ", ".join(f"{s} {e['records']} records in {len(e['shards'])} files" for s, e in splits.items()),
    )


def load_manifest(cfg: PipelineConfig, fingerprint: str) -> ShardSet:
    """The complete shard set of `fingerprint`, checked against what this run asks for."""
    paths = DataPaths(cfg.output_root, fingerprint)
    shard_set = ShardSet.load(paths)
    if shard_set.max_length != cfg.shards.max_length:
        raise ConfigError(
            f"The shards at {paths.shards_dir} were built with max_length "
            f"{shard_set.max_length} but this run asks for {cfg.shards.max_length}: "
            "prepare data with the run's max_length, or set max_length to match."
        )
    if storage.sha256(join(paths.tokenizer, "tokenizer.json")) != shard_set.tokenizer_sha256:
        raise ConfigError(
            f"The tokenizer at {paths.tokenizer} is not the one the shards were encoded "
            "with (sha256 differs): delete the dataset folder and rerun plan_shards."
        )
    return shard_set
