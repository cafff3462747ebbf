"""One validated model of every setting of the pipeline.

Every setting has a default and a one-line description; unknown keys are errors, so a typo in a
DAG param or a YAML file fails before any work starts instead of silently using a default.

    cfg = load_config("configs/tiny.yaml", overrides={"train.steps": 50})
    cfg = config_from_params(dag_params)        # flat names from the Airflow trigger form

Cross-field checks that need no I/O live in `PipelineConfig`'s validators; checks that touch the
outside world (paths exist, credentials present) live in `mlm_tasks.steps.validate`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import check_safe_uri
from mlm_tasks.presets import PRESETS, ModelShape
from mlm_tasks.tpu import runtimes
from mlm_tasks.tpu import slices as tpu_slices

SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
SUPPORTED_SCHEMES = ("file", "gs")
MAX_CONFIG_BYTES = 1 << 20
MAX_PARTITIONS = 1024  # shard-writing tasks one run may map
HUB_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# C4's boilerplate substrings (tensorflow_datasets c4_utils, as datatrove's C4QualityFilter ships them), with
# bare "javascript" narrowed: C4 drops every line naming it, which would drop Wikipedia's paragraphs about the
# language; the boilerplate it aims at is "please enable JavaScript".
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


class FilterConfig(_Section):
    """Rule filters and language ID per row (mlm_tasks/data/filters, docs/data.md#filters). Each rule has a
    value that turns it off; the defaults drop under 3% of the embedded corpus's rows each."""

    enabled: bool = Field(True, description="Apply the filters below; false keeps every row.")
    min_words: int = Field(
        1, ge=0, le=10_000, description="Drop rows with fewer words (0: off; 1 drops rows of symbols only)."
    )
    max_words: int = Field(100_000, ge=1, le=10**7, description="Drop rows with more words (Gopher's page limit).")
    max_word_chars: int = Field(
        1000, ge=1, le=10**7, description="Drop rows with a longer word, e.g. base64 or a URL blob (C4: 1000)."
    )
    ratio_min_words: int = Field(
        3,
        ge=1,
        le=10_000,
        description="Rows with fewer words skip the ratio rules (word length, alphabetic, symbol, repetition): "
        "a ratio over one or two words (headings, table cells) says nothing.",
    )
    min_mean_word_length: float = Field(
        2.0, ge=0, le=100, description="Drop rows whose words average fewer characters (0: off; Gopher: 3)."
    )
    max_mean_word_length: float = Field(
        12.0, ge=1, le=10_000, description="Drop rows whose words average more characters (Gopher: 10)."
    )
    min_alpha_word_fraction: float = Field(
        0.5, ge=0, le=1, description="Drop rows where a smaller share of words holds a letter (0: off; Gopher: 0.8)."
    )
    max_symbol_word_ratio: float = Field(
        0.1, ge=0, le=1000, description="Drop rows with more '#' or ellipses per word (Gopher: 0.1; 1000: off)."
    )
    max_duplicate_ngram_fraction: float = Field(
        0.15,
        ge=0,
        le=1,
        description="Drop rows where a larger share of characters lies in repeated word 5-grams "
        "(Gopher: 0.15; 1: off).",
    )
    min_stop_words: int = Field(
        0,
        ge=0,
        le=1000,
        description="Drop rows with fewer of the words the, be, to, of, and, that, have, with (0: off; Gopher: 2, "
        "made for pages: it drops most headings, captions and list items).",
    )
    require_end_punctuation: bool = Field(
        False,
        description="Drop rows not ending in . ? ! \" ' (C4's line rule; off: it drops every heading and caption).",
    )
    drop_curly_brackets: bool = Field(True, description="Drop rows holding '{', which is code, not prose (C4).")
    boilerplate_phrases: list[str] = Field(
        default_factory=lambda: list(DEFAULT_BOILERPLATE_PHRASES),
        description="Drop rows containing any of these phrases, case-insensitively (C4's; []: off).",
    )
    languages: list[str] = Field(
        default_factory=list,
        description="Keep only rows whose most likely language (py3langid) is one of these ISO 639-1 codes, "
        "e.g. [en] ([]: off).",
    )
    min_language_score: float = Field(
        0.5,
        ge=0,
        le=1,
        description="And whose probability (normalized over py3langid's 97 languages) is at least this.",
    )
    language_min_chars: int = Field(
        100,
        ge=1,
        le=100_000,
        description="Shorter rows skip language ID: on titles, names and references it misreads English.",
    )

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
MIXTURE_MAX_WEIGHT = 100.0


class MixtureSource(_Section):
    """One source of a mixture (corpus.mixture): a text source, its settings, and its weight in training."""

    name: str = Field(
        pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$",
        description="Short name, unique in the mixture ([a-z0-9_-]): it names the source's shards "
        "(train-<name>-p00000of00001-00000-2048.tfrecord) and its counts in the manifest.",
    )
    weight: float = Field(
        1.0,
        gt=0,
        le=MIXTURE_MAX_WEIGHT,
        description="Relative share of the train examples drawn from this source (normalized over the mixture): "
        "above its natural share up-samples it (its records repeat), below down-samples it. Applied when "
        "training, so changing only the weights reuses the shard set.",
    )
    source: TextSource = Field(
        "local_files", description="Where this source's text comes from (as corpus.source; text sources only)."
    )
    hf_path: str = Field("Salesforce/wikitext", description="`datasets` path (source=hf_dataset).")
    hf_name: str | None = Field("wikitext-103-raw-v1", description="`datasets` config name.")
    hf_revision: str | None = Field(None, description="Dataset revision (commit/tag); pins the data.")
    text_column: str = Field("text", description="Column holding the text in datasets/jsonl/parquet.")
    local_paths: list[str] = Field(
        default_factory=list,
        description="Files or globs (source=local_files): .txt (one row per line), .jsonl, .parquet.",
    )
    split_by: Literal["row", "file", "document"] = Field(
        "row", description="source=local_files: what its train/validation/test split hashes (as corpus.split_by)."
    )
    document_column: str | None = Field(
        None, description="split_by=document: the .jsonl/.parquet column holding a row's document id."
    )
    dump_path: str | None = Field(None, description="Path of an enwiki pages-articles*.xml.bz2 dump (wiki_dump).")
    max_articles: int | None = Field(None, ge=1, le=10**9, description="Read at most this many articles (dumps).")

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


class CorpusConfig(_Section):
    source: Literal["embedded_wiki", "hf_dataset", "local_files", "wiki_dump", "tfrecord_shards", "mixture"] = Field(
        "embedded_wiki",
        description="Where the text comes from: the Wikipedia sample shipped in the "
        "gensim wheel, a `datasets` dataset, local text/jsonl/parquet files, or an enwiki XML dump; or "
        "tfrecord_shards: shards already tokenized elsewhere (bring your own, see shards_uri); or mixture: "
        "the sources of corpus.mixture, each with its weight.",
    )
    hf_path: str = Field("Salesforce/wikitext", description="`datasets` path (source=hf_dataset).")
    hf_name: str | None = Field("wikitext-103-raw-v1", description="`datasets` config name.")
    hf_revision: str | None = Field(None, description="Dataset revision (commit/tag); pins the data.")
    text_column: str = Field("text", description="Column holding the text in datasets/jsonl/parquet.")
    local_paths: list[str] = Field(
        default_factory=list,
        description="Files or globs (source=local_files), local or gs://: .txt (one row per line), .jsonl, "
        ".parquet, .txt.gz, .jsonl.gz.",
    )
    dump_path: str | None = Field(None, description="Path of an enwiki pages-articles*.xml.bz2 dump.")
    max_articles: int | None = Field(None, ge=1, le=10**9, description="Read at most this many articles (dumps).")
    validation_fraction: float = Field(
        0.05,
        ge=0.0,
        lt=0.5,
        description="Share of articles (or rows) held out for validation when the source has no such split.",
    )
    test_fraction: float = Field(0.05, ge=0.0, lt=0.5, description="Share held out for test.")
    split_by: Literal["row", "file", "document"] = Field(
        "row",
        description="source=local_files: what the train/validation/test split hashes, so that what belongs "
        "together stays in one split: each row; each file (a file is a document); or each document, named by "
        "document_column (.jsonl, .parquet). Wikipedia sources split by article title.",
    )
    document_column: str | None = Field(
        None, description="split_by=document: the .jsonl/.parquet column holding a row's document id."
    )
    shards_uri: str | None = Field(
        None,
        description="source=tfrecord_shards: a folder or gs:// prefix holding "
        "train/ and validation/ (test/ optional) folders of *.tfrecord shards with "
        "int64 input_ids and attention_mask, as Hugging Face's prepare_tfrecord_shards.py "
        "writes them.",
    )
    tokenizer_uri: str | None = Field(
        None,
        description="source=tfrecord_shards: the tokenizer the shards were "
        "encoded with: a local folder, a gs:// folder, or a Hub repo id.",
    )
    filters: FilterConfig = Field(
        default_factory=FilterConfig,
        description="Which rows to drop before tokenizing (rule filters, language ID).",
    )
    mixture: list[MixtureSource] = Field(
        default_factory=list,
        max_length=32,
        description="source=mixture: several text sources in one shard set, each with a name and a weight "
        "(YAML or the run's overrides, not a form field). Splits, filters and dedup stay corpus-wide (a row "
        "in two sources is kept once). Training draws each train example from a source chosen by weight; "
        "an epoch stays the mixture's total train records (weights change the composition, not the length).",
    )

    @model_validator(mode="after")
    def _mixture(self) -> CorpusConfig:
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
        return self

    def for_source(self, part: MixtureSource) -> CorpusConfig:
        """The single-source config of one mixture source: its own settings, the corpus-wide splits and filters."""
        own = part.model_dump(exclude={"name", "weight"})
        return CorpusConfig.model_validate(
            {
                **own,
                "validation_fraction": self.validation_fraction,
                "test_fraction": self.test_fraction,
                "filters": self.filters.model_dump(),
            }
        )

    @model_validator(mode="after")
    def _split_key(self) -> CorpusConfig:
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


class TokenizerConfig(_Section):
    vocab_size: int = Field(8000, ge=1, le=250_000, description="Unigram vocabulary size, specials included.")
    max_piece_length: int = Field(16, ge=2, le=64, description="Longest piece the Unigram trainer keeps.")
    sample_mb: int = Field(
        64,
        ge=1,
        le=100_000,
        description="MB of train text the tokenizer trains on, at most: a seeded sample of the deduplicated, "
        "filtered rows, chosen by row hash (the same rows on every machine), recorded in the manifest. Memory "
        "and time stay bounded whatever the corpus size (sentencepiece's advice: 1-10 M sentences).",
    )


class ShardConfig(_Section):
    max_length: int = Field(128, ge=8, le=4096, description="Tokens per training example (chunk length).")
    records_per_shard: int = Field(2048, ge=1, le=1_000_000, description="TFRecord examples per shard file.")
    tokenize_batch_rows: int = Field(1000, ge=1, le=100_000, description="Rows per encode_batch call.")
    partitions: int = Field(
        1,
        ge=1,
        le=MAX_PARTITIONS,
        description="Shard-writing tasks run in parallel by the DAGs "
        "(dynamic task mapping): the corpus is cut into at least this many partitions, each "
        "written by one `write_shards` task, merged into one manifest at the end.",
    )
    partition_mb: int = Field(
        256,
        ge=1,
        le=1 << 20,
        description="Target MiB of source per partition: plan_shards writes max(partitions, "
        "ceil(source MiB / partition_mb)) partitions, the second term capped at 1024 and at the "
        "source's units (files, parquet row groups, MiB of text); sources of unknown size "
        "(Wikipedia dumps) use `partitions`.",
    )


class DedupConfig(_Section):
    exact: bool = Field(
        True,
        description="Write each distinct row once: rows with the same text (after trimming) are duplicates; "
        "the copy kept is one in the train split when there is one.",
    )
    near: bool = Field(
        False,
        description="Also drop near-duplicate rows: MinHash signatures of word shingles with LSH (datasketch), "
        "rows whose estimated Jaccard similarity reaches near_threshold form a cluster, one is kept.",
    )
    near_threshold: float = Field(
        0.8, ge=0.5, le=0.99, description="Jaccard similarity (of word shingles) at which rows are near-duplicates."
    )
    num_perm: int = Field(128, ge=16, le=512, description="MinHash permutations (more: sharper threshold, slower).")
    shingle_words: int = Field(5, ge=1, le=20, description="Words per shingle for near-duplicate detection.")
    near_min_words: int = Field(
        10,
        ge=1,
        le=10_000,
        description="Rows with fewer words than this are only deduplicated exactly (a few words share "
        "too many shingles by chance).",
    )


class ModelConfig(_Section):
    preset: str = Field(
        "tiny",
        description="Model shape: tiny (CPU minutes), small, base (roberta-base).",
        json_schema_extra={"enum": [*sorted(PRESETS)]},
    )  # [*...]: a list of JSON values
    hidden_size: int | None = Field(None, ge=8, le=16_384, description="Override the preset's hidden size.")
    num_hidden_layers: int | None = Field(None, ge=1, le=128, description="Override the preset's layer count.")
    num_attention_heads: int | None = Field(None, ge=1, le=256, description="Override the preset's head count.")
    intermediate_size: int | None = Field(None, ge=8, le=65_536, description="Override the preset's FFN width.")
    max_position_embeddings: int | None = Field(
        None, ge=10, le=8194, description="Override positions (RoBERTa needs max_length + 2)."
    )
    dropout: float = Field(0.1, ge=0, lt=1, description="Hidden and attention dropout.")
    sinusoidal_init: bool = Field(
        False,
        description="Start learned position embeddings from sinusoids "
        "(small models then learn context in far fewer steps).",
    )
    init_from: str | None = Field(
        None,
        description="Continue pretraining from this model instead of random "
        "weights: a Hub repo id (owner/name), a gs:// folder or a local folder of a "
        "transformers RoBERTa masked LM (TensorFlow or PyTorch weights). Its tokenizer "
        "encodes the shards (none is trained) and its config.json gives the shape: "
        "preset and tokenizer.vocab_size are not used, and a conflicting shape setting "
        "is refused.",
    )
    init_revision: str | None = Field(
        None,
        description="With a Hub init_from: the branch, tag or commit to start "
        "from (empty: main); resolved to its commit once per shard set.",
    )
    vocab_multiple: int | None = Field(
        None,
        ge=2,
        le=1024,
        description="Pad the model's embedding rows (and LM "
        "head) to a multiple of this, e.g. 128 for the matrix units' tiles; the "
        "tokenizer stays, the extra rows are never a label (empty: the tokenizer's "
        "size). Not with init_from: the base's vocabulary is kept.",
    )

    def shape(self) -> ModelShape:
        if self.preset not in PRESETS:
            raise ConfigError(f"Unknown model preset {self.preset!r}: choose one of {sorted(PRESETS)}.")
        overrides = {
            k: v
            for k, v in self.model_dump().items()
            if k not in ("preset", "dropout", "sinusoidal_init", "vocab_multiple") and v is not None
        }
        return PRESETS[self.preset].model_copy(update=overrides)


class TrainConfig(_Section):
    steps: int | None = Field(
        None,
        ge=1,
        le=100_000_000,
        description="Optimizer steps; empty = `epochs` over the train shards. With "
        "train.budget_minutes, the most it trains.",
    )
    budget_minutes: float | None = Field(
        None,
        gt=0,
        le=43_200,
        description="Train for this long, a deadline from the run's first start: the step count is "
        "planned from the run's own measured step time and re-planned as it trains (the schedule follows), and "
        "the run stops at a step boundary with its checkpoint; train.steps, when set, caps it.",
    )
    epochs: float = Field(
        1.0,
        gt=0,
        le=10_000,
        description="Passes over the train split when `steps` is empty (a mixture: its total train records, "
        "drawn by weight).",
    )
    batch_size: int = Field(32, ge=1, le=65_536, description="Examples per replica per step (global = × replicas).")
    learning_rate: float = Field(1e-3, gt=0, lt=1, description="Peak AdamW learning rate.")
    warmup_fraction: float = Field(0.06, ge=0, lt=1, description="Share of steps of linear warmup.")
    schedule: Literal["linear", "one_cycle"] = Field(
        "linear",
        description="Learning rate after warmup: linear decay to 0 at the last step, or one_cycle "
        "(cosine decay to 0 at the last step: longer near the peak; Cramming's budget-tied one-cycle). Both are tied "
        "to the run's step count, so a time-budgeted run anneals on time.",
    )
    weight_decay: float = Field(0.01, ge=0, le=1, description="AdamW weight decay (not on norms and biases).")
    adam_beta2: float = Field(
        0.98, gt=0, lt=1, description="AdamW beta2 (RoBERTa's 0.98 is steadier than 0.999 at high LR)."
    )
    adam_epsilon: float = Field(1e-6, gt=0, le=1, description="AdamW epsilon.")
    mlm_probability: float = Field(0.15, gt=0, lt=1, description="Share of tokens selected for masking.")
    whole_word_mask: bool = Field(
        False,
        description="Select whole words for masking (every piece of a drawn word; the same expected share "
        "of tokens, mlm_probability) instead of single tokens. Needs a Metaspace tokenizer, whose word-initial "
        "pieces start with ▁ (this project's Unigram); validation masks stay token-level.",
    )
    max_predictions_per_seq: int = Field(
        32,
        ge=0,
        le=8192,
        description="LM head runs only at this many masked "
        "positions per sequence (0 = every position, the plain way); without "
        "XLA off a TPU, at exactly the masked ones, at most this many a sequence.",
    )
    checkpoint_every: int = Field(
        100, ge=1, le=100_000_000, description="Steps between checkpoints (what a retry loses at most)."
    )
    log_every: int = Field(25, ge=1, le=100_000_000, description="Steps between progress lines in the log.")
    steps_per_call: Literal["auto"] | int = Field(
        "auto",
        description="Optimizer steps per call of the compiled training loop (one host round trip per call; "
        "auto: 1 on CPU, 16 on GPU, 64 on TPU). Checkpoints, validation and the loop's hooks land on a call's last "
        "step; the losses are the same whatever it is.",
    )
    eval_every: int | None = Field(
        None,
        ge=1,
        le=100_000_000,
        description="Steps between validation losses during training "
        "(empty: none). Fixed 15% masking on eval.split, so losses compare across runs; "
        "into the history, TensorBoard (val/loss) and the report's loss curve.",
    )
    eval_batches: int = Field(
        8, ge=1, le=1_000_000, description="Validation batches (of eval.batch_size) per train.eval_every."
    )
    keep_checkpoint: Literal["last", "best"] = Field(
        "last",
        description="The model the run saves, evaluates and publishes: the last step's, or the one "
        "with the lowest validation loss (best: needs train.eval_every).",
    )
    xla: Literal["auto", "on", "off"] = Field("auto", description="XLA-compile the step (auto: on for TPU/GPU).")
    mixed_precision: Literal["auto", "off", "bf16"] = Field(
        "auto",
        description="Compute dtype (auto: bf16 on TPU and GPU; on a CPU the faster of fp32 and bf16 for this model, "
        "timed once per machine kind and model shape and cached: mlm_tasks/model/precision.py).",
    )
    device: Literal["auto", "tpu", "gpu", "cpu"] = Field(
        "auto", description="Accelerator to train on (auto: TPU if this host has one, else GPU, else CPU)."
    )
    strategy: Literal["auto", "mirrored"] = Field(
        "auto",
        description="tf.distribute strategy (auto: TPU, Mirrored on several GPUs, else none; mirrored: "
        "MirroredStrategy on CPU/GPU even for one device, the TPU's strategy.run path, for tests).",
    )
    shuffle_buffer: int = Field(10_000, ge=1, le=1_000_000, description="Examples in the tf.data shuffle buffer.")
    seed: int = Field(42, description="Seed for init, shuffling and masking.")
    heartbeat_s: float = Field(
        30.0,
        ge=1,
        le=3600,
        description="Seconds between rewrites of the trainer's status record "
        "(runs/<run>/train/status.json) while it runs.",
    )
    stall_minutes: float = Field(
        30.0,
        gt=0,
        le=1440,
        description="A trainer whose status has no heartbeat, or no new step, "
        "for this long is stalled: its try fails (and is retried) and it is stopped. "
        "Longer than the first step's XLA compilation.",
    )
    follow_poll_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="On a TPU VM: seconds between the checks of the detached "
        "trainer by the train task's trigger (status record, and `kill -0` over SSH).",
    )
    progress_log_s: float = Field(
        180.0,
        gt=0,
        le=86_400,
        description="On a TPU VM: seconds between progress lines (step, loss, tokens/s, ETA) in the train task's log.",
    )
    timeout_hours: float | None = Field(
        None,
        gt=0,
        le=720,
        description="The training's deadline (empty: tpu.ttl_hours on a TPU VM, 72 h locally): locally the "
        "train task's execution_timeout; on a TPU VM counted from the task's first start, across its check-ins, "
        "restarts and retries, and at most tpu.ttl_hours.",
    )
    max_restarts: int = Field(
        10,
        ge=0,
        le=1000,
        description="On a TPU VM: node losses (a preemption, a deleted node) the train task handles inside its "
        "try, each with a new node and a new trainer from the last checkpoint; one more fails the try "
        "(Airflow's retries are for errors).",
    )
    check_in_minutes: float = Field(
        60.0,
        gt=0,
        le=1440,
        description="On a TPU VM: the train task's trigger timeout. At it the task checks the deadline "
        "(train.timeout_hours) on a worker, reattaches to the trainer and defers again, in the same try.",
    )

    def timeout_for(self, compute: str, ttl_hours: float) -> float:
        """Hours the training may run (on a TPU VM it must end before the VM's TTL)."""
        if self.timeout_hours is not None:
            return self.timeout_hours
        return ttl_hours if compute == "tpu_vm" else 72.0


