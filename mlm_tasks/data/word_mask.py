"""Whole-word masking in the graph (static shapes: it runs under XLA), for tokenizers that mark a word's first
piece with "▁" (Metaspace); transformers' whole-word collator is torch-only and needs offsets.
docs/configuration.md#whole-word-masking-trainwhole_word_mask

    selected = WholeWordMasker(tokenizer, 0.15, 32)(ids, special, rng)   # make_masker (data/input.py) masks them
"""

from __future__ import annotations

from collections.abc import Iterable

from mlm_tasks.errors import ConfigError

WORD_START = "▁"  # Metaspace's replacement for a space: tokenizer.py trains with it
BYTE_LEVEL_WORD_START = "Ġ"  # the byte-level BPE's (RoBERTa's) mark, named in the error when seen


def check_word_starts(pieces: Iterable[str], whose: str) -> None:
    """ConfigError when no piece of `whose` vocabulary starts with "▁" (whole-word masking would see one word)."""
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


class WholeWordMasker:
    """`masker(ids, special, rng) -> bool[batch, length]`: the positions of the words drawn for prediction,
    each word whole, with `mlm_probability` (`rng.uniform`: BatchSeededRng). `max_predictions` > 0: only words
    that end within the first `max_predictions` selected tokens of their row, so no word is cut by the LM
    head's slots. make_masker applies the 80/10/10 rule to them per token, as BERT's whole-word release does."""

    def __init__(self, tokenizer, mlm_probability: float, max_predictions: int = 0):
        import numpy as np
        import tensorflow as tf

        vocab, size = tokenizer.get_vocab(), len(tokenizer)
        check_word_starts(vocab, "the shards")
        starts_word = np.zeros(size, dtype=bool)  # the ids that start a word: "▁" pieces and the special tokens
        starts_word[[i for piece, i in vocab.items() if piece.startswith(WORD_START) and i < size]] = True
        starts_word[list(tokenizer.all_special_ids)] = True
        self.starts_word = tf.constant(starts_word)  # built once, captured by the graph
        self.probability, self.max_predictions = mlm_probability, max_predictions

    def __call__(self, ids, special, rng):
        import tensorflow as tf

        # A special position ends the word before it; position 0 starts a word (a chunk may start mid-word).
        after_special = tf.concat([tf.ones_like(special[:, :1]), special[:, :-1]], axis=1)
        starts = tf.gather(self.starts_word, ids) | special | after_special
        word = tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1  # each position's word index in its row
        # One draw per word: word k of a row takes the row's k-th draw (there are never more words than positions).
        drawn = tf.gather(rng.uniform(tf.shape(ids)), word, batch_dims=1) < self.probability
        selected = drawn & ~special
        if not self.max_predictions:
            return selected
        running = tf.cumsum(tf.cast(selected, tf.int32), axis=1)
        # The running count at a word's last piece, given to all its pieces: a segment max over (row, word).
        segment = word + tf.range(tf.shape(ids)[0])[:, None] * tf.shape(ids)[1]
        at_end = tf.math.unsorted_segment_max(
            tf.reshape(running, [-1]), tf.reshape(segment, [-1]), num_segments=tf.size(ids)
        )
        return selected & (tf.gather(at_end, segment) <= self.max_predictions)
