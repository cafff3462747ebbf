"""No page, docstring or comment points at a file or module that does not exist: a reader who follows a
reference (`plugins/mlm_airflow/connections.py`, `mlm_tasks.commands.smoke`, `bench/bench_shards.py`) finds it.
Paths are checked against the checkout; dotted names against the modules of mlm_tasks and the names they define."""

import ast
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ("mlm_tasks", "plugins", "dags", "tests", "bench", "scripts", "configs", "deploy", "docs")
PATH_REF = re.compile(r"(?<![\w./<>-])((?:" + "|".join(TOP) + r")/[\w./-]*\w\.(?:py|md|ya?ml|sh|txt|in|json|toml))\b")
DOTTED_REF = re.compile(r"(?<![\w./-])(mlm_tasks(?:\.\w+)+)")
FILE_NAME = re.compile(r"\.(?:tar|gz|zip|py|json|txt)$")  # mlm_tasks.tar.gz is a file, not a module
SKIP_DIRS = {".venv", ".venv-pt", ".venv-tpuvm", ".git", ".site", "node_modules", "__pycache__", ".airflow"}


def _sources() -> list[Path]:
    files = [
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
        ROOT / "bench" / "RESULTS.md",
        ROOT / "Makefile",
        ROOT / "pyproject.toml",
        ROOT / "docker-compose.yaml",
        ROOT / "Dockerfile",
    ]
    for top in TOP:
        for folder, dirs, names in os.walk(ROOT / top):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")]
            files += [Path(folder, n) for n in names if Path(n).suffix in {".py", ".md", ".yaml", ".yml", ".sh"}]
    return sorted({f for f in files if f.exists()})


def _module_names() -> dict[str, set[str]]:
    """mlm_tasks' modules, each with the top-level names it defines or imports."""
    names: dict[str, set[str]] = {}
    for f in (ROOT / "mlm_tasks").rglob("*.py"):
        parts = f.relative_to(ROOT).with_suffix("").parts
        mod = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        defined = set()
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        names[mod] = defined
    return names


def _dotted_ok(ref: str, modules: dict[str, set[str]]) -> bool:
    parts = ref.split(".")
    for i in range(len(parts), 0, -1):
        mod = ".".join(parts[:i])
        if mod in modules:
            rest = parts[i] if i < len(parts) else ""
            return not rest or rest.startswith("__") or rest in modules[mod] or f"{mod}.{rest}" in modules
    return False


def _exists(ref: str, source: Path) -> bool:
    if any(ch in ref for ch in "*<>{}") or "X.Y" in ref:
        return True  # a pattern, not a file
    return (ROOT / ref).exists() or (source.parent / ref).exists()


def test_every_file_and_module_a_page_or_comment_names_exists():
    modules = _module_names()
    missing = []
    for source in (s for s in _sources() if s != Path(__file__).resolve()):
        text = source.read_text(errors="replace")
        rel = source.relative_to(ROOT)
        for ref in PATH_REF.findall(text):
            if ref.startswith("dags/solutions_team/"):
                continue  # ml-auto-solutions' own tree, named as a source
            if not _exists(ref, source):
                missing.append(f"{rel}: {ref}")
        for ref in DOTTED_REF.findall(text):
            if not FILE_NAME.search(ref) and not _dotted_ok(ref, modules):
                missing.append(f"{rel}: {ref}")
    assert not missing, "references to files or modules that do not exist:\n" + "\n".join(sorted(set(missing)))


@pytest.mark.parametrize(
    "ref,ok",
    [
        ("mlm_tasks.storage.read_json", True),
        ("mlm_tasks.tpu.nothere", False),
        ("mlm_tasks.config.PipelineConfig", True),
    ],
)
def test_the_dotted_check_tells_a_module_or_name_from_a_stale_one(ref, ok):
    assert _dotted_ok(ref, _module_names()) is ok
