"""The model card (README.md with YAML front matter) published with the model, built only from the run's own
artifacts; a missing piece is named in the card, not left out.

    uri = write_model_card(cfg, run)          # reads the artifacts, writes runs/<run>/model/README.md
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.job.restarts import read_restarts
from mlm_tasks.paths import SPLITS, RunPaths, join
from mlm_tasks.reporting.tables import downstream_table, fill_mask_lines, metrics_table, section

WIKIPEDIA_CREDIT = "Text from English Wikipedia, CC BY-SA 4.0"
ARCHITECTURES = {"roberta": "RoBERTa", "modernbert": "ModernBERT"}  # model.architecture as a card names it


def read_run_artifacts(run: RunPaths, data_info: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every artifact the card and the report draw on; None for the ones not written (yet). `data_info`: the
    shard set's summary, else the run's data.json."""
    return {
        "metrics": storage.read_json_if_exists(run.eval_metrics),
        "summary": storage.read_json_if_exists(run.train_summary),
        "predictions": storage.read_json_if_exists(run.predictions),
        "data_info": data_info if data_info is not None else storage.read_json_if_exists(run.data_ref),
        "downstream": storage.read_json_if_exists(run.downstream),
        "restarts": read_restarts(run),  # node losses handled inside a try
    }


def corpus_credit(cfg: PipelineConfig, data_info: Mapping[str, Any] | None) -> tuple[str, list[str]]:
    """(attribution line, Hub dataset ids) for the configured corpus."""
    recorded = ((data_info or {}).get("corpus") or {}).get("credit") or (data_info or {}).get("credit")
    source = cfg.corpus.source
    if source in ("embedded_wiki", "wiki_dump"):
        return recorded or WIKIPEDIA_CREDIT, ["wikimedia/wikipedia"]
    if source == "hf_dataset":
        name = f"{cfg.corpus.hf_path}" + (f" ({cfg.corpus.hf_name})" if cfg.corpus.hf_name else "")
        default = f"{WIKIPEDIA_CREDIT} (via {name})" if "wiki" in cfg.corpus.hf_path.lower() else f"Text from {name}"
        return recorded or default, [cfg.corpus.hf_path]
    return recorded or "Text from local files (see the data manifest for their origin)", []


def _per_split(counts: Mapping[str, Any] | None) -> str:
    """ "train 1,234, validation 56, test 78": the splits in pipeline order (stored JSON sorts its keys)."""
    counts = counts or {}
    order = [s for s in SPLITS if s in counts] + sorted(set(counts) - set(SPLITS))
    return ", ".join(f"{s} {counts[s]:,}" for s in order if isinstance(counts[s], int))


def data_card_lines(data_info: Mapping[str, Any] | None) -> list[str]:
    """What went into the shards and what was removed on the way (the manifest's data card, a mixture's sources)."""
    corpus = (data_info or {}).get("corpus") or {}
    card = corpus.get("data_card") or {}
    lines = []
    for name, source in (corpus.get("sources") or {}).items():
        weight = source.get("weight")
        lines.append(
            f"- Source `{name}`"
            + (f", weight {weight:g}" if isinstance(weight, (int, float)) else "")
            + f": tokens {_per_split(source.get('tokens'))}"
        )
    if card.get("rows_read"):
        lines.append(f"- Rows read: {_per_split(card['rows_read'])}")
    filters = {k: n for k, n in (card.get("filters") or {}).items() if k not in ("seen", "kept") and n}
    if card.get("dropped_by_filters") is not None:
        why = ", ".join(f"{rule} {n:,}" for rule, n in sorted(filters.items(), key=lambda kv: -kv[1]))
        lines.append(f"- Dropped by the row filters: {card['dropped_by_filters']:,}" + (f" ({why})" if why else ""))
    removed = card.get("duplicates_removed")
    if removed:
        dedup = card.get("dedup") or {}
        near = (
            f"near duplicates (Jaccard >= {dedup.get('near_threshold')}) {sum(removed['near'].values()):,}"
            if dedup.get("near")
            else "near dedup off"
        )
        exact = f"exact {sum(removed['exact'].values()):,}" if dedup.get("exact", True) else "exact dedup off"
        lines.append(f"- Duplicates removed: {exact} ({_per_split(removed['exact'])}); {near}")
    tok, sample = corpus.get("tokenizer") or {}, card.get("tokenizer_sample")
    kind = f"{tok['model'].capitalize()} tokenizer" if tok.get("model") else "Tokenizer"
    if tok.get("from_pretrained"):
        lines.append(f"- {kind} reused from {base_model_line({**tok, 'init_from': tok['from_pretrained']})}")
    elif sample:
        lines.append(
            f"- {kind} trained on a seeded sample of {sample['rows']:,} deduplicated train rows "
            f"({sample['bytes'] / 1e6:.1f} MB; budget {sample['budget_bytes'] / 1e6:.0f} MB)"
        )
    if tok.get("sha256"):
        lines.append(f"- Tokenizer file: sha256 `{tok['sha256'][:16]}…`, {tok['spare_tokens']} spare tokens")
    return lines


