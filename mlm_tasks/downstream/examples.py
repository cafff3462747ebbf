"""A downstream task's examples, as every source gives them and finetune.py reads them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Examples:
    texts: list[str]
    pairs: list[str] | None  # the second text of each example (pair tasks)
    labels: list[Any]  # class ids (int) or, for a regression task, values (float)

    def __len__(self) -> int:
        return len(self.labels)


@dataclass
class TaskData:
    name: str
    train: Examples
    validation: Examples
    label_names: list[str]  # empty for a regression task
    regression: bool = False  # labels are values (a pearson or spearman task), one output

    @property
    def num_labels(self) -> int:
        return 1 if self.regression else len(self.label_names)

    @property
    def is_pair(self) -> bool:
        return self.train.pairs is not None


# Every run draws the same examples from the same file: scores of two runs compare only on the same examples.
SAMPLE_SEED = 0


def sample(examples: Examples, limit: int | None, stratify: bool) -> Examples:
    """At most `limit` examples, in their order, drawn with a fixed seed (a file sorted by label would give one
    class in its first rows); `stratify` keeps each label's share (largest remainders), every label once at least."""
    import numpy as np

    rng = np.random.default_rng(SAMPLE_SEED)
    n = len(examples)
    if limit is None or limit >= n:
        return examples
    if not stratify:
        chosen = rng.permutation(n)[:limit]
    else:
        labels = np.asarray(examples.labels)
        classes, counts = np.unique(labels, return_counts=True)
        share = counts * limit / n
        take = np.maximum(np.floor(share).astype(int), 1)
        if limit < len(classes):  # fewer examples than classes: the largest classes, one each (load_task says so)
            take = np.zeros_like(take)
            take[np.argsort(-counts, kind="stable")[:limit]] = 1
        for i in np.argsort(-(share - np.floor(share))):  # the largest remainders fill what is left
            if take.sum() >= limit:
                break
            take[i] += take[i] < counts[i]
        picked = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in zip(classes, take, strict=True)]
        chosen = np.concatenate(picked)
    pick = sorted(int(i) for i in chosen)
    return Examples(
        [examples.texts[i] for i in pick],
        [examples.pairs[i] for i in pick] if examples.pairs is not None else None,
        [examples.labels[i] for i in pick],
    )
