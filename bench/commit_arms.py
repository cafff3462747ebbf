"""Benchmark 9's side-by-side of defaults: this checkout's `configs/default.yaml` beside earlier commits' own
code and own default, each trained as its `make run` trains it, alternating (ABBA), in fresh processes.

    .venv/bin/python bench/bench_quality.py --commits 7ab6da0^,18e2cc0 [--rounds 2]

Every arm goes through its own CLI (`python -m mlm_tasks build_shard_set | train | evaluate | fill_mask`,
which every commit since the first has), so an old commit needs no bench code of its own: a git worktree of it
(under the bench root) is put first on PYTHONPATH, with this checkout's virtual environment. The shard set is
built once per arm, untimed; each round times `train` alone (its budget's measurement included, as in
`make run`) and scores it with the commit's own `evaluate`: the masked-LM loss of the whole validation split at
15% masking (fixed masks since b9eae1a, random ones before: the same expectation). Each commit trains its own
tokenizer on its own split of the same Wikipedia sample (the filters and dedup of issue 33 drop ~12% of the
rows since), so the losses are per token of slightly different vocabularies: close, not identical.

The fill-mask column counts the probes (the same five in every commit) whose top-1 is a content word: a word or
number, not punctuation, markup or one of FUNCTION_WORDS.

Round r trains with `train.seed` 42 + r - 1 (42 is every default's own): a default's step count is fixed, so on one
shard set a rerun with the same seed trains the same weights, and only other seeds show the spread of a figure
(the fill-mask tops above all, which a model at loss ~5.3 wins by a few hundredths of probability). An arm
`REV:CANDIDATE` is REV with bench_quality's CANDIDATES overrides (`HEAD:long`): it shares REV's shard set, so
the two differ by the recipe alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import common

# English function words a masked LM reaches first from frequencies alone; `=` (WikiText's heading markup) and
# punctuation have no letter or digit.
_FUNCTION_WORDS = (
    "a an the and or but nor of in on at to for from by with as into onto than then that this these those "
    "it its he she they we you i his her their our your is was are were be been being has have had do does did "
    "not no so if which who whom whose what when where while there here also one two s"
)
FUNCTION_WORDS = frozenset(_FUNCTION_WORDS.split())


def is_content_word(token: str) -> bool:
    """Not punctuation, markup or a function word: "Washington", "1783" (a year where a date goes), "city"."""
    word = token.strip().lstrip("\u2581").strip()
    return any(c.isalnum() for c in word) and word.lower() not in FUNCTION_WORDS


def checkout(commit: str) -> str:
    """A worktree of `commit` under the bench root (made once), or this checkout for HEAD."""
    if commit == "HEAD":
        return common.REPO
    sha = _git("rev-parse", "--short", commit)
    path = os.path.join(common.BENCH_ROOT, "checkouts", sha)
    if not os.path.isdir(path):
        _git("worktree", "add", "--detach", "--force", path, sha)
    print(f"{commit}: a worktree of {sha} at {path}", file=sys.stderr)
    return path


def cli(repo: str, config: str, root: str, verb: str, *args: str) -> tuple[object, float]:
    """`python -m mlm_tasks VERB` of checkout `repo` on its own copy of `config` (a path in the repository), its
    outputs under `root`: (its JSON result, wall s)."""
    env = {**os.environ, "PYTHONPATH": repo, "TF_USE_LEGACY_KERAS": "1"}
    cmd = [sys.executable, "-m", "mlm_tasks", verb, "--config", config, "--set", f"output_root={root}"]
    began = time.monotonic()
    done = subprocess.run([*cmd, *args], cwd=repo, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} in {repo} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    wall, out = time.monotonic() - began, done.stdout.strip()
    try:  # the CLI's stdout is its result alone: indented JSON in older commits, one line since
        return json.loads(out), wall
    except json.JSONDecodeError:  # something printed before it: the result is the last line
        return json.loads(out.splitlines()[-1]), wall


def run_arm(repo: str, config: str, root: str, run_id: str, sets: list[str]) -> dict:
    """Train, evaluate and fill-mask one run; `sets`: KEY=VALUE overrides of every step's config."""
    flags = [f for kv in sets for f in ("--set", kv)]
    summary, train_s = cli(repo, config, root, "train", "--run-id", run_id, *flags)
    evaluation, _ = cli(repo, config, root, "evaluate", "--run-id", run_id, *flags)
    probes, _ = cli(repo, config, root, "fill_mask", "--run-id", run_id, *flags)
    tops = [p["predictions"][0]["token_str"].strip() for p in probes]
    return {
        "steps": summary["steps"],
        "loop_s": summary["elapsed_s"],
        "train_s": train_s,
        "precision": summary.get("precision"),
        "val_loss": evaluation["loss"],
        "accuracy": evaluation["accuracy"],
        "content": sum(is_content_word(t) for t in tops),
        "tops": tops,
    }


