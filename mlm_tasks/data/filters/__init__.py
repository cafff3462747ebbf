"""Row filters: drop rows that are not prose worth pretraining on, by rule and by language, counting why.

    row_filter = RowFilter(cfg.corpus.filters)
    if row_filter.reason(row) is None: ...          # keep it
    row_filter.counts   # {"seen": 18384, "kept": 17820, "too_few_words": 25, ...}

What was adapted from datatrove's Gopher and C4 filters, and why: docs/data.md#filters-corpusfilters
"""

from __future__ import annotations

from mlm_tasks.config import FilterConfig
from mlm_tasks.data.filters import language
from mlm_tasks.data.filters.rules import Row, build_rules


class RowFilter:
    """The filters `cfg` enables, with a count per rule of the rows it dropped; rules run in a fixed order,
    cheapest first (language last), and a row is counted under the first rule that drops it."""

    def __init__(self, cfg: FilterConfig) -> None:
        self._rules = build_rules(cfg) if cfg.enabled else []
        if cfg.enabled and cfg.languages:
            languages, min_chars, min_score = tuple(cfg.languages), cfg.language_min_chars, cfg.min_language_score
            # A row under language_min_chars is too short to judge: kept.
            self._rules.append(
                ("language", lambda r: len(r.text) >= min_chars and not language.is_in(r.text, languages, min_score))
            )
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
