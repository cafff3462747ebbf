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

LANGUAGE_RULE = "language"


class RowFilter:
    """The filters `cfg` enables, with a count per rule of the rows it dropped; rules run in a fixed order,
    cheapest first, and a row is counted under the first rule that drops it."""

    def __init__(self, cfg: FilterConfig) -> None:
        self.cfg = cfg
        self._rules = build_rules(cfg) if cfg.enabled else []
        self._languages = tuple(cfg.languages) if cfg.enabled else ()
        names = [name for name, _ in self._rules] + ([LANGUAGE_RULE] if self._languages else [])
        self.counts: dict[str, int] = {"seen": 0, "kept": 0} | dict.fromkeys(names, 0)

    @property
    def rule_names(self) -> list[str]:
        """The enabled rules, in the order they are tried."""
        return [name for name in self.counts if name not in ("seen", "kept")]

    def reason(self, row: str) -> str | None:
        """The name of the first rule that drops `row`, or None to keep it; counts either way."""
        self.counts["seen"] += 1
        name = self._first_failed(row)
        self.counts["kept" if name is None else name] += 1
        return name

    def _first_failed(self, text: str) -> str | None:
        if not self._rules and not self._languages:
            return None
        row = Row(text)
        for name, check in self._rules:
            if check(row):
                return name
        if self._languages and not self._language_ok(text):
            return LANGUAGE_RULE
        return None

    def _language_ok(self, text: str) -> bool:
        if len(text) < self.cfg.language_min_chars:
            return True  # too short to judge: keep
        return language.is_in(text, self._languages, self.cfg.min_language_score)