def _rev(label: str) -> str:
    """The commit of arm `label` (`REV` or `REV:CANDIDATE`)."""
    return label.partition(":")[0]


def overrides(label: str) -> list[str]:
    """The --set flags of arm `label` (`REV` or `REV:CANDIDATE`, CANDIDATE from bench_quality's CANDIDATES)."""
    from bench_quality import recipe

    _, _, candidate = label.partition(":")
    if not candidate:
        return []
    return [f"{key}={'null' if value is None else value}" for key, value in recipe(candidate).items()]


def compare(
    commits: list[str], rounds: int, config: str = "configs/default.yaml", first_seed: int = 42, head: bool = True
) -> None:
    labels = list(dict.fromkeys(["HEAD", *commits] if head else commits))
    for label in labels:
        overrides(label)  # an unknown candidate fails now, not after an hour
    arms = {label: checkout(_rev(label)) for label in labels}
    roots = {label: os.path.join(common.BENCH_ROOT, "defaults", _rev(label).replace("^", "-parent")) for label in arms}
    for root, label in {roots[label]: label for label in arms}.items():  # untimed: each commit's shard set, once
        cli(arms[label], config, root, "build_shard_set")
    runs: dict[str, list[dict]] = {label: [] for label in arms}
    order = list(arms)
    for rnd in range(rounds):
        for label in order if rnd % 2 == 0 else order[::-1]:
            sets = [f"train.seed={first_seed + rnd}", *overrides(label)]
            res = run_arm(arms[label], config, roots[label], f"quality-r{rnd + 1}-{int(time.time())}", sets)
            runs[label].append(res)
            print(
                f"round {rnd + 1} {label} (seed {first_seed + rnd}): {res['steps']} steps in {res['loop_s']:.0f} s, "
                f"val loss {res['val_loss']:.4f}, fill-mask tops {res['tops']}",
                file=sys.stderr,
            )
    print(
        f"\n{common.machine()}\neach commit's {config} with its own code; {rounds} alternating round(s), round r "
        f"with train.seed {first_seed} + r - 1\n"
    )
    rows = []
    for label, res in runs.items():
        losses = [r["val_loss"] for r in res]
        rows.append(
            [
                f"{label} ({_git('rev-parse', '--short', _rev(label))})",
                " ".join(str(r["steps"]) for r in res),
                res[0]["precision"],
                f"{common.median(losses):.3f}",
                f"{(max(losses) - min(losses)) / 2:.3f}",
                " ".join(f"{v:.3f}" for v in losses),
                " ".join(f"{100 * r['accuracy']:.1f}" for r in res),
                " ".join(f"{r['content']}/5" for r in res),
                " ".join(f"{r['loop_s']:.0f}" for r in res),
                " ".join(f"{r['train_s']:.0f}" for r in res),
            ]
        )
    print(
        common.table(
            [
                "default",
                "steps",
                "precision",
                "val loss",
                "± half-range",
                "per round",
                "acc %",
                "content tops",
                "loop s",
                "train s",
            ],
            rows,
        )
    )
    for label, res in runs.items():
        for r in res:
            print(f"{label}: {', '.join(r['tops'])}")


def _git(*args: str) -> str:
    found = subprocess.run(["git", "-C", common.REPO, *args], capture_output=True, text=True, check=True)
    return found.stdout.strip()
