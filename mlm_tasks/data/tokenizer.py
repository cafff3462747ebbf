"""Train a tokenizer (Unigram, BPE or WordPiece) on the train split and save it as a PreTrainedTokenizerFast.
Training is not reproducible id-for-id: one tokenizer per data fingerprint (first writer wins), read back to encode.

    tok = train_subwords(rows, cfg.tokenizer); add_spare_tokens(tok, 8); save_tokenizer(tok, uri, 128)
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import tempfile
from collections.abc import Iterable

from mlm_tasks import storage
from mlm_tasks.config import SPECIAL_TOKENS, TokenizerConfig
from mlm_tasks.data.corpus.base import empty_corpus_error
from mlm_tasks.errors import ConfigError, MissingArtifactError
from mlm_tasks.paths import join

log = logging.getLogger(__name__)
SPARE = re.compile(r"<unused\d+>")  # the spare tokens' names (tokenizer.reserved_tokens)


def train_subwords(rows: Iterable[str], cfg: TokenizerConfig):
    """A `tokenizers.Tokenizer` of `cfg.model` trained on `rows`, with RoBERTa's specials and post-processing."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    rows = iter(rows)
    first = next(rows, None)
    if first is None:
        raise empty_corpus_error()
    common = {
        "vocab_size": cfg.vocab_size,
        "special_tokens": [AddedToken(t, lstrip=(t == "<mask>"), normalized=False) for t in SPECIAL_TOKENS],
        "show_progress": False,
    }
    if cfg.model == "bpe":  # byte-level, as RoBERTa's and OLMo's: every string encodes, no <unk>
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        trainer = trainers.BpeTrainer(initial_alphabet=alphabet, max_token_length=cfg.max_piece_length, **common)
    elif cfg.model == "wordpiece":  # BERT's: words split on spaces and punctuation, "##" inside a word
        tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.BertPreTokenizer(), decoders.WordPiece(prefix="##")
        trainer = trainers.WordPieceTrainer(continuing_subword_prefix="##", **common)
    else:
        tok = Tokenizer(models.Unigram())
        # prepend_scheme="first": without it "is <mask>." gains stray ▁ pieces and fill-mask collapses.
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
        trainer = trainers.UnigramTrainer(unk_token="<unk>", max_piece_length=cfg.max_piece_length, **common)
    tok.normalizer = normalizers.Sequence(
        [normalizers.NFKC(), normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    )
    try:
        tok.train_from_iterator(itertools.chain([first], rows), trainer=trainer)
    except Exception as err:  # the trainer raises a bare Exception for this one bad input
        if "not large enough to contain all chars" not in str(err):
            raise
        raise ConfigError(
            f"tokenizer.vocab_size {cfg.vocab_size} is smaller than this corpus's distinct "
            f"characters plus the {len(SPECIAL_TOKENS)} special tokens (every character needs a "
            "piece): raise vocab_size."
        ) from None
    if tok.get_vocab_size() < cfg.vocab_size:
        # The trainer stops early when the corpus has fewer useful pieces than asked for.
        raise ConfigError(
            f"tokenizer.vocab_size {cfg.vocab_size} is larger than this corpus supports "
            f"(the trainer found only {tok.get_vocab_size()} pieces): lower vocab_size."
        )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))],
    )
    return tok


def add_spare_tokens(tok, reserved: int) -> int:
    """Append at least `reserved` spare special tokens <unused0>, <unused1>... (names the vocabulary lacks), as
    many as make its size a multiple of 64; none when `reserved` is 0. Returns how many were added."""
    from tokenizers import AddedToken

    if not reserved:
        return 0
    count = reserved + (-(tok.get_vocab_size() + reserved)) % 64
    names = (f"<unused{i}>" for i in itertools.count() if tok.token_to_id(f"<unused{i}>") is None)
    tok.add_special_tokens([AddedToken(next(names), normalized=False) for _ in range(count)])
    return count


def to_pretrained(tok, max_length: int):
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token=AddedToken("<mask>", lstrip=True, normalized=False),
        model_max_length=max_length,
    )


def save_tokenizer(tok, uri: str, max_length: int) -> bool:
    """Save the tokenizer under `uri`, first writer wins. Returns True if ours was the one saved."""
    won = storage.create_only(join(uri, "tokenizer.json"), tok.to_str().encode("utf-8"))
    if not won:
        log.info("Tokenizer for this fingerprint was already published at %s: using that one", uri)
    # The remaining files derive deterministically from tokenizer.json, so rewriting them is safe.
    with tempfile.TemporaryDirectory() as tmp:
        load_tokenizer(uri, max_length).save_pretrained(tmp)
        for name in os.listdir(tmp):
            if name != "tokenizer.json":
                with open(os.path.join(tmp, name), "rb") as f:
                    storage.write_bytes(join(uri, name), f.read())
    return won


def load_encoder(uri: str):
    """The published tokenizer as a bare `tokenizers.Tokenizer`: the same ids (its post-processor adds
    <s> ... </s>) without importing transformers, which costs seconds in every shard-writing task."""
    from tokenizers import Tokenizer

    path = join(uri, "tokenizer.json")
    if not storage.exists(path):
        raise MissingArtifactError(
            f"No tokenizer at {uri}: run train_tokenizer first (after plan_shards and the dedup steps) or check "
            "output_root."
        )
    return Tokenizer.from_str(storage.read_text(path))


def load_tokenizer(uri: str, max_length: int | None = None):
    """Load the published tokenizer (PreTrainedTokenizerFast) from a local folder or gs://."""
    return to_pretrained(load_encoder(uri), max_length or 512)
