"""Bring your own shards: TFRecord shards tokenized elsewhere (corpus.shards_uri, corpus.tokenizer_uri).

Adoption (`shard_set.adopt`) reads every record; `check_shards` (validate) the first records of a few shards
per split. docs/data.md#bring-your-own-shards
"""

from __future__ import annotations

import hashlib
import json
import logging
from functools import cached_property
from itertools import islice

from mlm_tasks import storage
from mlm_tasks.config import CorpusConfig, PipelineConfig
from mlm_tasks.data.corpus.base import Corpus
from mlm_tasks.data.tfrecord import FEATURES, count_records, iter_records, parse_example, records_from_name
from mlm_tasks.data.word_mask import check_word_starts
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import SPLITS, join

log = logging.getLogger(__name__)
SAMPLE_SHARDS, SAMPLE_RECORDS = 8, 64  # per split: what check_shards reads


def list_shards(shards_uri: str) -> dict[str, list[dict]]:
    """Per split, the *.tfrecord files under `<shards_uri>/<split>/`, by name: uri, bytes, version."""
    found: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for split in SPLITS:
        for name, info in sorted(storage.find(join(shards_uri, split)).items()):
            if not name.endswith(".tfrecord") or info.get("type") == "directory":
                continue
            uri = name if storage.is_local(shards_uri) else f"gs://{name.removeprefix('gs://')}"
            # gs:// objects carry a generation (changes on every overwrite); local files an mtime.
            version = info.get("generation") or info.get("mtime") or info.get("updated")
            found[split].append({"uri": uri, "bytes": int(info["size"]), "version": str(version)})
    return found


class ShardsCorpus(Corpus):
    """A corpus of already tokenized shards: a fingerprint and a manifest, no text rows."""

    def __init__(self, cfg: CorpusConfig):
        if not cfg.shards_uri or not cfg.tokenizer_uri:
            raise ConfigError(
                "corpus.source=tfrecord_shards needs corpus.shards_uri (the folder or gs:// prefix "
                "of the shards) and corpus.tokenizer_uri (the tokenizer they were encoded with)."
            )
        self.cfg, self.tokenizer_uri = cfg, cfg.tokenizer_uri
        self.files = list_shards(cfg.shards_uri)
        for split in ("train", "validation"):
            if not self.files[split]:
                raise ConfigError(
                    f"No {split} shards under {join(cfg.shards_uri, split)}: corpus.shards_uri must "
                    "hold train/ and validation/ folders of *.tfrecord files."
                )
        self.credit = (
            f"Shards brought from {cfg.shards_uri} (tokenizer {cfg.tokenizer_uri}); see their source "
            "for license and credit."
        )

    @cached_property
    def tokenizer_json(self) -> str:
        """tokenizer.json of a local folder, a gs:// folder, or a Hub repo (its main, through huggingface_hub)."""
        from mlm_tasks.base_model import BaseModelRef

        return BaseModelRef(self.tokenizer_uri, setting="corpus.tokenizer_uri").tokenizer_json()

    def fingerprint(self) -> str:
        listing = [[split, f["uri"], f["bytes"], f["version"]] for split in SPLITS for f in self.files[split]]
        tok = hashlib.sha256(self.tokenizer_json.encode("utf-8")).hexdigest()
        return "shards:" + hashlib.sha256(json.dumps([listing, tok]).encode()).hexdigest()[:32]

    def rows_partition(self, split: str, part: int, num_parts: int):
        raise ConfigError(
            "corpus.source=tfrecord_shards holds token ids, not text: it trains no tokenizer and "
            "writes no shards (the DAG's plan step adopts the set as it is)."
        )

    def split_entry(self, split: str, max_length: int) -> dict:
        """The manifest entry of one split: shards by URI, their records counted (and checked against the names)."""
        shards = []
        for f in self.files[split]:
            with storage.filesystem(f["uri"]).open(f["uri"], "rb") as fh:
                records = count_records(fh, f["uri"])  # every record's checksums: a damaged file fails here
            named = records_from_name(f["uri"])
            if named is not None and named != records:
                raise ConfigError(
                    f"{f['uri']} holds {records} whole records but its name says {named}: the file "
                    "was cut short (at a record boundary) or renamed. Copy it again from its source, "
                    "or remove it from the shard set."
                )
            shards.append({**f, "file": f["uri"].rsplit("/", 1)[-1], "records": records})  # f: uri, bytes, version
        log.info("%s: checked every record of %d shard(s)", split, len(shards))
        records = sum(s["records"] for s in shards)
        return {"records": records, "tokens": records * max_length, "rows": None, "characters": None, "shards": shards}