class EvalConfig(_Section):
    split: Literal["validation", "test"] = Field("validation", description="Split to evaluate on.")
    batch_size: int = Field(64, ge=1, le=65_536, description="Examples per evaluation batch.")
    max_batches: int | None = Field(
        None, ge=1, le=100_000_000, description="Cap on evaluation batches (empty = whole split)."
    )


DEFAULT_PROBES = [
    "The war ended in <mask>.",
    "He was born in <mask>.",
    "Alabama is a <mask> in the United States.",
    "The city is located on the <mask> of the river.",
    "Anarchism is a political <mask>.",
]


class InferConfig(_Section):
    probes: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PROBES), description="Fill-mask probe sentences, each with one <mask>."
    )
    top_k: int = Field(5, ge=1, le=50, description="Predictions kept per probe.")


class TpuConfig(_Section):
    project: str = Field("", description="Google Cloud project of the TPU VM.")
    # A run may pick the zone, and it becomes part of the TPU API's resource path (and the janitor's
    # registry path): only the shape of a Google Cloud zone, e.g. us-central2-b, europe-west4-a.
    zone: str = Field(
        "us-central2-b",
        pattern=r"^[a-z]+(-[a-z]+[0-9]+)+-[a-z]$",
        description="Zone of the TPU VM, e.g. us-central2-b.",
    )
    accelerator_type: str = Field("v4-8", description="TPU type, e.g. v4-8, v5litepod-8, v4-32 (pod slice).")
    runtime_version: str = Field(
        runtimes.DEFAULT,
        json_schema_extra={"enum": [*sorted(runtimes.SUPPORTED)]},
        description="TPU VM software version: tpu-vm-tf-X.Y.Z[-pod]-pjrt (-pod for "
        "multi-host slices such as v4-32); picks the image's TensorFlow and the VM lock.",
    )
    network: str | None = Field(None, description="VPC network (default network if empty).")
    subnetwork: str | None = Field(None, description="Subnetwork.")
    # How the node is asked for. A new project has on-demand quota only; Spot and queued need their own.
    provisioning: Literal["on_demand", "spot", "queued"] = Field(
        "on_demand",
        description="on_demand: create the node (on-demand quota, fails on a stockout, which is waited out: "
        "tpu.stockout_wait_hours); spot: the same with Spot scheduling (cheaper, may be preempted); queued: a "
        "queued resource that waits in Google's queue for capacity (tpu.queued_tier, tpu.queued_valid_hours, "
        "tpu.reservation), deferred, holding no worker slot.",
    )
    queued_tier: Literal["spot", "guaranteed"] = Field(
        "spot", description="provisioning=queued: the Spot tier, or the guaranteed tier (on-demand prices)."
    )
    queued_valid_hours: float = Field(
        24,
        ge=0.1,
        le=720,
        description="provisioning=queued: how long the request may wait in the queue (validUntilDuration); "
        "then it fails and the task with it.",
    )
    reservation: str | None = Field(
        None,
        pattern=r"^projects/[^/]+/locations/[^/]+/reservations/[^/]+$",
        description="provisioning=queued, tier guaranteed: the reservation to provision from, "
        "projects/P/locations/Z/reservations/R.",
    )
    price_per_chip_hour: float | None = Field(
        None,
        gt=0,
        le=1000,
        description="US$ per chip-hour of the slice, for the "
        "cost estimates and the cost a run reports (empty: Google's list "
        "price for the generation, Spot or on-demand: mlm_tasks/tpu/prices.py).",
    )
    service_account: str | None = Field(None, description="Service account email for the VM.")
    ttl_hours: float = Field(12, gt=0, le=720, description="The janitor deletes the VM after this many hours.")
    api_endpoint: str | None = Field(None, description="TPU API endpoint override (tests: http://127.0.0.1:P).")
    transport: Literal["grpc", "rest"] = Field("grpc", description="TPU API client transport.")
    ssh_conn_id: str = Field("tpu_ssh", description="Airflow SSH connection (user, private key) for the VM.")
    ssh_port: int = Field(22, ge=1, le=65535, description="SSH port on the VM workers.")
    workdir: str = Field("~/mlm", description="Directory on the VM where the project is installed.")
    python: str = Field("python3", description="Python interpreter on the VM.")
    create_timeout_s: int = Field(
        1800, ge=60, le=86_400, description="Give up waiting for a READY node after this long."
    )
    poll_interval_s: float = Field(
        15, gt=0, le=3600, description="Seconds between TPU API checks while waiting for the node."
    )
    # A stockout passes with time, and creating again is free: it is waited out inside the task's try
    # (create_tpu_vm's, or train's when it replaces a lost node), so it never uses up Airflow's retries.
    stockout_wait_hours: float = Field(
        4,
        ge=0,
        le=168,
        description="How long to keep creating the node again while the zone has no capacity for the "
        "slice (a stockout), inside one try; 0: a stockout fails the try at once.",
    )
    stockout_retry_s: float = Field(
        300, gt=0, le=3600, description="Seconds between creates while the zone has no capacity."
    )
    api_timeout_s: float = Field(
        60,
        gt=0,
        le=600,
        description="Seconds one TPU API request may go unanswered before it "
        "fails (a hung API or network); busy answers (429, 503) are retried for 5 minutes.",
    )
    delete_timeout_s: int = Field(
        900,
        ge=1,
        le=86_400,
        description="Seconds the teardown waits for the deleted node to be gone; "
        "then it leaves the node to mlm_tpu_janitor and says so in its log.",
    )
    bootstrap: bool = Field(
        True,
        description="Install the staged project code on the VM before a step "
        "(off: the VM already has it in workdir, e.g. tests or a custom image).",
    )
    external_ips: bool = Field(
        True,
        description="Give the workers external IPs (as gcloud does; pip on the "
        "VM needs them unless the VPC has Cloud NAT).",
    )
    ssh_via: Literal["internal", "external"] = Field(
        "external",
        description="Which worker IPs Airflow dials for SSH: external (Airflow outside the VPC, e.g. "
        "docker compose on a laptop or VM elsewhere; needs external_ips) or internal (Airflow inside the "
        "VPC, e.g. Composer or a GCE VM on the same network).",
    )
    ssh_probe_timeout_s: float = Field(
        10,
        gt=0,
        le=600,
        description="Seconds to wait for port 22 of each worker once "
        "the node is READY; an unreachable worker fails the task at once.",
    )
    enable_oslogin: bool = Field(
        False,
        description="Node metadata enable-oslogin. False: the ssh-keys "
        "metadata (the tpu_ssh connection's key) lets Airflow log in; True: grant the "
        "key through OS Login instead (ssh-keys metadata is then ignored).",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables for the step on every "
        "worker (no secrets: the config is logged and kept in XCom).",
    )

    @model_validator(mode="before")
    @classmethod
    def _spot_means_provisioning(cls, data: Any) -> Any:
        # `tpu.spot: true|false` (before tpu.provisioning) still reads as it did.
        if isinstance(data, dict) and "spot" in data:
            data = dict(data)
            spot = data.pop("spot")
            asked = "spot" if spot else "on_demand"
            if data.get("provisioning", asked) != asked:
                raise ValueError(
                    f"tpu.spot={spot} and tpu.provisioning={data['provisioning']!r} disagree: "
                    "set tpu.provisioning only (on_demand, spot or queued)."
                )
            data["provisioning"] = asked
        return data

    @property
    def spot(self) -> bool:
        """Spot capacity (Spot prices, may be preempted): provisioning spot, or queued on the Spot tier."""
        return self.provisioning == "spot" or (self.provisioning == "queued" and self.queued_tier == "spot")

    def create_wait_s(self) -> float:
        """How long a create may take to give a READY node: the queue's validity, then the create itself."""
        queued = self.queued_valid_hours * 3600 if self.provisioning == "queued" else 0
        return queued + self.create_timeout_s

    @model_validator(mode="after")
    def _reservation_is_guaranteed(self) -> TpuConfig:
        if self.reservation and (self.provisioning, self.queued_tier) != ("queued", "guaranteed"):
            raise ValueError(
                "tpu.reservation is for tpu.provisioning=queued with tpu.queued_tier=guaranteed "
                f"(here {self.provisioning!r}, tier {self.queued_tier!r})."
            )
        return self

    @model_validator(mode="after")
    def _supported_runtime(self) -> TpuConfig:
        # The runtime picks the image's TensorFlow and so the VM lock (mlm_tasks.tpu.runtimes).
        runtimes.get(self.runtime_version)
        return self


