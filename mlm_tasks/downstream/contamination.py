"""Is a downstream task's scored text in the pretraining data? A model that pretrained on the evaluation
sentences scores them better than it would score new ones, and the gate would credit it.

    found = contaminated({"sst2": (texts, pairs)}, train_rows)   # {"sst2": [indices of examples]}

The check GPT-3's authors ran on their benchmarks (Brown et al. 2020, appendix C): an example counts as
contaminated when one of its word 13-grams (lower-cased, punctuation dropped) occurs in the pretraining
train split; an example of 8 to 12 words, when its whole word sequence does (shorter ones are not
checked: their words occur anywhere). One pass over the
corpus's rows, with the examples' n-grams in memory (a few thousand examples: a few MB). The default's
own task needs none (held_out.py takes its passages from articles pretraining never reads).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

NGRAM = 13
MIN_WORDS = 8
_WORD = re.compile(r"\w+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _grams(words: list[str], n: int) -> set[tuple[str, ...]]:
    if len(words) <= n:
        return {tuple(words)} if words else set()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def contaminated(
    tasks: Mapping[str, tuple[Sequence[str], Sequence[str] | None]], rows: Iterable[str], n: int = NGRAM
) -> dict[str, list[int]]:
    """Per task name, the indices of its examples (text, and pair text when there is one) that share an
    n-gram with `rows`, read once for every task. Examples under MIN_WORDS words are not checked (a short
    sentence's words occur anywhere)."""
    owners: dict[tuple[str, ...], list[tuple[str, int]]] = {}
    for name, (texts, pairs) in tasks.items():
        for i, text in enumerate(texts):
            for part in (text, pairs[i]) if pairs is not None else (text,):
                words = _words(part)
                if len(words) >= MIN_WORDS:
                    for gram in _grams(words, n):
                        owners.setdefault(gram, []).append((name, i))
    lengths = sorted({len(g) for g in owners})
    found: dict[str, set[int]] = {name: set() for name in tasks}
    for row in rows:
        words = _words(row)
        for k in lengths:
            for j in range(len(words) - k + 1):
                for name, i in owners.get(tuple(words[j : j + k]), ()):
                    found[name].add(i)
    return {name: sorted(hits) for name, hits in found.items()}