def check_shards(cfg: PipelineConfig, corpus: ShardsCorpus) -> int:
    """The max_length of the shards, their features and ids checked on the first records of a few per split."""
    from mlm_tasks.base_model import read_tokenizer_json

    tok = read_tokenizer_json(corpus.tokenizer_json, f"corpus.tokenizer_uri {cfg.corpus.tokenizer_uri}")
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if cfg.train.whole_word_mask:
        check_word_starts(tok.get_vocab(with_added_tokens=True), f"corpus.tokenizer_uri {cfg.corpus.tokenizer_uri}")
    first: tuple[str, int] | None = None  # where the first record was, and its length
    for split in SPLITS:
        for f in corpus.files[split][:SAMPLE_SHARDS]:
            with storage.filesystem(f["uri"]).open(f["uri"], "rb") as fh:
                for i, (offset, record) in enumerate(islice(iter_records(fh, f["uri"]), SAMPLE_RECORDS)):
                    where = f"{f['uri']} record {i} (byte {offset})"
                    ids = _record_ids(record, where)
                    if first is None:
                        first = (where, len(ids))
                    elif len(ids) != first[1]:
                        raise ConfigError(
                            f"{where} holds {len(ids)} ids but {first[0]} {first[1]}: training needs "
                            "one fixed length (packed chunks); rewrite the shards with one length."
                        )
                    if ids and (max(ids) >= vocab or min(ids) < 0):
                        raise ConfigError(
                            f"{where}: token id {max(ids) if max(ids) >= vocab else min(ids)} is "
                            f"outside the vocabulary of {cfg.corpus.tokenizer_uri} ({vocab} tokens): "
                            "these shards were encoded with another tokenizer; set "
                            "corpus.tokenizer_uri to that one."
                        )
    if first is None:
        raise ConfigError(
            f"The first shards under {cfg.corpus.shards_uri} hold no records: remove the empty "
            "files, or point corpus.shards_uri at the set that holds the data."
        )
    length = first[1]
    if length != cfg.shards.max_length:
        raise ConfigError(
            f"The shards under {cfg.corpus.shards_uri} hold {length}-token records but "
            f"shards.max_length is {cfg.shards.max_length}: set shards.max_length={length} "
            f"(and model.max_position_embeddings >= {length + 2})."
        )
    return length


def _record_ids(record: bytes, where: str) -> list[int]:
    """input_ids of one record, which must be a tf.train.Example with both features as int64 lists of one length."""
    try:
        features = parse_example(record)
    except ValueError as err:  # UnicodeDecodeError too
        raise ConfigError(
            f"{where} is not a tf.train.Example ({err}): these shards need {' and '.join(FEATURES)} "
            "as int64 features (as prepare_tfrecord_shards.py writes them)."
        ) from None
    lists: dict[str, list[int]] = {}
    for name in FEATURES:
        value = features.get(name, "absent")
        if not isinstance(value, list):
            raise ConfigError(
                f"{where}: feature {name!r} is {value}, not an int64 list: these shards need "
                f"{' and '.join(FEATURES)} as int64 features (as prepare_tfrecord_shards.py writes "
                f"them). Found: {sorted(features)}."
            )
        lists[name] = value
    ids = lists["input_ids"]
    if len(lists["attention_mask"]) != len(ids):
        raise ConfigError(
            f"{where}: input_ids has {len(ids)} values but attention_mask "
            f"{len(lists['attention_mask'])}: the shards are malformed."
        )
    return ids
