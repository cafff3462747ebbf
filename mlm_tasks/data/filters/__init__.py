"""Row filters: drop rows that are not prose worth pretraining on, by rule and by language, counting why.

    row_filter = RowFilter(cfg.corpus.filters)
    for split, row in corpus.split_rows(part, num_parts):
        if row_filter.reason(row) is None: ...          # keep it
    row_filter.counts   # {"seen": 18384, "kept": 17820, "too_few_words": 25, ...}

The rules are the Gopher and C4 heuristics datatrove ships (GopherQualityFilter, GopherRepetitionFilter,
C4QualityFilter, FineWebQualityFilter; rules.py cites each), reimplemented over rows: our rows are
paragraphs or lines (WikiText-style Wikipedia paragraphs with headings, captions and list items; lines of
.txt files; jsonl records), not the web pages those filters judge. So:

- Kept, per row: word count bounds (Gopher 50..100,000 words: the lower bound is 1 here, since a paragraph
  of a few words is normal and a heading one), mean word length, the alphabetic-word share, hashes and
  ellipses per word, C4's long-word, curly-bracket and boilerplate-phrase rules, Gopher's duplicate 5-gram
  character fraction inside the row, and, off by default, Gopher's stop-word rule and C4's terminal
  punctuation rule (each would drop most headings and captions: 63% and 67% of the embedded rows).
- Ratio rules skip rows under `ratio_min_words` words: over one or two words (headings, table cells) a
  share is 0, 1/2 or 1 and says nothing (applied from one word, Gopher's word-length and alphabetic
  thresholds drop 18% of the embedded rows: headings of one long word, every number of a table).
- Loosened from Gopher's page thresholds, which on short rows drop captions and titles ("A Star Is Born",
  "Einstein at the age of 3 in 1882"): mean word length 2..12 characters (Gopher 3..10), alphabetic words
  at least half (Gopher 0.8: 2.8% of the embedded rows, most of them captions with a year). A row's leading
  `#` is a MediaWiki list marker, not a hashtag, so the symbol rule does not count it.
- Left out: Gopher's bullet-line and ellipsis-line shares, FineWeb's line-punctuation, short-line and
  newline-per-word shares, and C4's five-sentence minimum: they are fractions of a page's lines, and a row
  is one line (C4's per-line rules are the row rules above). Gopher's duplicate line/paragraph fractions
  and FineWeb's duplicate-line characters: repeats across rows are deduplication's question, not a row's.
  Gopher's top 2/3/4-gram fractions: on a row of ten words one repeated pair ("of the") already passes
  0.2. C4's bad-words list: it is a download, and our hosts have no network.
- Language ID (language.py) skips rows under `language_min_chars` characters: below ~100 characters
  py3langid reads headings, names and references as other languages (on the embedded corpus, 12.9% of
  the rows of 20 characters or more are not called English, 0.43% of those of 100 or more).

Measured on the embedded corpus (docs/data.md#filters): the defaults drop few rows, nearly all table cells,
reference lists and markup, at tens of thousands of rows per second on one core.
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
