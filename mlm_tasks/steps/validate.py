"""Step validate: the checks that need I/O (corpus, output_root, credentials, base model, downstream files).
python -m mlm_tasks validate --config configs/default.yaml"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from mlm_tasks import storage
from mlm_tasks.base_model import BaseModelRef, check_base, read_tokenizer_json, tokenizer_ref
from mlm_tasks.config import PipelineConfig
from mlm_tasks.credentials import check_gcs_credentials
from mlm_tasks.data.corpus import open_corpus
from mlm_tasks.data.corpus.base import empty_corpus_error
from mlm_tasks.data.corpus.mixture import MixtureCorpus
from mlm_tasks.data.corpus.shards import ShardsCorpus, check_shards
from mlm_tasks.data.word_mask import check_tokenizer_words
from mlm_tasks.downstream.tasks import load_task
from mlm_tasks.errors import ConfigError
from mlm_tasks.output_root import check_output_root_reachable, check_writable
from mlm_tasks.results import ValidatedConfig

log = logging.getLogger(__name__)


def check_local_corpus(corpus) -> None:
    """Read local files once: undecodable bytes and an empty corpus fail now, not after an hour of work."""
    if not sum(1 for _ in corpus.rows("train")):  # decodes every line of every file
        raise empty_corpus_error()


def validate(
    cfg: PipelineConfig,
    *,
    distributed_executor: str | None = None,
    shared_roots: Sequence[str] = (),
    probe_write: bool = True,
) -> ValidatedConfig:
    """Every check that needs I/O; the config as a JSON-ready dict. `probe_write=False` leaves output_root
    untouched (a dataset refresh of an unchanged source writes nothing; plan_shards probes it before writing)."""
    check_output_root_reachable(cfg.output_root, distributed_executor, shared_roots)
    corpus = open_corpus(cfg.corpus)  # raises ConfigError for missing paths and bad file types
    if cfg.corpus.source == "local_files":
        check_local_corpus(corpus)
    for source in cfg.corpus.mixture:  # a mixture's local sources are read the same way, each on its own
        if source.source == "local_files" and isinstance(corpus, MixtureCorpus):
            try:
                check_local_corpus(corpus.sources[source.name])
            except ConfigError as err:
                raise ConfigError(f"corpus.mixture source {source.name!r}: {err}") from None
    if isinstance(corpus, ShardsCorpus):  # corpus.source tfrecord_shards
        check_shards(cfg, corpus)  # features, max_length, ids within the tokenizer's vocabulary
    if storage.scheme(cfg.output_root) == "gs":
        check_gcs_credentials(cfg.output_root)
    base = BaseModelRef.of(cfg)
    reused = base or tokenizer_ref(cfg)  # the tokenizer that encodes the shards, when none is trained
    if base is not None:
        check_base(cfg, base)  # the shape, positions and tokenizer of the base against the run's settings
        log.info(
            "Continuing from %s%s: %s; model.preset and tokenizer.* are not used",
            base.uri,
            f"@{base.revision}" if base.revision else "",
            ", ".join(f"{k} {v}" for k, v in base.shape().items()),
        )
    elif reused is not None:  # tokenizer.from_pretrained: its special tokens, before any work
        read_tokenizer_json(reused.tokenizer_json(), f"tokenizer.from_pretrained {reused.uri}")
    if reused is not None and cfg.train.whole_word_mask:  # it encodes the shards: its words must be findable
        check_tokenizer_words(reused.tokenizer_json(), f"{reused.setting} {reused.uri}")
    for task in cfg.downstream.tasks:
        if task.source == "files":  # read now: a missing file or column fails before training, not after
            load_task(task, cfg.corpus)
    if probe_write:
        check_writable(cfg.output_root)
    log.info(
        "Configuration valid: corpus %s, output_root %s, compute %s, preset %s",
        cfg.corpus.source,
        cfg.output_root,
        cfg.compute,
        cfg.model.preset,
    )
    return cfg.model_dump(mode="json")
