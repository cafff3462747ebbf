"""Data settings: where the text comes from, which rows are kept, the tokenizer and the shards."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from mlm_tasks.config.section import Section
from mlm_tasks.errors import ConfigError

SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
MAX_PARTITIONS = 1024  # shard-writing tasks one run may map


# C4's boilerplate substrings (datatrove's C4QualityFilter), but not bare "javascript": Wikipedia explains it.
DEFAULT_BOILERPLATE_PHRASES = [
    "lorem ipsum",
    "enable javascript",
    "javascript is disabled",
    "terms of use",
    "privacy policy",
    "cookie policy",
    "uses cookies",
    "use of cookies",
    "use cookies",
]


class FilterConfig(Section):
    """Rule filters and language ID per row (docs/data.md#filters); each rule has a value that turns it off."""

    enabled: bool = Field(True, description="Apply the filters below; false keeps every row.")
    min_words: int = Field(1, ge=0, le=10_000, description="Drop rows with fewer words (0: off).")
    max_words: int = Field(100_000, ge=1, le=10**7, description="Drop rows with more words (Gopher's page limit).")
    max_word_chars: int = Field(1000, ge=1, le=10**7, description="Drop rows with a longer word (C4: 1000).")
    ratio_min_words: int = Field(3, ge=1, le=10_000, description="Shorter rows skip the ratio rules.")
    min_mean_word_length: float = Field(2.0, ge=0, le=100, description="Drop rows of shorter mean word (0: off).")
    max_mean_word_length: float = Field(12.0, ge=1, le=10_000, description="Drop rows of longer mean word (Gopher 10).")
    min_alpha_word_fraction: float = Field(0.5, ge=0, le=1, description="Least share of words with a letter (0: off).")
    max_symbol_word_ratio: float = Field(0.1, ge=0, le=1000, description="Most '#' or ellipses per word (1000: off).")
    max_duplicate_ngram_fraction: float = Field(0.15, ge=0, le=1, description="Most chars in repeated 5-grams (1 off).")
    min_stop_words: int = Field(0, ge=0, le=1000, description="Least stop words a row holds (0: off; Gopher: 2).")
    require_end_punctuation: bool = Field(False, description="Drop rows not ending in . ? ! \" ' (C4's line rule).")
    drop_curly_brackets: bool = Field(True, description="Drop rows holding '{', which is code, not prose (C4).")
    boilerplate_phrases: list[str] = Field(
        default_factory=DEFAULT_BOILERPLATE_PHRASES.copy, description="Drop rows holding any phrase listed ([]: off)."
    )
    languages: list[str] = Field(default_factory=list, description="Keep rows in these ISO 639-1 languages ([]: off).")
    min_language_score: float = Field(0.5, ge=0, le=1, description="Least language-ID probability a kept row has.")
    language_min_chars: int = Field(100, ge=1, le=100_000, description="Shorter rows skip language ID.")

    @model_validator(mode="after")
    def _ranges_and_codes(self) -> FilterConfig:
        if self.min_words > self.max_words:
            raise ConfigError(
                f"corpus.filters.min_words {self.min_words} is above max_words {self.max_words}: lower it."
            )
        if self.min_mean_word_length > self.max_mean_word_length:
            raise ConfigError(
                f"corpus.filters.min_mean_word_length {self.min_mean_word_length:g} is above max_mean_word_length "
                f"{self.max_mean_word_length:g}: every row would be dropped; lower it."
            )
        wrong = [code for code in self.languages if not re.fullmatch(r"[a-z]{2,3}", code)]
        if wrong:
            raise ConfigError(
                f"corpus.filters.languages {wrong} are not ISO 639 codes: give lowercase codes such as en, de, fr."
            )
        if any(not phrase.strip() for phrase in self.boilerplate_phrases):
            raise ConfigError(
                "corpus.filters.boilerplate_phrases holds an empty phrase, which every row contains: remove it."
            )
        return self


TextSource = Literal["embedded_wiki", "hf_dataset", "local_files", "wiki_dump"]


class TextSourceSettings(Section):
    """What a text source reads: corpus.* for one source, and each corpus.mixture source's own."""

    hf_path: str = Field("Salesforce/wikitext", description="`datasets` path (source=hf_dataset).")
    hf_name: str | None = Field("wikitext-103-raw-v1", description="`datasets` config name.")
    hf_revision: str | None = Field(None, description="Dataset revision (commit/tag); pins the data.")
    text_column: str = Field("text", description="Column holding the text in datasets/jsonl/parquet.")
    local_paths: list[str] = Field(default_factory=list, description="Files or globs (local_files), local or gs://.")
    split_by: Literal["row", "file", "document"] = Field("row", description="local_files: what the split hashes.")
    document_column: str | None = Field(None, description="split_by=document: the document id column.")
    dump_path: str | None = Field(None, description="Path of an enwiki pages-articles*.xml.bz2 dump (wiki_dump).")
    max_articles: int | None = Field(None, ge=1, le=10**9, description="Read at most this many articles (dumps).")


class MixtureSource(TextSourceSettings):
    """One source of a mixture (corpus.mixture): a text source, its settings, and its weight in training."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$", description="Short unique name; it names its shards.")
    weight: float = Field(1.0, gt=0, le=100.0, description="Relative share of train examples drawn.")
    source: TextSource = Field("local_files", description="Where its text comes from (a text source).")

    @field_validator("source", mode="before")
    @classmethod
    def _text_source(cls, value: Any) -> Any:
        why = {
            "tfrecord_shards": "shards brought as they are hold token ids of their own tokenizer",
            "mixture": "a mixture holds no mixture: list those sources in this one",
        }
        if value in why:
            raise ConfigError(
                f"corpus.mixture source {value!r} cannot be mixed ({why[value]}): use a text source "
                "(embedded_wiki, hf_dataset, local_files, wiki_dump)."
            )
        return value


# Top-level source settings a mixture does not read (each source has its own): setting one is a mistake.
_SINGLE_SOURCE_SETTINGS = (
    "local_paths",
    "dump_path",
    "max_articles",
    "hf_revision",
    "document_column",
    "shards_uri",
    "tokenizer_uri",
)


class CorpusConfig(TextSourceSettings):
    source: Literal[TextSource, "tfrecord_shards", "mixture"] = Field("embedded_wiki", description="The text's source.")
    validation_fraction: float = Field(0.05, ge=0.0, lt=0.5, description="Share held out for validation.")
    test_fraction: float = Field(0.05, ge=0.0, lt=0.5, description="Share held out for test.")
    shards_uri: str | None = Field(None, description="source=tfrecord_shards: where the shards are.")
    tokenizer_uri: str | None = Field(None, description="source=tfrecord_shards: their tokenizer.")
    filters: FilterConfig = Field(default_factory=FilterConfig, description="Which rows to drop before tokenizing.")
    mixture: list[MixtureSource] = Field(default_factory=list, max_length=32, description="The mixture's sources.")

    @model_validator(mode="after")
    def _mixture_and_split(self) -> CorpusConfig:
        names = [s.name for s in self.mixture]
        if self.mixture and self.source != "mixture":
            raise ConfigError(
                f"corpus.mixture names sources {names} but corpus.source is {self.source!r}: set "
                "corpus.source: mixture (the form's Corpus source too), or remove corpus.mixture."
            )
        if self.source == "mixture" and not self.mixture:
            raise ConfigError(
                "corpus.source=mixture needs corpus.mixture: a list of sources, each with name, weight, source "
                "and its settings, e.g. [{name: wiki, source: embedded_wiki, weight: 1}] (docs/data.md#mixtures)."
            )
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ConfigError(f"corpus.mixture repeats the name(s) {repeated}: give each source its own name.")
        if self.source == "mixture":
            stray = [k for k in _SINGLE_SOURCE_SETTINGS if getattr(self, k)]
            if stray:
                raise ConfigError(
                    f"corpus.source=mixture reads each source's own settings, not corpus.{', corpus.'.join(stray)}: "
                    "move them into the corpus.mixture entry they belong to."
                )
            for part in self.mixture:  # each source's own checks (split_by, document_column), naming it
                try:
                    self.for_source(part)
                except ValidationError as err:
                    why = "; ".join(str(e.get("ctx", {}).get("error", e["msg"])) for e in err.errors())
                    raise ConfigError(f"corpus.mixture source {part.name!r}: {why}") from None
        if self.split_by != "row" and self.source != "local_files":
            raise ConfigError(
                f"corpus.split_by={self.split_by} is for source=local_files: {self.source} splits its own way "
                "(Wikipedia by article title, a `datasets` dataset by its own splits); leave split_by=row."
            )
        if self.split_by == "document" and not self.document_column:
            raise ConfigError(
                "corpus.split_by=document needs corpus.document_column: the .jsonl/.parquet column with each "
                "row's document id."
            )
        return self

    def for_source(self, part: MixtureSource) -> CorpusConfig:
        """The single-source config of one mixture source: its own settings, the corpus-wide splits and filters."""
        shared = self.model_dump(include={"validation_fraction", "test_fraction", "filters"})
        return CorpusConfig.model_validate({**part.model_dump(exclude={"name", "weight"}), **shared})


class TokenizerConfig(Section):
    model: Literal["unigram", "bpe", "wordpiece"] = Field("unigram", description="Which trainer builds the tokenizer.")
    vocab_size: int = Field(8000, ge=1, le=250_000, description="Trained vocabulary size, specials included.")
    max_piece_length: int = Field(16, ge=2, le=64, description="Longest piece the Unigram or BPE trainer keeps.")
    reserved_tokens: int = Field(0, ge=0, le=4096, description="Spare tokens to append (then up to 64s).")
    from_pretrained: str | None = Field(None, description="Reuse this tokenizer: Hub repo id or folder.")
    revision: str | None = Field(None, description="Hub from_pretrained's branch, tag or commit.")
    sample_mb: int = Field(64, ge=1, le=100_000, description="MB of train text the tokenizer trains on, at most.")


class ShardConfig(Section):
    max_length: int = Field(128, ge=8, le=8192, description="Tokens per training example (chunk length).")
    records_per_shard: int = Field(2048, ge=1, le=1_000_000, description="TFRecord examples per shard file.")
    tokenize_batch_rows: int = Field(1000, ge=1, le=100_000, description="Rows per encode_batch call.")
    partitions: int = Field(1, ge=1, le=MAX_PARTITIONS, description="Shard-writing tasks, at least.")
    partition_mb: int = Field(256, ge=1, le=1 << 20, description="Target MiB of source per partition.")


class DedupConfig(Section):
    exact: bool = Field(True, description="Write each distinct row once.")
    near: bool = Field(False, description="Also drop near-duplicate rows (MinHash LSH).")
    near_threshold: float = Field(0.8, ge=0.5, le=0.99, description="Jaccard similarity of near-duplicates.")
    num_perm: int = Field(128, ge=16, le=512, description="MinHash permutations (more: sharper threshold, slower).")
    shingle_words: int = Field(5, ge=1, le=20, description="Words per shingle for near-duplicate detection.")
    near_min_words: int = Field(10, ge=1, le=10_000, description="Shorter rows are deduplicated exactly only.")
