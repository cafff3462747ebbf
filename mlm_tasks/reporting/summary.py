"""The end-of-run summary a person reads first, built only from the run's saved artifacts.

text = summary_text(run, ctx.data, data)     # the summary step writes it to runs/<run>/summary.txt
"""

from __future__ import annotations

from mlm_tasks import storage
from mlm_tasks.data.shard_set import DataSummary
from mlm_tasks.job.status import read_status
from mlm_tasks.paths import DataPaths, RunPaths


def summary_text(run: RunPaths, paths: DataPaths, data: DataSummary) -> str:
    """The summary's lines for `run`, trained on the shard set at `paths` (`data`: its summary)."""
    train = storage.read_json_if_exists(run.train_summary) or {}
    metrics = storage.read_json_if_exists(run.eval_metrics) or {}
    preds = storage.read_json_if_exists(run.predictions) or []
    corpus = data["corpus"]
    pct = lambda x: f"{100 * x:.1f}%" if x is not None else "n/a"  # noqa: E731
    lines = [
        f"Corpus     {corpus['source']}: {corpus.get('articles') or '?'} articles, {corpus['rows']:,} rows, "
        f"{corpus['characters']:,} characters (fingerprint {data['fingerprint']}"
        f"{', reused' if data.get('cache_hit') else ''})",
        *_removed_line(corpus.get("data_card") or {}),
        (
            f"Tokenizer  the base model's ({base['init_from']}), vocab {data['vocab_size']:,}"
            if (base := data.get("base_model"))
            else f"Tokenizer  Unigram, vocab {data['vocab_size']:,}"
        ),
        "Shards     "
        + ", ".join(
            f"{s}: {data['shards'][s]} files, {data['records'][s]:,} records, {data['tokens'][s]:,} tokens"
            for s in data["records"]
        ),
    ]
    lines += _training_lines(run, train)
    if metrics:
        lines.append(
            f"Evaluation {metrics['split']}: masked-LM loss {metrics['loss']:.3f}, perplexity "
            f"{metrics['perplexity']:.1f}, masked-token accuracy {pct(metrics['accuracy'])} "
            f"({pct(metrics.get('accuracy_at_mask_token'))} where the input shows <mask>) "
            f"(untrained {pct(metrics['untrained_accuracy'])}, loss {metrics['untrained_loss']:.3f}; "
            f"always {metrics['baseline_token']!r} {pct(metrics['baseline_accuracy'])}) over "
            f"{metrics['masked_tokens']:,} masked tokens"
        )
    for p in preds:
        best = ", ".join(f"{x['token_str']} ({x['score']:.2f})" for x in p["predictions"][:3])
        lines.append(f"Fill-mask  {p['probe']} -> {best}")
    lines += [
        f"Artifacts  tokenizer {paths.tokenizer}",
        f"           shards    {paths.shards_dir} (manifest.json, _SUCCESS)",
        f"           model     {run.model}",
        f"           metrics   {run.eval_metrics}",
        f"           report    {run.report}/report.md (loss and learning-rate curves)",
        f"           log/curve {run.train_history}, TensorBoard {run.tensorboard}",
        f"           checkpoints {run.checkpoints}",
    ]
    return "\n".join(lines)


def _removed_line(card: dict) -> list[str]:
    """What the filters and the dedup took out of the rows read (the data card)."""
    if not card.get("rows_read"):
        return []
    removed = card.get("duplicates_removed") or {}
    exact, near = (sum((removed.get(kind) or {}).values()) for kind in ("exact", "near"))
    return [
        f"Removed    of {sum(card['rows_read'].values()):,} rows read: {card.get('dropped_by_filters') or 0:,} by the "
        f"filters, {exact:,} exact and {near:,} near duplicates (the data card: manifest, report, model card)"
    ]


def _training_lines(run: RunPaths, train: dict) -> list[str]:
    """Training, Hardware, Precision and Budget; or why the trainer failed (its status record)."""
    out: list[str] = []
    status = None if train else read_status(run)
    if status and status["state"] == "failed":  # e.g. a diverged run: the step and its last good checkpoint
        out.append(f"Training   failed (exit {status['exit_code']}): {status['error']}")
    if train:
        out.append(
            f"Training   {train['steps']} steps on {train['device']} (global batch {train['global_batch']} = "
            f"{train['global_batch'] // max(train.get('replicas', 1), 1)} x "
            f"{train.get('replicas', 1)} replica(s), "
            f"{train['parameters']:,} parameters), {train['tokens_per_s'] or 0:,.0f} tokens/s, loss "
            f"{train['first_loss']:.3f} -> {train['last_loss']:.3f}, {train['elapsed_s']:.0f}s"
            + (f", resumed from step {train['resumed_from_step']}" if train["resumed_from_step"] else "")
        )
        cost = (
            f"; {train['accelerator_hours']:.2f} TPU hours of training = ${train['cost_usd']:,.2f} "
            f"({train['cost_basis']}; an estimate: the VM bills from create_tpu_vm to delete_tpu_vm)"
            if train.get("cost_usd") is not None
            else ""
        )
        if train.get("mfu_of"):
            out.append(f"Hardware   {train['mfu_of']}{cost}")
        if train.get("precision_reason"):
            out.append(f"Precision  {train['precision_reason']}")
        budget = storage.read_json_if_exists(run.train_budget)
        if budget and budget.get("trained_s") is not None:
            out.append(
                f"Budget     {budget['budget_minutes']:g} min: trained {budget['trained_steps']:,} steps in "
                f"{budget['trained_s']:.0f} s ({budget['overrun_s']:+.1f} s; planned {budget['steps']:,} at the "
                f"start, re-planned {budget['replans']} times); train.steps={budget['trained_steps']} repeats it"
            )
    return out
