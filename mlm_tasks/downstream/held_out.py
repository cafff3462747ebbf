"""Downstream tasks from the test split's articles (never trained on): which article is this passage from
(held_out_article), or is it as written or its words shuffled (held_out_word_order, the embedded default's: a bag
of words cannot tell, so it shows what pretraining learned). docs/releases.md#how-downstream-scores-are-made

    task = held_out_task(task_cfg, cfg.corpus)
"""

from __future__ import annotations

import random

from mlm_tasks.config import CorpusConfig, DownstreamTask
from mlm_tasks.data.corpus import open_corpus
from mlm_tasks.data.corpus.base import split_of
from mlm_tasks.data.corpus.wiki import WikiDumpCorpus
from mlm_tasks.downstream.examples import Examples, TaskData
from mlm_tasks.errors import ConfigError

MIN_WORDS = 20
WINDOW_WORDS = 40
VALIDATION_FRACTION = 0.4  # of the held-out passages: the part scored
TASK_SEED = 0
ARTICLE_SOURCES = ("embedded_wiki", "wiki_dump")  # the corpus sources made of articles (WikiDumpCorpus)
HELD_OUT_SOURCES = ("held_out_article", "held_out_word_order")
ORDER_LABELS = ["shuffled", "as written"]


def held_out_passages(corpus_cfg: CorpusConfig) -> dict[str, list[str]]:
    """Passages of the corpus's test-split articles, by title, none of which is a row of train or validation."""
    corpus = open_corpus(corpus_cfg)
    assert isinstance(corpus, WikiDumpCorpus)  # score_model skips these tasks for other sources (ARTICLE_SOURCES)
    test: dict[str, list[str]] = {}
    seen: set[str] = set()
    for article in corpus.articles():
        if split_of(article.title, corpus_cfg.validation_fraction, corpus_cfg.test_fraction) == "test":
            test[article.title] = [r for r in article.rows if not r.startswith("=") and len(r.split()) >= MIN_WORDS]
        else:
            seen.update(article.rows)
    return {title: kept for title, rows in test.items() if (kept := [r for r in rows if r not in seen])}


def _pieces(passage: str) -> list[str]:
    """The passage in pieces of about WINDOW_WORDS words (MIN_WORDS at least: a 59-word passage stays whole)."""
    words = passage.split()
    count = max(1, round(len(words) / WINDOW_WORDS))
    size = -(-len(words) // count)
    return [" ".join(words[i : i + size]) for i in range(0, len(words), size)]


def held_out_task(task: DownstreamTask, corpus_cfg: CorpusConfig) -> TaskData:
    passages = held_out_passages(corpus_cfg)
    titles = sorted(passages)
    order = task.source == "held_out_word_order"
    parts: dict[str, Examples] = {"train": Examples([], None, []), "validation": Examples([], None, [])}
    rng = random.Random(TASK_SEED)  # a constant seed: the same examples and order every run
    for article, title in enumerate(titles):
        for row in passages[title]:
            part = parts[split_of(row, VALIDATION_FRACTION, 0.0)]
            for piece in _pieces(row):
                label = int(rng.random() < 0.5) if order else article
                words = piece.split()
                part.texts.append(piece if label or not order else " ".join(rng.sample(words, len(words))))
                part.labels.append(label)
    for part in parts.values():  # interleave the articles
        shuffled = list(range(len(part)))
        rng.shuffle(shuffled)
        part.texts[:], part.labels[:] = [part.texts[i] for i in shuffled], [part.labels[i] for i in shuffled]
    train, validation = parts["train"], parts["validation"]
    if len(titles) < 2 or len(set(validation.labels)) < 2 or set(validation.labels) - set(train.labels):
        raise ConfigError(
            f"downstream task {task.name!r}: the corpus's test split holds {len(titles)} article(s) "
            f"with passages of {MIN_WORDS}+ words, too few for a task of two or more classes: raise "
            "corpus.test_fraction or use more articles."
        )
    return TaskData(task.name, train, validation, ORDER_LABELS if order else titles)
