"""Row filters: each rule drops its crafted row and keeps Wikipedia prose; language ID; counts; config bounds."""

import subprocess
import sys

import pytest

from mlm_tasks.config import CorpusConfig, FilterConfig, build_config
from mlm_tasks.data.corpus import open_corpus
from mlm_tasks.data.filters import RowFilter
from mlm_tasks.errors import ConfigError

# A paragraph of the embedded corpus (the Anarchism article), as open_corpus yields it.
WIKI_PARAGRAPH = (
    "The first political philosopher to call himself an anarchist was Pierre-Joseph Proudhon, marking the "
    "formal birth of anarchism in the mid-nineteenth century. Since the 1890s, and beginning in France, "
    "the term libertarianism has often been used as a synonym for anarchism."
)
GERMAN = (
    "Die Stadt liegt am Ufer des Flusses und ist bekannt für ihre alten Kirchen, den großen Markt und die "
    "Universität, an der seit dem Mittelalter gelehrt wird."
)
FRENCH = (
    "La ville est située sur la rive du fleuve et elle est connue pour ses vieilles églises, son grand "
    "marché et son université, où l'on enseigne depuis le Moyen Âge."
)

# (rule, a row only that rule should drop, settings that turn the rule on where it is off by default)
CRAFTED = [
    ("too_few_words", "* .", {}),
    ("too_many_words", "word " * 101, {"max_words": 100}),
    ("long_word", "see " + "QUJD" * 300 + " here", {}),
    ("curly_bracket", "int main() { return 0; }", {}),
    ("boilerplate", "This site uses cookies to improve your experience.", {}),
    ("boilerplate", "Lorem ipsum dolor sit amet, consectetur adipiscing elit.", {}),
    ("no_end_punctuation", "Woodcut from a Diggers document by William Everard", {"require_end_punctuation": True}),
    ("mean_word_length", "a b c d e f g h", {}),
    ("mean_word_length", "File:RomaniaDanubeDelta MakingMaterialForCOnstructing0003jpg|Danube Delta", {}),
    ("non_alpha_words", "6–3, 4–6, 6–2, 1–6, 4–6", {}),
    ("symbol_ratio", "#tbt #love #summer #photo", {}),
    ("symbol_ratio", "Read more... Read on... and then...", {}),
    ("repeated_ngrams", "buy cheap pills online now " * 4, {}),
    ("few_stop_words", "Proudhon, French philosopher, anarchist, socialist, economist.", {"min_stop_words": 2}),
]


@pytest.mark.parametrize(("rule", "row", "settings"), CRAFTED, ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(CRAFTED)])
def test_each_rule_drops_its_crafted_row_and_keeps_a_wikipedia_paragraph(rule, row, settings):
    row_filter = RowFilter(FilterConfig(**settings))
    assert row_filter.reason(row) == rule
    assert row_filter.reason(WIKI_PARAGRAPH) is None
    assert row_filter.counts[rule] == 1


def test_ratio_rules_skip_short_rows_and_leading_list_markers():
    row_filter = RowFilter(FilterConfig())
    # A table cell, a heading of one long word, a numbered list item: kept (too short to judge, or markup).
    for row in ["10", "= = Characteristics = =", "# Non-violence (Ahimsa);", "* Dakota War of 1862"]:
        assert row_filter.reason(row) is None, row


def test_language_id_keeps_english_and_drops_german_and_french():
    row_filter = RowFilter(FilterConfig(languages=["en"]))
    assert row_filter.reason(WIKI_PARAGRAPH) is None
    assert row_filter.reason(GERMAN) == "language"
    assert row_filter.reason(FRENCH) == "language"
    assert row_filter.reason("Die Stadt am Fluss") is None  # under language_min_chars: not judged
    assert RowFilter(FilterConfig(languages=["en", "de"])).reason(GERMAN) is None


def test_the_language_model_loads_only_for_a_long_row():
    probe = (
        "import sys\n"
        "from mlm_tasks.config import FilterConfig\n"
        "from mlm_tasks.data.filters import RowFilter\n"
        "f = RowFilter(FilterConfig(languages=['en']))\n"
        "f.reason('A short row.')\n"
        "print('py3langid' in sys.modules)\n"
        f"f.reason({WIKI_PARAGRAPH!r})\n"
        "print('py3langid' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "True"]


def test_counts_add_up():
    row_filter = RowFilter(FilterConfig(languages=["en"]))
    rows = [WIKI_PARAGRAPH, GERMAN, "10"] + [row for _, row, settings in CRAFTED if not settings]
    reasons = [row_filter.reason(row) for row in rows]
    counts = row_filter.counts
    rules = {name: count for name, count in counts.items() if name not in ("seen", "kept")}
    assert counts["seen"] == len(rows) == counts["kept"] + sum(rules.values())
    assert counts["kept"] == reasons.count(None) == 2
    assert set(rules) >= {name for name in reasons if name}


def test_disabled_filters_keep_everything():
    row_filter = RowFilter(FilterConfig(enabled=False, languages=["en"], min_stop_words=2))
    rows = [row for _, row, _ in CRAFTED] + [GERMAN]
    assert [row_filter.reason(row) for row in rows] == [None] * len(rows)
    assert row_filter.counts == {"seen": len(rows), "kept": len(rows)}


def test_defaults_drop_little_of_the_embedded_corpus():
    corpus = open_corpus(CorpusConfig(max_articles=8))
    row_filter = RowFilter(CorpusConfig().filters)
    for _, row in corpus.split_rows():
        row_filter.reason(row)
    assert row_filter.counts["seen"] > 500
    assert row_filter.counts["kept"] >= 0.97 * row_filter.counts["seen"], row_filter.counts


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("min_alpha_word_fraction", 1.5, "less than or equal to 1"),
        ("max_symbol_word_ratio", -0.1, "greater than or equal to 0"),
        ("max_duplicate_ngram_fraction", 2, "less than or equal to 1"),
        ("min_words", -1, "greater than or equal to 0"),
        ("max_words", 10**9, "less than or equal to"),
        ("min_language_score", 1.2, "less than or equal to 1"),
        ("languages", ["English"], "not ISO 639 codes"),
        ("boilerplate_phrases", ["lorem ipsum", " "], "empty phrase"),
        ("min_mean_word_length", 20, "above max_mean_word_length"),
        ("enabeld", True, "Unknown setting 'corpus.filters.enabeld'"),
    ],
)
def test_a_bad_setting_is_refused(setting, value, message):
    with pytest.raises(ConfigError, match=message):
        build_config(overrides={f"corpus.filters.{setting}": value})
