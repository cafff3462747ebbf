"""Row filters: drop rows that are not prose worth pretraining on, by rule (datatrove's Gopher and C4 heuristics,
adapted to rows) and by language (py3langid, whose model ships in its wheel), counting why.
docs/data.md#filters-corpusfilters

    row_filter = RowFilter(cfg.corpus.filters); row_filter.reason(row)   # None: keep it; .counts: why dropped
"""

from __future__ import annotations

import re
import string
import threading
from collections.abc import Callable

from mlm_tasks.config import FilterConfig

# Gopher's stop words (datatrove STOP_WORDS).
STOP_WORDS = frozenset(["the", "be", "to", "of", "and", "that", "have", "with"])
# C4's terminal punctuation (datatrove END_PUNCTUATION); a row ending in "..." is not a sentence's end.
END_PUNCTUATION = (".", "?", "!", '"', "'")
# Gopher's repetition table starts at 5-grams (0.15); longer n-grams repeat inside repeated 5-grams.
DUPLICATE_NGRAM_SIZE = 5
# MediaWiki list and indent marks a row may start with (gensim keeps them): `#`, `*`, `:`, `;`.
LIST_MARKERS = "#*:; "
# A word: a whitespace token with a letter or digit (a WikiText heading `= = History = =` is one word).
_WORD = re.compile(r"\S*[^\W_]\S*")
_load_lock = threading.Lock()
_model = None


class Row:
    """A row's text and its words, split once for every rule."""

    def __init__(self, text: str) -> None:
        self.text, self.words = text, _WORD.findall(text)


Check = Callable[[Row], bool]


def mean_word_length(row: Row) -> float:
    return sum(map(len, row.words)) / len(row.words)


def alpha_word_fraction(row: Row) -> float:
    """Gopher: the share of words holding an alphabetic character (numbers, codes, formulas hold none)."""
    return sum(any(c.isalpha() for c in w) for w in row.words) / len(row.words)


def symbol_word_ratio(row: Row) -> float:
    """Gopher: hashes and ellipses per word (hashtag lists, truncated snippets). A row's leading `#` is a
    MediaWiki numbered-list marker (`# Non-violence (Ahimsa);`), not a hashtag: it is not counted."""
    text = row.text.lstrip(LIST_MARKERS)
    return (text.count("#") + text.count("...") + text.count("…")) / len(row.words)


def duplicate_ngram_fraction(row: Row, n: int = DUPLICATE_NGRAM_SIZE) -> float:
    """Gopher's duplicate n-gram character fraction (datatrove find_all_duplicate): the characters of word
    n-grams seen before in the row, a repeat counted once and skipped past so overlaps do not count twice."""
    words, seen, repeated, i = row.words, set(), 0, 0
    while i <= len(words) - n:
        gram = " ".join(words[i : i + n])
        if gram in seen:
            repeated += len(gram)
            i += n
        else:
            seen.add(gram)
            i += 1
    return repeated / len(row.text)


def _ratio_rules(cfg: FilterConfig) -> list[tuple[str, Check]]:
    """The rules that divide by the word count; rows under ratio_min_words skip them."""
    rules: list[tuple[str, Check]] = []
    low, high = cfg.min_mean_word_length, cfg.max_mean_word_length
    rules.append(("mean_word_length", lambda r: not low <= mean_word_length(r) <= high))
    if cfg.min_alpha_word_fraction > 0:
        rules.append(("non_alpha_words", lambda r: alpha_word_fraction(r) < cfg.min_alpha_word_fraction))
    rules.append(("symbol_ratio", lambda r: symbol_word_ratio(r) > cfg.max_symbol_word_ratio))
    if cfg.max_duplicate_ngram_fraction < 1:
        rules.append(("repeated_ngrams", lambda r: duplicate_ngram_fraction(r) > cfg.max_duplicate_ngram_fraction))
    at_least = cfg.ratio_min_words
    return [(name, _when_long_enough(check, at_least)) for name, check in rules]


def _when_long_enough(check: Check, at_least: int) -> Check:
    return lambda r: len(r.words) >= at_least and check(r)


def build_rules(cfg: FilterConfig) -> list[tuple[str, Check]]:
    """The enabled rules as (name, check), cheapest first; the names are RowFilter's count keys."""
    rules: list[tuple[str, Check]] = []
    if cfg.min_words > 0:
        rules.append(("too_few_words", lambda r: len(r.words) < cfg.min_words))
    rules.append(("too_many_words", lambda r: len(r.words) > cfg.max_words))
    rules.append(("long_word", lambda r: any(len(w) > cfg.max_word_chars for w in r.text.split())))
    if cfg.drop_curly_brackets:
        rules.append(("curly_bracket", lambda r: "{" in r.text))
    if cfg.boilerplate_phrases:
        phrases = re.compile("|".join(re.escape(p.lower()) for p in cfg.boilerplate_phrases))
        rules.append(("boilerplate", lambda r: phrases.search(r.text.lower()) is not None))
    if cfg.require_end_punctuation:
        rules.append(("no_end_punctuation", _lacks_end_punctuation))
    rules += _ratio_rules(cfg)
    if cfg.min_stop_words > 0:
        rules.append(("few_stop_words", lambda r: stop_word_count(r) < cfg.min_stop_words))
    return rules


def stop_word_count(row: Row) -> int:
    return sum(w.strip(string.punctuation).lower() in STOP_WORDS for w in row.words)


def _lacks_end_punctuation(row: Row) -> bool:
    text = row.text.rstrip()
    return not text.endswith(END_PUNCTUATION) or text.endswith("...")


class RowFilter:
    """The filters `cfg` enables, with a count per rule of the rows it dropped; rules run in a fixed order,
    cheapest first (language last), and a row is counted under the first rule that drops it."""

    def __init__(self, cfg: FilterConfig) -> None:
        self._rules = build_rules(cfg) if cfg.enabled else []
        if cfg.enabled and cfg.languages:
            self._rules.append(("language", _language_check(cfg)))
        self.counts: dict[str, int] = {"seen": 0, "kept": 0} | dict.fromkeys((name for name, _ in self._rules), 0)

    def reason(self, text: str) -> str | None:
        """The name of the first rule that drops `text`, or None to keep it; counts either way."""
        self.counts["seen"] += 1
        name = None
        if self._rules:
            row = Row(text)
            name = next((name for name, check in self._rules if check(row)), None)
        self.counts["kept" if name is None else name] += 1
        return name


def _language_check(cfg: FilterConfig) -> Check:
    """Drop a row whose most likely language is not one of cfg.languages with at least min_language_score;
    a row under language_min_chars is too short to judge (kept), and loads no model."""
    languages = tuple(cfg.languages)

    def check(row: Row) -> bool:
        if len(row.text) < cfg.language_min_chars:
            return False
        language, probability = _identifier().classify(row.text)
        return language not in languages or probability < cfg.min_language_score

    return check


def _identifier():
    # Our own identifier with normalized probabilities (a threshold means the same on short and long rows), never
    # py3langid's module global: set_languages on that one would narrow the candidates for every caller.
    global _model
    if _model is None:
        with _load_lock:  # two threads' first long rows load it once
            if _model is None:
                from py3langid.langid import MODEL_FILE, LanguageIdentifier

                _model = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    return _model