def base_model_line(base: Mapping[str, Any]) -> str:
    """`model.init_from` as the card and the report name it: the base and its exact revision."""
    revision = str(base.get("revision", "?"))
    what = "files sha256" if revision.startswith("sha256:") else "revision"
    return f"`{base.get('init_from')}` ({what} `{revision.removeprefix('sha256:')}`)"


def config_lines(cfg: PipelineConfig, data_info: Mapping[str, Any] | None = None) -> list[str]:
    t = cfg.train
    # Unigram training may stop short of the requested size: prefer the size the data step recorded.
    vocab = (data_info or {}).get("vocab_size") or cfg.tokenizer.vocab_size
    base, name = (data_info or {}).get("base_model"), ARCHITECTURES[cfg.model.architecture]
    keys = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")
    if base:  # the shape and tokenizer are the base model's (model.init_from)
        layers, hidden, heads, ffn = (base.get(key) for key in keys)
        model, tokenizer = f"{name}, the base model's", "the base model's"
    else:
        layers, hidden, heads, ffn = (getattr(cfg.model.shape(), key) for key in keys)
        model, tokenizer = f"{name} (preset `{cfg.model.preset}`)", "Unigram"
    return [
        f"- Architecture: {model}: {layers} layers, hidden {hidden}, {heads} heads, FFN {ffn}",
        f"- Tokenizer: {tokenizer}, vocabulary {vocab}; sequence length {cfg.shards.max_length}",
        f"- Optimizer: AdamW, peak learning rate {t.learning_rate:g}, warmup {t.warmup_fraction:.0%}, "
        f"weight decay {t.weight_decay:g}; batch {t.batch_size} per replica",
        f"- Masking: {t.mlm_probability:.0%} of tokens selected for prediction"
        + (", as whole words" if t.whole_word_mask else ""),
        f"- Compute: `{cfg.compute}`" + (f" ({cfg.tpu.accelerator_type})" if cfg.compute == "tpu_vm" else ""),
    ]


def restart_lines(restarts: list[Mapping[str, Any]] | None) -> list[str]:
    """The node losses handled inside the train task's tries: how many per try, then each with its cause."""
    lines: list[str] = []
    restarts = restarts or []
    for try_number in sorted({r["try_number"] for r in restarts}):
        these = [r for r in restarts if r["try_number"] == try_number]
        lost = sum(r.get("steps_lost") or 0 for r in these)
        lines.append(f"- Restarts in try {try_number}: {len(these)} (train.max_restarts), {lost} steps trained again")
        lines += [
            f"  - {r['at_utc']}: {r['cause']} at step {r['step']}; resumed from step {r.get('resumed_from')}"
            for r in these
        ]
    return lines


def training_lines(summary: Mapping[str, Any] | None, restarts: list[Mapping[str, Any]] | None = None) -> list[str]:
    if not summary:
        return ["_No training summary was recorded for this run._", *restart_lines(restarts)]
    lines = [f"- Steps: {summary.get('steps')}"]
    if summary.get("resumed_from_step"):
        lines.append(f"- Resumed from step {summary['resumed_from_step']} (a retry continued from a checkpoint)")
    if summary.get("first_loss") is not None and summary.get("last_loss") is not None:
        lines.append(f"- Training loss: {summary['first_loss']:.4f} → {summary['last_loss']:.4f}")
    if summary.get("best_val_loss") is not None:
        best, last = (" (this model)", "") if summary.get("kept") == "best" else ("", " (this model)")
        lines.append(
            f"- Validation loss (fixed 15% masks): best {summary['best_val_loss']:.4f} at step "
            f"{summary.get('best_step')}{best}; last {summary.get('val_loss'):.4f} at step "
            f"{summary.get('steps')}{last}"
        )
    if summary.get("tokens_per_s") is not None:
        lines.append(
            f"- Throughput: {summary['tokens_per_s']:,.0f} tokens/s"
            + (f"; {summary['mfu_of']}" if summary.get("mfu_of") else "")
        )
    if summary.get("cost_usd") is not None:
        lines.append(
            f"- Accelerator cost: ${summary['cost_usd']:,.2f} for {summary['accelerator_hours']:.2f} h of "
            f"training ({summary.get('cost_basis')})"
        )
    lines += restart_lines(restarts)
    if summary.get("elapsed_s") is not None:
        lines.append(f"- Wall time: {summary['elapsed_s'] / 60:.1f} min")
    return lines


# Each usage block's first line names its framework: test_card.py runs each block in that framework's environment.
USAGE_MARKERS = {"pytorch": "# PyTorch, transformers 5.x", "tensorflow": "# TensorFlow, transformers 4.57"}


def _code(framework: str, *pipeline: str) -> list[str]:
    probe = 'print(fill("The capital of France is <mask>."))'
    return ["```python", USAGE_MARKERS[framework], "from transformers import pipeline", "", *pipeline, probe, "```", ""]


