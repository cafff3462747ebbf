"""pyproject.toml declares what mlm_tasks imports, no more and no less, with bounds that the locked
environment meets (a dependency added to the code and forgotten in the package fails here)."""

import ast
import functools
import sys
from importlib import metadata
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def _declared() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(line) for line in project["dependencies"]]
    return {canonicalize_name(r.name): r for r in reqs}


def _imported_modules() -> set[str]:
    """Every absolute import of a module outside the standard library and mlm_tasks, lazy ones included."""
    found = set()
    for path in (ROOT / "mlm_tasks").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                # `from google.cloud import tpu_v2` imports google.cloud.tpu_v2
                found.update(f"{node.module}.{a.name}" for a in node.names)
    top = lambda m: m.split(".")[0]  # noqa: E731
    return {m for m in found if top(m) not in sys.stdlib_module_names and top(m) not in ("mlm_tasks", "__future__")}


@functools.cache
def _top_level_owners() -> dict[str, list[str]]:
    return metadata.packages_distributions()


@functools.cache
def _files_of(dist: str) -> frozenset[str]:
    return frozenset(str(f) for f in metadata.distribution(dist).files or ())


def _distribution_of(module: str) -> str:
    """The installed distribution whose files hold `module` (google.* is a namespace many share)."""
    top = module.split(".")[0]
    candidates = sorted(set(_top_level_owners().get(top, [])))
    if len(candidates) == 1:
        return canonicalize_name(candidates[0])
    parts = module.split(".")
    for depth in range(len(parts), 1, -1):  # the longest package path a distribution ships
        prefix = "/".join(parts[:depth])
        owners = {
            canonicalize_name(d)
            for d in candidates
            if f"{prefix}/__init__.py" in _files_of(d) or f"{prefix}.py" in _files_of(d)
        }
        if len(owners) == 1:
            return owners.pop()
    raise AssertionError(f"No single installed distribution provides {module} (candidates {candidates})")


def test_every_imported_distribution_is_declared_and_nothing_else():
    imported = {_distribution_of(m) for m in _imported_modules()}
    declared = set(_declared())
    assert imported - declared == set(), "imported by mlm_tasks but not in pyproject.toml's dependencies"
    assert declared - imported == set(), "declared in pyproject.toml but imported nowhere in mlm_tasks"


def test_the_locked_versions_meet_the_declared_bounds():
    for name, req in _declared().items():
        assert req.specifier.contains(metadata.version(name)), (
            f"{name} {metadata.version(name)} (requirements.txt) does not meet pyproject.toml's {req}: "
            "move the bound or the pin"
        )


def test_the_tpu_vm_images_and_locks_meet_the_declared_bounds():
    """mlm_tasks runs on a TPU VM beside its image's packages and the VM lock: the bounds hold there too."""
    declared, checked = _declared(), 0
    for pins in sorted((ROOT / "mlm_tasks" / "tpu" / "vm").glob("*.txt")):
        for line in pins.read_text().splitlines():
            name, sep, version = line.split(" ")[0].partition("==")
            req = declared.get(canonicalize_name(name)) if sep else None
            if req is not None:
                checked += 1
                assert req.specifier.contains(version), f"{pins.name} pins {name}=={version}, outside {req}"
    assert checked > 10  # the files were read: both images' TensorFlow and numpy, both locks' transformers, ...