class GateConfig(_Section):
    max_eval_loss: float | None = Field(None, gt=0, description="Publish only if eval loss is at most this.")
    min_accuracy: float | None = Field(
        None, ge=0, le=1, description="Publish only if masked accuracy is at least this."
    )
    require_better_than_published: bool = Field(
        True, description="Publish only if not worse than the last published model."
    )


TASK_FILE_TYPES = (".csv", ".jsonl", ".parquet")


class DownstreamTask(_Section):
    """One text-classification task the trained encoder is fine-tuned on (mlm_tasks/downstream/)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="What the table calls it, e.g. sst2.")
    source: Literal["files", "hf_dataset", "held_out_article"] = Field(
        "files",
        description="files: train_file and validation_file (CSV, JSONL or parquet, local or gs://); "
        "hf_dataset: a `datasets` id (hf_path, hf_name), e.g. nyu-mll/glue + sst2; held_out_article: passages "
        "of the corpus's test-split articles (never pretrained on), labelled with their article (a corpus "
        "without articles, not embedded_wiki or wiki_dump, skips it).",
    )
    train_file: str | None = Field(None, description="source=files: the training examples.")
    validation_file: str | None = Field(None, description="source=files: the examples scored.")
    hf_path: str | None = Field(None, description="source=hf_dataset: `datasets` path, e.g. nyu-mll/glue.")
    hf_name: str | None = Field(None, description="source=hf_dataset: its config, e.g. sst2, mrpc, rte.")
    hf_revision: str | None = Field(None, description="source=hf_dataset: a commit or tag (pins the data).")
    train_split: str = Field("train", description="source=hf_dataset: the split fine-tuned on.")
    validation_split: str = Field("validation", description="source=hf_dataset: the split scored.")
    text_columns: list[str] = Field(
        default_factory=list,
        max_length=2,
        description="One column (single sentences) or two (pairs); empty: `sentence`, or `sentence1` + `sentence2`.",
    )
    label_column: str = Field("label", description="Column of the class: integers from 0, or names.")
    metric: Literal["accuracy", "f1", "macro_f1", "mcc", "pearson", "spearman"] = Field(
        "accuracy",
        description="The score the table, the gate and min_score use: accuracy, f1 (of class 1, binary tasks), "
        "macro_f1, mcc (Matthews, as CoLA) for classes; pearson or spearman for a regression (number labels, "
        "as STS-B).",
    )
    min_score: float | None = Field(None, ge=-1, le=1, description="The gate refuses a mean score below this.")
    max_train_examples: int | None = Field(
        None, ge=1, le=10_000_000, description="Fine-tune on at most this many (a seeded sample, stratified by label)."
    )
    max_eval_examples: int | None = Field(
        None, ge=1, le=10_000_000, description="Score at most this many (a seeded sample, stratified by label)."
    )

    @model_validator(mode="after")
    def _source_settings(self) -> DownstreamTask:
        if self.source == "files":
            for setting in ("train_file", "validation_file"):
                value = getattr(self, setting)
                if not value or not value.endswith(TASK_FILE_TYPES):
                    raise ConfigError(
                        f"downstream task {self.name!r}: source=files needs {setting}, a "
                        f"{'/'.join(TASK_FILE_TYPES)} file (local or gs://), got {value!r}."
                    )
        elif self.source == "hf_dataset" and not self.hf_path:
            raise ConfigError(
                f"downstream task {self.name!r}: source=hf_dataset needs hf_path (and hf_name), "
                "e.g. nyu-mll/glue and sst2."
            )
        return self


class DownstreamConfig(_Section):
    tasks: list[DownstreamTask] = Field(
        default_factory=list,
        description="Tasks the `downstream` step fine-tunes the trained encoder on (empty: the step does nothing).",
    )
    seeds: int = Field(
        3,
        ge=1,
        le=20,
        description="Fine-tuning runs per task and model (seeds train.seed, +1, "
        "...): the table shows their mean and spread.",
    )
    steps: int = Field(
        100, ge=1, le=1_000_000, description="Optimizer steps of each fine-tuning run (the fixed budget)."
    )
    batch_size: int = Field(16, ge=1, le=4096, description="Examples per fine-tuning step.")
    learning_rate: float = Field(3e-4, gt=0, lt=1, description="Peak AdamW learning rate (10% warmup, linear decay).")
    max_length: int = Field(
        128, ge=8, le=8192, description="Tokens per example (a pair shares them); at most the model's positions."
    )
    random_init: bool = Field(
        True,
        description="Run the same budget from random weights of the same shape: "
        "the baseline that shows what pretraining bought.",
    )
    min_scores: dict[str, float] = Field(
        default_factory=dict, description="The gate's minimum mean score per task name (or a task's own min_score)."
    )
    max_regression: float = Field(
        0.0,
        ge=0,
        le=1,
        description="With gate.require_better_than_published: how far a task's score may fall below the last "
        "published model's. The gate fails a task only when the whole 95% interval of the difference lies below "
        "-max_regression (a drop larger than this, beyond noise), so 0 fails only a drop noise cannot explain.",
    )
    check_contamination: bool = Field(
        True,
        description="Look for each task's scored examples in the pretraining train split (13-gram overlap, "
        "one read of the corpus); found ones are named in the report, the card, the gate and the approval page.",
    )
    max_half_width: float = Field(
        0.1,
        gt=0,
        le=1,
        description="A score whose 95% interval (over seeds and examples) is wider than ± this is flagged in the "
        "report, the card and the approval page as too uncertain to tell models apart: score more examples.",
    )

    @model_validator(mode="after")
    def _names(self) -> DownstreamConfig:
        names = [t.name for t in self.tasks]
        if len(set(names)) != len(names):
            raise ConfigError(f"downstream.tasks repeat a name ({names}): give each task its own.")
        unknown = sorted(set(self.min_scores) - set(names))
        if unknown:
            raise ConfigError(f"downstream.min_scores names {unknown}, not tasks of downstream.tasks ({names}).")
        if any(not -1 <= v <= 1 for v in self.min_scores.values()):
            raise ConfigError(
                "downstream.min_scores are scores between -1 and 1 (accuracy and F1 from 0, mcc and "
                "correlations from -1)."
            )
        return self

    def min_score(self, task: DownstreamTask) -> float | None:
        return task.min_score if task.min_score is not None else self.min_scores.get(task.name)


class PublishConfig(_Section):
    enabled: bool = Field(False, description="Push the model to the Hugging Face Hub.")
    repo_id: str | None = Field(None, description="Hub model repo id, e.g. my-org/roberta-wiki-mlm.")
    tokenizer_repo_id: str | None = Field(None, description="Push the tokenizer alone to this repo after training it.")
    private: bool = Field(True, description="Create the Hub repo as private.")
    hf_conn_id: str = Field("huggingface_default", description="Airflow connection whose password is the Hub token.")
    sync_checkpoints: bool = Field(False, description="Upload checkpoints to the Hub during training (non-blocking).")
    request_timeout_s: float = Field(
        120,
        gt=0,
        le=3600,
        description="Seconds one Hub request may go without an answer "
        "(connect, or between bytes) before it fails; a hung Hub fails the step.",
    )
    license: str = Field("cc-by-sa-4.0", description="License in the model card (Wikipedia text is CC BY-SA 4.0).")
    require_approval: bool = Field(
        False,
        description="A person approves the release in Airflow (the "
        "approve_release task, between gate and publish) before publish runs.",
    )
    approval_timeout_hours: float = Field(
        72,
        gt=0,
        le=720,
        description="Hours approve_release waits for an answer; "
        "no answer by then counts as a rejection (publish skipped).",
    )
    releases_root: str | None = Field(
        None,
        description="Where the metrics of each model published to a repo_id are "
        "kept (the gate's baseline); empty: under output_root. A deployment sets it to "
        "a place runs cannot choose.",
    )


class SensorConfig(_Section):
    """Orchestration only: the shard gate (plugins/mlm_airflow/sensors/shard_set.py) reads this section at run time; no
    step of mlm_tasks does. It lives in the run's config so a run (production.yaml) can set it."""

    poke_interval_s: int = Field(
        30, ge=1, le=3600, description="Seconds between checks for the shard completion marker."
    )
    timeout_s: int = Field(
        3600, ge=1, le=604_800, description="Fail the run if shards are not complete after this long."
    )
    gcp_conn_id: str | None = Field(
        None, description="Airflow GCP connection of the sensor (empty: the top-level gcp_conn_id)."
    )


