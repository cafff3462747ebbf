"""Tiny downstream tasks and a tiny encoder to fine-tune on them, built in seconds.

    rows = sentiment_rows(n, seed)                 # [{"sentence", "label"}]: a word decides the class
    pair_rows(n, seed)                             # [{"sentence1", "sentence2", "label"}]: same topic or not
    glue_folder(root)                              # a local dataset in GLUE's layout (configs sst2, mrpc)
    save_tiny_encoder(model_uri)                   # a RoBERTa of the project's shape (random weights) + tokenizer

The encoder has the layout the train step saves (tf_model.h5, config.json, tokenizer files), so the
downstream step reads it as it reads a trained run's model; its weights are random, which the
step's contract (fields, seeds, baseline, determinism) does not depend on.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from mlm_tasks import storage

GOOD, BAD = ["great", "fine", "lovely", "superb"], ["awful", "dull", "poor", "boring"]
TOPICS = {"sea": ["boat", "wave", "fish", "shore"], "sky": ["cloud", "star", "moon", "wind"]}
FILLER = ["the", "film", "was", "really", "and", "quite", "a", "story", "with", "music"]


def sentiment_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = i % 2
        words = rng.sample(FILLER, 5) + [rng.choice(GOOD if label else BAD)]
        rng.shuffle(words)
        rows.append({"sentence": " ".join(words), "label": label})
    return rows


def pair_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.sample(sorted(TOPICS), 2)
        label = i % 2
        first = " ".join(rng.sample(TOPICS[a], 3))
        second = " ".join(rng.sample(TOPICS[a if label else b], 3))
        rows.append({"sentence1": first, "sentence2": second, "label": label})
    return rows


def glue_folder(root: Path) -> Path:
    """sst2 and mrpc as GLUE ships them on the Hub (nyu-mll/glue): parquet per config and split, the label a
    ClassLabel, the configs declared in the README's YAML."""
    import datasets

    root.mkdir(parents=True, exist_ok=True)
    for config, make, names, columns in (
        ("sst2", sentiment_rows, ["negative", "positive"], ["sentence"]),
        ("mrpc", pair_rows, ["not_equivalent", "equivalent"], ["sentence1", "sentence2"]),
    ):
        features = datasets.Features(
            {**{c: datasets.Value("string") for c in columns}, "label": datasets.ClassLabel(names=names)}
        )
        for split, (n, seed) in {"train": (24, 1), "validation": (12, 2)}.items():
            (root / config).mkdir(exist_ok=True)
            datasets.Dataset.from_list(make(n, seed), features=features).to_parquet(
                str(root / config / f"{split}-00000-of-00001.parquet")
            )
    (root / "README.md").write_text(
        "---\nconfigs:\n"
        + "".join(
            f"- config_name: {c}\n  data_files:\n  - split: train\n    path: {c}/train-*\n"
            f"  - split: validation\n    path: {c}/validation-*\n"
            for c in ("sst2", "mrpc")
        )
        + "---\n# glue\n"
    )
    return root


def save_tiny_encoder(model_uri: str) -> None:
    from transformers import RobertaConfig

    from mlm_tasks.config import TokenizerConfig
    from mlm_tasks.data.tokenizer import to_pretrained, train_subwords
    from mlm_tasks.model.roberta import build_model

    text = [r["sentence"] for r in sentiment_rows(40, 0)] + [
        f"{r['sentence1']} {r['sentence2']}" for r in pair_rows(40, 0)
    ]
    tokenizer = to_pretrained(train_subwords(text * 5, TokenizerConfig(vocab_size=50)), 64)
    config = RobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=66,
        type_vocab_size=1,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with tempfile.TemporaryDirectory() as tmp:
        build_model(config).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        storage.upload_dir(tmp, model_uri)
