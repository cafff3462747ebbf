"""Whole-word masking in the graph, for tokenizers that mark a word's first piece with "▁" (Metaspace).

    masker = WholeWordMasker(tokenizer, mlm_probability=0.15, max_predictions=32)
    masked, labels = masker(ids, special, BatchSeededRng(seed, batch_index))   # a tf.data map, or under XLA

transformers' `whole_word_mask` collator is torch-only and needs offsets, so words are found from the pieces;
every shape is static, so it runs under `jit_compile=True`.
docs/configuration.md#whole-word-masking-trainwhole_word_mask
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mlm_tasks.errors import ConfigError

WORD_START = "▁"  # Metaspace's replacement for a space: tokenizer.py trains with it
BYTE_LEVEL_WORD_START = "Ġ"  # the byte-level BPE's (RoBERTa's) mark, named in the error when seen


def check_word_starts(pieces: Iterable[str], whose: str) -> None:
    """Raise ConfigError when no piece of a vocabulary starts with "▁": whole-word masking would then
    see one word per sequence. `whose` names the tokenizer in the message (e.g. "model.init_from x")."""
    pieces = list(pieces)
    if any(p.startswith(WORD_START) for p in pieces):
        return
    seen = (
        f" (its pieces mark a word with {BYTE_LEVEL_WORD_START!r}: a byte-level BPE, like RoBERTa's)"
        if any(p.startswith(BYTE_LEVEL_WORD_START) for p in pieces)
        else ""
    )
    raise ConfigError(
        f"train.whole_word_mask needs a Metaspace tokenizer, whose word-initial pieces start with "
        f"{WORD_START!r} (SentencePiece/Unigram, like the one this project trains), but the tokenizer of "
        f"{whose} has no such piece{seen}: set train.whole_word_mask=false to mask single tokens."
    )


def check_tokenizer_words(tokenizer_json: str, whose: str) -> None:
    """`check_word_starts` on the pieces of a tokenizer.json (its added tokens included)."""
    from tokenizers import Tokenizer

    check_word_starts(Tokenizer.from_str(tokenizer_json).get_vocab(with_added_tokens=True), whose)


def starts_word_table(vocab: Mapping[str, int], special_ids: Iterable[int], size: int) -> Any:
    """bool[size] (numpy), True for the ids that start a word: "▁" pieces and the special tokens."""
    import numpy as np

    table = np.zeros(size, dtype=bool)
    starts = [i for piece, i in vocab.items() if piece.startswith(WORD_START) and i < size]
    table[starts] = True
    table[list(special_ids)] = True
    return table


def select_whole_words(ids, special, starts_word, probability: float, max_predictions: int, uniform):
    """bool[batch, length]: the positions of the words drawn for prediction, each word whole.

    `starts_word` is `starts_word_table` as a tf constant, `special` marks the special positions and
    `uniform(shape)` draws floats in [0, 1). Each word is drawn with `probability` (one vectorised op).
    `max_predictions` > 0: only drawn words that end within the first `max_predictions` selected tokens
    of their row are kept, so no word is cut by the LM head's slots."""
    import tensorflow as tf

    # A special position ends the word before it; position 0 starts a word (a chunk may start mid-word).
    after_special = tf.concat([tf.ones_like(special[:, :1]), special[:, :-1]], axis=1)
    starts = tf.gather(starts_word, ids) | special | after_special
    word = tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1  # each position's word index in its row
    # One draw per word: word k of a row takes the row's k-th draw (there are never more words than positions).
    drawn = tf.gather(uniform(tf.shape(ids)), word, batch_dims=1) < probability
    selected = drawn & ~special
    if not max_predictions:
        return selected
    running = tf.cumsum(tf.cast(selected, tf.int32), axis=1)
    # The running count at a word's last piece, given to all its pieces: a segment max over (row, word).
    length = tf.shape(ids)[1]
    segment = word + tf.range(tf.shape(ids)[0])[:, None] * length
    at_end = tf.math.unsorted_segment_max(
        tf.reshape(running, [-1]), tf.reshape(segment, [-1]), num_segments=tf.size(ids)
    )
    return selected & (tf.gather(at_end, segment) <= max_predictions)


def make_collator(tokenizer, mlm_probability: float, replace: tuple[float, float] = (0.8, 0.1)):
    """transformers' collator; `replace`: the shares of the selected tokens shown as <mask> and as a random
    token (the rest stay unchanged)."""
    from transformers import DataCollatorForLanguageModeling

    mask_share, random_share = replace
    return DataCollatorForLanguageModeling(
        tokenizer=tokenizer,
        mlm=True,
        mlm_probability=mlm_probability,
        mask_replace_prob=mask_share,
        random_replace_prob=min(random_share, 1.0 - mask_share),  # a sum of 1 may round above it
        return_tensors="tf",
    )


class WholeWordMasker:
    """`masker(ids, special, rng) -> (masked ids, labels)`, labels -100 where nothing is masked.

    The 80/10/10 rule (<mask>, a random token, unchanged; `replace` sets the first two) is decided per
    token, as BERT's whole-word release does (its loop draws once per piece of a chosen word) and
    transformers' whole-word collator too: the model still sees some pieces of a masked word as themselves
    or as noise, and the shares of <mask>, random and kept tokens are those of token-level masking."""

    def __init__(
        self, tokenizer, mlm_probability: float, max_predictions: int = 0, replace: tuple[float, float] = (0.8, 0.1)
    ):
        import tensorflow as tf

        vocab = tokenizer.get_vocab()
        check_word_starts(vocab, "the shards")
        self.vocab_size, self.mask_id = len(tokenizer), tokenizer.mask_token_id
        table = starts_word_table(vocab, tokenizer.all_special_ids, self.vocab_size)
        self.starts_word = tf.constant(table)  # built once, captured by the graph
        self.probability, self.max_predictions = mlm_probability, max_predictions
        # The collator's own 80/10/10 on our selection: at mlm_probability 1 it selects every position its
        # special-tokens mask leaves, so passing "not selected" as that mask makes its selection ours.
        self.collator = make_collator(tokenizer, 1.0, replace)

    def __call__(self, ids, special, rng):
        selected = select_whole_words(
            ids, special, self.starts_word, self.probability, self.max_predictions, rng.uniform
        )
        self.collator.generator = rng
        return self.collator.tf_mask_tokens(
            ids, vocab_size=self.vocab_size, mask_token_id=self.mask_id, special_tokens_mask=~selected
        )