class StorageConfig(_Section):
    """gs:// calls of every step, task and trigger (mlm_tasks/storage.py), and TensorFlow's gs:// client."""

    timeout_s: float = Field(
        60,
        gt=0,
        le=600,
        description="Seconds a gs:// request may wait for a connection "
        "or for the next bytes of its answer; a call fails as transient (the task retries) "
        "after 3 times this, retries included, plus a second per MiB it moves.",
    )


class PipelineConfig(_Section):
    output_root: str = Field("out", description="Where every artifact goes: a local folder or gs://bucket/prefix.")
    compute: Literal["local", "tpu_vm"] = Field("local", description="Train here, or on a TPU VM made for the run.")
    gcp_conn_id: str = Field(
        "google_cloud_default",
        description="Airflow GCP connection whose credentials every "
        "Google client on the Airflow side uses (GCS, the shard sensor, the TPU API).",
    )
    corpus: CorpusConfig = Field(default_factory=CorpusConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    shards: ShardConfig = Field(default_factory=ShardConfig)
    dedup: DedupConfig = Field(default_factory=DedupConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    infer: InferConfig = Field(default_factory=InferConfig)
    tpu: TpuConfig = Field(default_factory=TpuConfig)
    sensor: SensorConfig = Field(default_factory=SensorConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    downstream: DownstreamConfig = Field(default_factory=DownstreamConfig)
    gate: GateConfig = Field(default_factory=GateConfig)
    publish: PublishConfig = Field(default_factory=PublishConfig)

    @model_validator(mode="after")
    def _cross_checks(self) -> PipelineConfig:
        self._model_checks()
        self._train_checks()
        self._output_checks()
        self._publish_checks()
        return self

    def _model_checks(self) -> None:
        """The model's shape against the data's: heads, positions, vocabulary."""
        shape = self.model.shape()  # raises on an unknown preset
        if self.model.init_from is not None:
            self._init_from_checks()  # the shape, positions and vocabulary are the base's: validate checks them
        elif shape.hidden_size % shape.num_attention_heads:
            raise ConfigError(
                f"model.hidden_size {shape.hidden_size} is not a multiple of "
                f"num_attention_heads {shape.num_attention_heads}."
            )
        elif self.shards.max_length + 2 > shape.max_position_embeddings:
            # RoBERTa offsets positions by padding_idx + 1, so a 512-token model has 514 positions.
            raise ConfigError(
                f"max_length {self.shards.max_length} does not fit the model: preset {self.model.preset!r} has "
                f"{shape.max_position_embeddings} positions, so max_length can be at most "
                f"{shape.max_position_embeddings - 2}. Lower max_length or set model.max_position_embeddings."
            )
        elif self.tokenizer.vocab_size <= len(SPECIAL_TOKENS) + 10:
            raise ConfigError(
                f"tokenizer.vocab_size {self.tokenizer.vocab_size} leaves no room beside the "
                f"{len(SPECIAL_TOKENS)} special tokens {' '.join(SPECIAL_TOKENS)}: raise it (1000 or "
                "more for real text; the default is 8000)."
            )

    def _train_checks(self) -> None:
        """Masking, steps per call and the kept checkpoint against each other."""
        if self.train.max_predictions_per_seq > self.shards.max_length:
            raise ConfigError("train.max_predictions_per_seq cannot exceed max_length.")
        expected = self.train.mlm_probability * self.shards.max_length
        if self.train.mlm_probability > 0.15 and 0 < self.train.max_predictions_per_seq < expected:
            # More masking than BERT's 15% needs the slots for it: below the mean masked count most full
            # sequences would lose labels (masked, never scored). At 15% the cut is the long-standing default.
            raise ConfigError(
                f"train.max_predictions_per_seq {self.train.max_predictions_per_seq} is below the "
                f"{expected:.0f} tokens train.mlm_probability {self.train.mlm_probability} masks in a "
                f"{self.shards.max_length}-token sequence on average: raise it to about "
                f"{int(expected * 1.5)} (0 = every position)."
            )
        if self.train.mlm_probability > 0.5:
            raise ConfigError(
                f"train.mlm_probability {self.train.mlm_probability} leaves under half the context: "
                "use 0.15-0.4 (Wettig et al. found 40% the most a base model gains from)."
            )
        if self.model.vocab_multiple and self.model.init_from:
            raise ConfigError(
                "model.vocab_multiple pads a new model's vocabulary; with model.init_from the base's "
                "vocabulary is kept: leave model.vocab_multiple empty."
            )
        if self.train.steps_per_call != "auto" and int(self.train.steps_per_call) < 1:
            raise ConfigError(f"train.steps_per_call {self.train.steps_per_call} must be auto or at least 1.")
        if self.train.keep_checkpoint == "best" and not self.train.eval_every:
            raise ConfigError(
                "train.keep_checkpoint=best needs train.eval_every (the steps at which the "
                "validation loss picks the best): set it, e.g. train.eval_every=500."
            )

    def _output_checks(self) -> None:
        """Where the run writes and what runs it: output_root's scheme, the run's URIs, the TPU VM."""
        scheme = self.output_root.split("://", 1)[0] if "://" in self.output_root else "file"
        if scheme == "gs" and not self.output_root[len("gs://") :].split("/", 1)[0]:
            raise ConfigError(
                f"output_root {self.output_root!r} names no bucket: use gs://bucket/prefix "
                "(the bucket must exist; create it with `gcloud storage buckets create`)."
            )
        if scheme not in SUPPORTED_SCHEMES:
            raise ConfigError(
                f"output_root {self.output_root!r} has unsupported scheme {scheme!r}: use a "
                "local folder or gs://bucket/prefix."
            )
        for setting, value, glob in self._run_uris():
            check_safe_uri(setting, value, glob=glob)
        if self.model.init_revision and not self.model.init_from:
            raise ConfigError(
                f"model.init_revision {self.model.init_revision!r} is set but model.init_from is empty: "
                "name the Hub repo to start from, or leave init_revision empty."
            )
        if self.compute == "tpu_vm" and scheme != "gs":
            raise ConfigError(
                "compute=tpu_vm needs output_root=gs://bucket/prefix: the TPU VM reads shards "
                "and writes checkpoints there."
            )
        if self.compute == "tpu_vm" and not self.tpu.project:
            raise ConfigError("compute=tpu_vm needs tpu.project (the Google Cloud project of the TPU VM).")
        if self.sensor.gcp_conn_id is None:
            self.sensor.gcp_conn_id = self.gcp_conn_id
        if self.compute == "tpu_vm":
            self._tpu_checks()

    def _publish_checks(self) -> None:
        """The Hub repo ids, when publishing."""
        if (
            self.publish.repo_id
            and not HUB_REPO_ID.match(self.publish.repo_id)
            or self.publish.tokenizer_repo_id
            and not HUB_REPO_ID.match(self.publish.tokenizer_repo_id)
        ):
            raise ConfigError(
                f"publish.repo_id {self.publish.repo_id!r} / tokenizer_repo_id "
                f"{self.publish.tokenizer_repo_id!r}: a Hub repo id is owner/name (letters, digits, '-', "
                "'_', '.'), e.g. my-org/roberta-wiki-mlm."
            )
        if self.publish.enabled and not self.publish.repo_id:
            raise ConfigError("publish.enabled needs publish.repo_id, e.g. my-org/roberta-wiki-mlm.")

    def _init_from_checks(self) -> None:
        """What a continued run (model.init_from) needs to be true without reading the base."""
        if self.corpus.source == "tfrecord_shards":
            raise ConfigError(
                "model.init_from encodes the corpus with the base model's tokenizer, but "
                "corpus.source=tfrecord_shards brings shards already encoded: use a text source, or "
                "leave model.init_from empty."
            )
        if self.compute == "tpu_vm" and (self.model.init_from or "").startswith(("/", ".", "file://")):
            raise ConfigError(
                f"model.init_from {self.model.init_from} is a local folder, but compute=tpu_vm trains on "
                "a TPU VM that cannot see it: copy it to gs://bucket/prefix, or give a Hub repo id."
            )

    def _run_uris(self) -> list[tuple[str, str, bool]]:
        """(setting, value, may be a glob) of every place or Hub id a run may set."""
        c, p, m = self.corpus, self.publish, self.model
        named = [
            ("output_root", self.output_root),
            ("corpus.hf_path", c.hf_path),
            ("corpus.dump_path", c.dump_path),
            ("corpus.shards_uri", c.shards_uri),
            ("corpus.tokenizer_uri", c.tokenizer_uri),
            ("model.init_from", m.init_from),
            ("model.init_revision", m.init_revision),
            ("publish.repo_id", p.repo_id),
            ("publish.tokenizer_repo_id", p.tokenizer_repo_id),
            ("publish.releases_root", p.releases_root),
        ]
        named += [
            (f"downstream.tasks[{i}].{key}", getattr(t, key))
            for i, t in enumerate(self.downstream.tasks)
            for key in ("train_file", "validation_file", "hf_path", "hf_revision")
        ]
        for i, s in enumerate(c.mixture):
            named += [(f"corpus.mixture[{i}].hf_path", s.hf_path), (f"corpus.mixture[{i}].dump_path", s.dump_path)]
        globs = [(f"corpus.local_paths[{i}]", v) for i, v in enumerate(c.local_paths)] + [
            (f"corpus.mixture[{i}].local_paths[{j}]", v)
            for i, s in enumerate(c.mixture)
            for j, v in enumerate(s.local_paths)
        ]
        return [(k, v, False) for k, v in named if v is not None] + [(k, v, True) for k, v in globs]

    def _tpu_checks(self) -> None:
        """What a TPU VM run needs to be true before the VM exists (no I/O)."""
        tpu_slices.check_runtime(self.tpu.accelerator_type, self.tpu.runtime_version)
        if self.tpu.ssh_via == "external" and not self.tpu.external_ips:
            raise ConfigError(
                "tpu.ssh_via=external needs tpu.external_ips=true (the workers get no external IP "
                "otherwise); inside the VPC use tpu.ssh_via=internal."
            )
        hours = self.train.timeout_for(self.compute, self.tpu.ttl_hours)
        if hours > self.tpu.ttl_hours:
            raise ConfigError(
                f"train.timeout_hours {hours:g} is longer than tpu.ttl_hours {self.tpu.ttl_hours:g}: the "
                "janitor would delete the TPU VM under a training that may still run. Raise "
                "tpu.ttl_hours or lower train.timeout_hours."
            )


# Flat names used by the Airflow trigger form and `--set`, mapped to their place in the config.
PARAM_PATHS = {
    "output_root": "output_root",
    "compute": "compute",
    "corpus_source": "corpus.source",
    "hf_dataset": "corpus.hf_path",
    "hf_config": "corpus.hf_name",
    "local_paths": "corpus.local_paths",
    "dump_path": "corpus.dump_path",
    "vocab_size": "tokenizer.vocab_size",
    "max_length": "shards.max_length",
    "model_preset": "model.preset",
    "init_from": "model.init_from",
    "init_revision": "model.init_revision",
    "steps": "train.steps",
    "budget_minutes": "train.budget_minutes",
    "batch_size": "train.batch_size",
    "learning_rate": "train.learning_rate",
    "tpu_project": "tpu.project",
    "tpu_zone": "tpu.zone",
    "accelerator_type": "tpu.accelerator_type",
    "runtime_version": "tpu.runtime_version",
    "publish": "publish.enabled",
    "hub_repo_id": "publish.repo_id",
    "require_approval": "publish.require_approval",
}


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"Cannot set {dotted!r}: {part!r} is not a section.")
    node[leaf] = value


def build_config(base: dict | None = None, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    """Validate `base` (nested dict) with dotted or flat-param `overrides` applied on top."""
    tree = json.loads(json.dumps(base or {}))
    for key, value in (overrides or {}).items():
        dotted = PARAM_PATHS.get(key, key)
        if "." not in dotted and dotted not in PipelineConfig.model_fields:
            raise ConfigError(
                f"Unknown setting {key!r}. Known flat names: {sorted(PARAM_PATHS)}; "
                "or use a dotted path such as train.learning_rate."
            )
        _set_dotted(tree, dotted, value)
    try:
        return PipelineConfig.model_validate(tree)
    except ConfigError:
        raise
    except ValidationError as err:
        raise ConfigError(_explain(err)) from None


# Settings that are gone, and what to use instead: naming one says so, not "check its spelling".
REMOVED_SETTINGS = {
    "train.fail_at_step": "fault injection is a training hook now, never a setting of a run: in process, "
    "train(cfg, ctx, hooks=[FailAtStep(N)]); for a trainer in another process (a task, the CLI, a TPU VM), "
    "MLM_TRAIN_HOOKS=mlm_tasks.training.hooks:fail_at_step=N in its environment "
    "(mlm_tasks/training/hooks.py). Remove the setting.",
}


def _explain(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "config"
        if e["type"] == "extra_forbidden" and where in REMOVED_SETTINGS:
            lines.append(f"Setting {where!r} is gone: {REMOVED_SETTINGS[where]}")
        elif e["type"] == "extra_forbidden":
            lines.append(f"Unknown setting {where!r}: check its spelling (see configs/default.yaml).")
        elif e["type"] == "value_error" and isinstance(e.get("ctx", {}).get("error"), ConfigError):
            lines.append(str(e["ctx"]["error"]))
        else:
            lines.append(f"{where}: {e['msg']} (got {e.get('input')!r}).")
    return "Invalid configuration:\n  " + "\n  ".join(lines)


def read_yaml_config(path: str | Path) -> dict:
    """Parse a YAML config file strictly: syntax errors, duplicate keys and a top level that is not a
    mapping are ConfigErrors naming the file and line (PyYAML alone lets a repeated key win silently)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            seen: dict[Any, int] = {}  # key: its line
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise ConfigError(
                        f"{path} line {key_node.start_mark.line + 1}: key {key!r} is repeated "
                        f"(first at line {seen[key]}): keep one of them."
                    )
                seen[key] = key_node.start_mark.line + 1
            return super().construct_mapping(node, deep=deep)

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"Config file {path} does not exist: see configs/ for examples.")
    # Reading a FIFO would hang the task and /dev/zero fill its memory: a config is a small regular file.
    if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"Config file {path} is not a regular file of at most {MAX_CONFIG_BYTES} bytes: give a YAML "
            "file of settings (see configs/)."
        )
    try:
        tree = yaml.load(path.read_text(), Loader=StrictLoader)
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" line {where.line + 1}" if where is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(
            f"{path}{line} is not valid YAML ({problem}): fix the file (indentation with spaces, `key: value` pairs)."
        ) from None
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise ConfigError(
            f"{path} holds a YAML {type(tree).__name__}, not a mapping of settings: see "
            "configs/default.yaml for the shape."
        )
    return tree


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    """Load a YAML config file (or defaults when `path` is None) and apply overrides."""
    base = read_yaml_config(path) if path is not None else {}
    return build_config(base, overrides)


def split_params(params: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The Airflow form's `config_file`, and the settings it sets: flat fields, then `overrides`."""
    params = dict(params)
    config_file = params.pop("config_file", None) or None
    extra = params.pop("overrides", None) or {}
    # Form fields left empty mean "keep the file's value".
    flat = {k: v for k, v in params.items() if v is not None and v != ""}
    return config_file, {**flat, **extra}


def config_from_params(params: dict[str, Any]) -> PipelineConfig:
    """Build the config from the Airflow form: `config_file` plus flat params plus `overrides` dict."""
    config_file, settings = split_params(params)
    return load_config(config_file, settings)
