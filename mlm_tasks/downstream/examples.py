"""A downstream task's examples, as every source gives them (tasks.py, held_out.py) and finetune.py reads them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Examples:
    texts: list[str]
    pairs: list[str] | None  # the second text of each example (pair tasks)
    labels: list[int]

    def __len__(self) -> int:
        return len(self.labels)


@dataclass
class TaskData:
    name: str
    train: Examples
    validation: Examples
    label_names: list[str]

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    @property
    def is_pair(self) -> bool:
        return self.train.pairs is not None
