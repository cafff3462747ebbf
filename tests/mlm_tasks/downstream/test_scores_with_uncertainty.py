"""A downstream score is a number with its noise: each metric a task may need, checked against scikit-learn's
and SciPy's (the references GLUE's own scorer uses), and the bootstrap interval that says how far the
number can be trusted."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from mlm_tasks.downstream.metrics import score
from mlm_tasks.downstream.scores import flags, needed_examples
from mlm_tasks.downstream.uncertainty import half_width_for, interval, paired_difference, unpaired_difference


def test_each_metric_matches_the_reference_implementation():
    rng = np.random.default_rng(0)
    for num_labels in (2, 3, 5):
        labels = rng.integers(num_labels, size=300)
        predictions = np.where(rng.random(300) < 0.6, labels, rng.integers(num_labels, size=300))
        assert score("accuracy", predictions, labels, num_labels) == pytest.approx(accuracy_score(labels, predictions))
        assert score("mcc", predictions, labels, num_labels) == pytest.approx(matthews_corrcoef(labels, predictions))
        macro = f1_score(labels, predictions, average="macro", labels=list(range(num_labels)))
        assert score("macro_f1", predictions, labels, num_labels) == pytest.approx(macro)
    assert score("f1", predictions[:50] % 2, labels[:50] % 2, 2) == pytest.approx(
        f1_score(labels[:50] % 2, predictions[:50] % 2)
    )
    assert score("mcc", np.zeros(10, int), np.arange(10) % 2, 2) == 0.0  # one predicted class: no correlation

    values = rng.normal(size=200)
    guesses = values + rng.normal(scale=0.8, size=200)
    guesses[:20] = np.round(guesses[:20])  # ties, as STS-B's 0-5 scores have
    assert score("pearson", guesses, values, 1) == pytest.approx(pearsonr(guesses, values)[0])
    assert score("spearman", guesses, values, 1) == pytest.approx(spearmanr(guesses, values)[0])


def test_the_interval_covers_the_score_and_narrows_with_more_examples():
    rng = np.random.default_rng(1)

    def seeds(n: int, rate: float, count: int = 3) -> tuple[np.ndarray, np.ndarray]:
        labels = np.arange(n) % 2
        right = rng.random((count, n)) < rate
        return np.where(right, labels, 1 - labels), labels

    small, small_labels = seeds(50, 0.7)
    large, large_labels = seeds(800, 0.7)
    lo, hi = interval("accuracy", small, small_labels, 2)
    big_lo, big_hi = interval("accuracy", large, large_labels, 2)
    mean = np.mean([score("accuracy", p, small_labels, 2) for p in small])
    assert lo < mean < hi and big_lo < 0.7 < big_hi
    # The half-width shrinks as 1/sqrt(n): 16x the examples, about a quarter of the width.
    assert 2.5 < (hi - lo) / (big_hi - big_lo) < 6
    # Binomial arithmetic bounds it: at p = 0.7 and one seed the 95% half-width on 50 examples is 0.127.
    assert 0.07 < (hi - lo) / 2 < 0.16
    assert half_width_for(50) == pytest.approx(0.1386, abs=1e-4) and needed_examples(0.05) == 385
    # A rerun gives the same interval (a fixed bootstrap seed): the gate's verdict does not flicker.
    assert interval("accuracy", small, small_labels, 2) == (lo, hi)


def test_pairing_sees_through_the_examples_noise_that_two_intervals_cannot():
    """Two models that get the same hard examples wrong, one of them 3 points worse: on 300 examples their
    intervals overlap, but the paired difference (same resampled examples) is clearly below zero."""
    rng = np.random.default_rng(2)
    n = 300
    labels = np.arange(n) % 2
    difficulty = rng.random(n)
    base = np.stack([np.where(difficulty + rng.normal(0, 0.02, n) < 0.75, labels, 1 - labels) for _ in range(3)])
    worse = np.stack([np.where(difficulty + rng.normal(0, 0.02, n) < 0.72, labels, 1 - labels) for _ in range(3)])
    a, b = interval("accuracy", worse, labels, 2), interval("accuracy", base, labels, 2)
    assert a[1] > b[0]  # the intervals overlap
    diff, lo, hi = paired_difference("accuracy", worse, base, labels, 2)
    assert diff == pytest.approx(
        np.mean([score("accuracy", w, labels, 2) for w in worse])
        - np.mean([score("accuracy", p, labels, 2) for p in base])
    )
    assert -0.05 < lo <= diff <= hi < 0
    u_diff, u_lo, u_hi = unpaired_difference(np.mean(a), a, np.mean(b), b)
    assert u_lo < 0 < u_hi and u_hi - u_lo > 2 * (hi - lo)


def test_a_fifty_example_evaluation_set_is_flagged_with_its_interval():
    rng = np.random.default_rng(3)
    labels = np.arange(50) % 2
    hard = rng.random(50)  # the seeds of one model err on mostly the same examples
    predictions = np.stack([np.where(hard + rng.normal(0, 0.05, 50) < 0.7, labels, 1 - labels) for _ in range(3)])
    entry = {
        "name": "tiny-sst",
        "metric": "accuracy",
        "examples": {"train": 150, "validation": 50},
        "pretrained": {"interval": list(interval("accuracy", predictions, labels, 2))},
    }
    (flag,) = flags(entry, max_half_width=0.1)
    lo, hi = entry["pretrained"]["interval"]
    assert flag.startswith(f"tiny-sst: the 95% interval of accuracy is ±{(hi - lo) / 2:.3f} over 50 scored examples")
    assert "about 97 for ±0.1" in flag, flag
    assert flags(entry, max_half_width=0.2) == []


def test_scored_text_found_in_the_pretraining_rows_is_named():
    from mlm_tasks.downstream.contamination import contaminated

    rows = [
        "In 1912 the new railway line reached the northern valley, and the first train carried timber and coal south.",
        "Nothing here repeats a task.",
    ]
    texts = [
        "The first train carried timber and coal south, the paper said, to the harbour.",  # 8 of row 0's words in a row
        "In 1912, the NEW railway line reached the northern valley and the first train carried timber!",  # 15 words
        "A sentence of the task that the corpus never had in any of its rows at all.",
        "good film",  # under 8 words: not checked
    ]
    found = contaminated({"t": (texts, None), "pairs": (["unrelated words only here"] * 2, [texts[1], "x y z"])}, rows)
    assert found == {"t": [1], "pairs": [0]}