def usage_lines(repo: str, architecture: str) -> list[str]:
    pytorch = _code("pytorch", f'fill = pipeline("fill-mask", model="{repo}")')
    if architecture == "modernbert":
        return [
            "## How to use",
            "`model.safetensors` holds `ModernBertForMaskedLM`'s weights, for PyTorch and the current Transformers",
            "(`pip install torch transformers`; Transformers has no TensorFlow ModernBERT):",
            "",
            *pytorch,
        ]
    return [
        "## How to use",
        "The repository holds the same weights twice: `model.safetensors` (PyTorch) and `tf_model.h5`",
        "(TensorFlow). With PyTorch and the current Transformers (`pip install torch transformers`):",
        "",
        *pytorch,
        "With TensorFlow: Transformers 4.57 is the last release with TensorFlow models",
        '(`pip install "transformers==4.57.*" tensorflow tf-keras`). `dtype=None` keeps the pipeline',
        "from looking up PyTorch's default dtype, which fails where torch is not installed;",
        "`use_safetensors=False` makes it read `tf_model.h5` (4.57 would pick `model.safetensors` and fail",
        "to read it with current safetensors releases):",
        "",
        *_code(
            "tensorflow",
            f'fill = pipeline("fill-mask", model="{repo}", framework="tf", dtype=None,',
            '                model_kwargs={"use_safetensors": False})',
        ),
    ]


def render_model_card(cfg: PipelineConfig, run_id: str, art: Mapping[str, Any]) -> str:
    """The card of run `run_id` from its artifacts (read_run_artifacts' keys; a missing key: not recorded)."""
    metrics, data_info = art.get("metrics"), art.get("data_info")
    credit, datasets = corpus_credit(cfg, data_info)
    # One library (transformers): tf_model.h5 for TensorFlow (RoBERTa only), model.safetensors for PyTorch.
    architecture, name = cfg.model.architecture, ARCHITECTURES[cfg.model.architecture]
    frameworks = ["pytorch"] if architecture == "modernbert" else ["tf", "pytorch"]
    meta = {
        "language": "en",
        "license": cfg.publish.license,
        "library_name": "transformers",
        "pipeline_tag": "fill-mask",
        "tags": [architecture, "fill-mask", "masked-lm", *frameworks, "safetensors", "pretraining"],
    }
    if datasets:
        meta["datasets"] = datasets
    base = (data_info or {}).get("base_model")
    if base and base.get("kind") == "hub":
        meta["base_model"] = base["init_from"]  # the Hub's model tree links the base (Hub ids only)
    fingerprint = (data_info or {}).get("fingerprint") or (metrics or {}).get("data_fingerprint")
    fingerprint = fingerprint or "unknown (no data reference recorded)"
    repo = cfg.publish.repo_id or "<repo_id>"
    body = [
        f"# {repo.split('/')[-1]}",
        "",
        (
            f"A {name}-style masked language model, pretraining continued from {base_model_line(base)} with "
            f"TensorFlow (run `{run_id}`)."
            if base
            else f"A small {name}-style masked language model pretrained from scratch with TensorFlow (run `{run_id}`)."
        ),
        "",
        "## Data",
        *(
            [f"- Base model: {base_model_line(base)}; its weights and tokenizer were the starting point"]
            if base
            else []
        ),
        f"- Source: `{cfg.corpus.source}`"
        + (f" (`{cfg.corpus.hf_path}`)" if cfg.corpus.source == "hf_dataset" else ""),
        f"- Data fingerprint: `{fingerprint}` (identifies the exact corpus and tokenization)",
        *data_card_lines(data_info),
        f"- Credit: {credit}",
        "",
        *section("## Configuration", config_lines(cfg, data_info)),
        *section("## Training", training_lines(art.get("summary"), art.get("restarts"))),
        *section("## Evaluation", metrics_table(metrics)),
        *section("## Downstream evaluation", downstream_table(art.get("downstream"))),
        *section("## Fill-mask examples", fill_mask_lines(art.get("predictions"))),
        *usage_lines(repo, architecture),
        "",
        "## Intended use and limitations",
        "- A pretraining demonstration and a starting point for fine-tuning on English text; not a product.",
        "- Small model and corpus: predictions are often wrong, and it knows little about the world.",
        "- Learned from Wikipedia-style text, it reflects that text's topics, gaps and biases.",
        "- Do not use its completions as facts or for decisions about people.",
    ]
    front = yaml.safe_dump(meta, sort_keys=False).strip()
    return f"---\n{front}\n---\n\n" + "\n".join(body) + "\n"


def write_model_card(cfg: PipelineConfig, run: RunPaths, data_info: Mapping[str, Any] | None = None) -> str:
    """Write README.md next to the saved model; returns its URI."""
    uri = join(run.model, "README.md")
    storage.write_text(uri, render_model_card(cfg, run.run_id, read_run_artifacts(run, data_info)))
    return uri
