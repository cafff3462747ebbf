"""Row filters: drop rows that are not prose worth pretraining on, by rule (rules.py) and by language
(py3langid, whose model ships in its wheel), counting why.

    row_filter = RowFilter(cfg.corpus.filters)
    if row_filter.reason(row) is None: ...          # keep it
    row_filter.counts   # {"seen": 18384, "kept": 17820, "too_few_words": 25, ...}

What was adapted from datatrove's Gopher, C4 and language filters, and why: docs/data.md#filters-corpusfilters
"""

from __future__ import annotations

import threading

from mlm_tasks.config import FilterConfig
from mlm_tasks.data.filters.rules import Check, Row, build_rules

_load_lock = threading.Lock()
_model = None


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
