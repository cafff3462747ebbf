"""Is a downstream task's scored text in the pretraining data? A model that pretrained on it would score
better than on new text. GPT-3's check (Brown et al. 2020, appendix C): an example is contaminated when one
of its word 13-grams (lower-cased, no punctuation) occurs in the train split; one of 8 to 12 words, when its
whole word sequence does.

    mark_contamination(cfg.corpus, entries, {"sst2": (texts, pairs)})   # the record and warning per entry
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

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
    tasks: Mapping[str, tuple[Sequence[str], Sequence[str] | None]], rows: Iterable[str]
) -> dict[str, list[int]]:
    """Per task name, the indices of its examples (text, or pair text) that share an n-gram (NGRAM words) with
    `rows`, read once. Examples under MIN_WORDS words are not checked (a short sentence's words occur anywhere)."""
    owners: dict[tuple[str, ...], list[tuple[str, int]]] = {}
    for name, (texts, pairs) in tasks.items():
        for i, text in enumerate(texts):
            for part in (text, pairs[i]) if pairs is not None else (text,):
                words = _words(part)
                if len(words) >= MIN_WORDS:
                    for gram in _grams(words, NGRAM):
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


def mark_contamination(
    corpus_cfg: Any, entries: Sequence[Any], tasks: Mapping[str, tuple[Sequence[str], Sequence[str] | None]]
) -> None:
    """Adds to each entry of `tasks` its examples found in the corpus's train split, and a warning if any."""
    from mlm_tasks.data.corpus import open_corpus

    began = time.perf_counter()
    found = contaminated(tasks, open_corpus(corpus_cfg).rows("train"))
    log.info(
        "Contamination check (%d-grams) of %d task(s) against the train split: %.0fs",
        *(NGRAM, len(tasks), time.perf_counter() - began),
    )
    for entry in [e for e in entries if e["name"] in found]:
        hits, texts = found[entry["name"]], tasks[entry["name"]][0]
        record: dict[str, Any] = {
            "ngram": NGRAM,
            "checked": len(texts),
            "found": len(hits),
            "examples": [texts[i][:200] for i in hits[:3]],
        }
        entry["contamination"] = record
        if hits:
            warning = (
                f"{entry['name']}: {len(hits)} of {len(texts)} scored examples share a {NGRAM}-word sequence with the "
                f"pretraining train split (e.g. {texts[hits[0]][:120]!r}): the model may have read them, and its "
                "score may be inflated; remove them from the task or the corpus."
            )
            record["warning"] = warning
            entry["warnings"].append(warning)
            log.warning("%s", warning)
