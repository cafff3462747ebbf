"""The model card's code runs as written: every code block of the card generated for a trained model is
run in the environment it names, TensorFlow (this env: transformers 4.57, no torch) or PyTorch
(.venv-pt: torch + transformers 5.x, no TensorFlow), as a user's fresh shell would (offline, without
this project's TF_USE_LEGACY_KERAS). The one substitution: the Hub repo id, quoted, becomes the local
model folder (the Hub resolves the repo id to exactly these files)."""

from __future__ import annotations

import ast
import json
import re
import sys

import yaml

from mlm_tasks import storage
from mlm_tasks.config import build_config
from mlm_tasks.reporting.card import USAGE_MARKERS, render_model_card, write_model_card

REPO = "tester/roberta-wiki"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


def code_blocks(card: str) -> list[tuple[str, str]]:
    """(framework, code) for every fenced block; a block must name its framework on its first line."""
    blocks = []
    for lang, code in BLOCK.findall(card):
        assert lang == "python", f"unexpected {lang!r} block in the card: {code[:200]}"
        framework = [f for f, marker in USAGE_MARKERS.items() if code.startswith(marker + "\n")]
        assert len(framework) == 1, f"code block without a framework marker: {code[:200]}"
        blocks.append((framework[0], code))
    return blocks


def test_card_declares_both_frameworks_and_marks_each_block():
    cfg = build_config({"publish": {"repo_id": REPO}})
    card = render_model_card(cfg, "run-1", {})
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "fill-mask"
    assert {"tf", "pytorch", "safetensors"} <= set(meta["tags"])
    blocks = code_blocks(card)
    assert sorted(f for f, _ in blocks) == ["pytorch", "tensorflow"]
    for _, code in blocks:
        assert f'"{REPO}"' in code and "<mask>" in code
    tf_code = dict(blocks)["tensorflow"]
    # What a TensorFlow-only install with transformers 4.57 needs (see the card's text for why).
    assert 'framework="tf"' in tf_code and "dtype=None" in tf_code and '"use_safetensors": False' in tf_code


def test_every_code_block_of_the_card_runs_as_written(tiny_model, pt_python):
    from peers.model_clients import run_in

    cfg, run = tiny_model
    cfg = cfg.model_copy(update={"publish": cfg.publish.model_copy(update={"repo_id": REPO})})
    card = storage.read_text(write_model_card(cfg, run))  # the card publish uploads, for this model
    folder = storage.local_path(run.model)
    pythons = {"tensorflow": sys.executable, "pytorch": pt_python}
    # The TensorFlow env is TF-only, as the snippet promises: no torch to fall back on.
    assert run_in(None, "import importlib.util as u; print(u.find_spec('torch') is None)").stdout.strip() == "True"

    answers = {}
    for framework, code in code_blocks(card):
        assert code.count(f'"{REPO}"') == 1, code
        local = code.replace(f'"{REPO}"', json.dumps(folder))
        done = run_in(pythons[framework], local, cwd=str(folder.rsplit("/", 1)[0]))
        assert done.returncode == 0, f"{framework} block failed:\n{code}\n{done.stderr[-4000:]}"
        printed = ast.literal_eval(done.stdout.strip().splitlines()[-1])
        assert len(printed) == 5 and all("<mask>" not in p["sequence"] for p in printed), printed
        answers[framework] = printed
    assert set(answers) == {"pytorch", "tensorflow"}
    # Both clients give the same answers from the same published folder.
    assert [p["token_str"] for p in answers["pytorch"]] == [p["token_str"] for p in answers["tensorflow"]]
    for pt, tf in zip(answers["pytorch"], answers["tensorflow"], strict=False):
        assert abs(pt["score"] - tf["score"]) < 1e-4, (pt, tf)


def test_a_modernbert_cards_code_runs_with_transformers_5(tiny_modernbert, pt_python):
    from peers.model_clients import run_in

    cfg, run, _ = tiny_modernbert
    cfg = cfg.model_copy(update={"publish": cfg.publish.model_copy(update={"repo_id": REPO})})
    card = storage.read_text(write_model_card(cfg, run))
    meta = yaml.safe_load(card.split("---\n")[1])
    assert "modernbert" in meta["tags"] and "tf" not in meta["tags"] and "ModernBERT (preset `tiny`)" in card
    ((framework, code),) = code_blocks(card)  # transformers 5 only: it has no TensorFlow ModernBERT
    folder = storage.local_path(run.model)
    done = run_in(pt_python, code.replace(f'"{REPO}"', json.dumps(folder)), cwd=str(folder.rsplit("/", 1)[0]))
    assert framework == "pytorch" and done.returncode == 0, done.stderr[-4000:]
    printed = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert len(printed) == 5 and all("<mask>" not in p["sequence"] for p in printed), printed
