"""Import boundaries: mlm_tasks runs without Airflow; parsing the DAGs loads no TensorFlow, quickly; mlm_tasks has
no import cycles, and its steps import libraries, never other steps (house style rule 19)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, **env) -> str:
    import os

    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300, env={**os.environ, **env}
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_importing_mlm_tasks_does_not_import_airflow_or_tensorflow():
    mods = [
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT / "mlm_tasks").rglob("*.py")
        # model/modernbert.py is the Keras ModernBERT itself: its layers subclass tf_keras's, so defining them needs
        # TensorFlow. Every other module reaches it inside the function that builds or loads a model, which
        # importing all the others here checks.
        if p.stem != "__main__" and p.relative_to(ROOT).as_posix() != "mlm_tasks/model/modernbert.py"
    ]
    assert {"mlm_tasks.steps.train", "mlm_tasks.data.corpus.wiki", "mlm_tasks.tpu.vm.check_image"} <= set(mods)
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in mods)
        + "print(sorted({m.split('.')[0] for m in sys.modules} & {'airflow', 'tensorflow', 'transformers'}))"
    )
    assert _run(code) == "[]"


def test_parsing_the_dag_folder_imports_no_tensorflow_and_is_fast(tmp_path):
    code = f"""
import sys, time
import airflow.sdk
from airflow.dag_processing.dagbag import DagBag
t = time.perf_counter()
bag = DagBag(dag_folder={str(ROOT / "dags")!r})
took = time.perf_counter() - t
assert not bag.import_errors, bag.import_errors
print(sorted(bag.dag_ids), 'tensorflow' in sys.modules, 'transformers' in sys.modules, round(took, 2))
"""
    out = _run(
        code,
        AIRFLOW_HOME=str(tmp_path),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"),
        PYTHONPATH=f"{ROOT}:{ROOT / 'plugins'}",
    ).splitlines()[-1]
    dag_ids, tf_loaded, hf_loaded, took = eval(out.split("] ")[0] + "]"), *out.split("] ")[1].split()
    assert {"mlm_pretrain", "mlm_tpu_janitor"} <= set(dag_ids)
    assert tf_loaded == "False" and hf_loaded == "False"
    print(f"DagBag parse took {took}s")  # a figure for the log; timings are benchmarked in bench/, not asserted


def _import_graph(typing_imports: bool = True) -> dict[str, set[str]]:
    """mlm_tasks' modules and the mlm_tasks modules each imports (at the top or inside a function: a lazy
    import is an edge too), by the same AST walk as the before-stop check (house style rule 19).
    `typing_imports=False` leaves out what an `if TYPE_CHECKING:` block imports (never at run time)."""
    import ast

    mods = {}
    for f in (ROOT / "mlm_tasks").rglob("*.py"):
        parts = f.relative_to(ROOT).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        tree = ast.parse(f.read_text())
        typing_only = set()
        if not typing_imports:
            for node in ast.walk(tree):
                if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
                    typing_only |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for target in names:
                while target and target not in mods:  # `from mlm_tasks import storage` names a module
                    target = target.rpartition(".")[0]
                if target and target != m and not m.startswith(target + "."):  # a package's own parents
                    edges[m].add(target)
    return edges


def _cycles(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every pair of nodes that reach each other."""

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), set()) - seen:
                if nxt == goal:
                    return True
                seen.add(nxt)
                todo.append(nxt)
        return False

    return sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if reaches(b, a)})


def test_mlm_tasks_has_no_import_cycles():
    edges = _import_graph()
    assert "mlm_tasks.data.corpus" in edges and _cycles(edges) == []


def test_steps_import_libraries_not_other_steps():
    edges = _import_graph()
    step_imports_step = sorted(
        (a, b) for a in edges for b in edges[a] if a.startswith("mlm_tasks.steps.") and b.startswith("mlm_tasks.steps.")
    )
    assert "mlm_tasks.steps.train" in edges and step_imports_step == []


# The layers a run's code crosses, top to bottom. A command is a module a person runs.
COMMANDS = {"mlm_tasks.__main__", "mlm_tasks.cli"}
PACKAGES = ("config", "steps", "data", "model", "training", "job", "reporting", "downstream", "hub", "tpu")


def _layer(module: str) -> str:
    """The node of the package graph: a command, a package of mlm_tasks, or a top-level module."""
    if module in COMMANDS or module.startswith("mlm_tasks.commands."):
        return "commands"
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1] in PACKAGES else module


def test_packages_form_layers_without_climbing_back():
    """Folded to packages, the run-time imports have no cycle: a walk of the config from the CLI to the
    shard writer (commands -> steps -> data -> config -> tpu's tables -> errors) visits each package once."""
    edges = _import_graph(typing_imports=False)
    layers: dict[str, set[str]] = {}
    for a, targets in edges.items():
        for b in targets:
            if _layer(a) != _layer(b):
                layers.setdefault(_layer(a), set()).add(_layer(b))

    assert _cycles(layers) == []
    assert {"mlm_tasks.steps", "mlm_tasks.config"} <= layers["commands"]
    assert "mlm_tasks.data" in layers["mlm_tasks.steps"] and "mlm_tasks.tpu" in layers["mlm_tasks.config"]


def test_no_function_of_the_library_or_the_glue_is_longer_than_a_screen():
    """80 lines at most (issue 30): a function that does more is a plan of parts, each named."""
    import ast

    long = []
    for top in ("mlm_tasks", "plugins", "dags"):
        for f in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > 80:
                        long.append(f"{f.relative_to(ROOT)}::{node.name} ({lines} lines)")
    assert not long, long
