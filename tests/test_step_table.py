"""docs/architecture.md's step table is true: one step = one module = one task id = one CLI verb = one function.

Every row names a module that exists and defines the step's function with (cfg, ctx) first (validate, which
checks the config before there is a run, with cfg alone); the rows are
mlm_tasks.steps.STEPS in order; the CLI verb is the step's name; the task id is the step's name and is a
task of mlm_pretrain (the shard-set steps of mlm_dataset_refresh too). Every task of the two DAGs is a
step or one of the tasks the doc lists as not a step, and no task pulls another's XCom by task id.
"""

import importlib
import inspect
import re
from pathlib import Path

import pytest

from mlm_tasks.steps import SHARD_SET_STEPS

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
HEADER = ["step", "module", "task id", "CLI verb", "inputs", "outputs"]

NO_RUN_CONTEXT = ("validate",)  # steps that take the config alone


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _unquote(cell: str) -> str:
    return cell.strip("`").strip()


def read_table(text: str) -> list[dict]:
    """The one Markdown table whose header is HEADER, as a list of row dicts (backticks removed)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("|") and _cells(line) == HEADER]
    assert len(starts) == 1, f"{DOC.name} must hold exactly one table with columns {HEADER}, found {len(starts)}"
    rows = []
    for line in lines[starts[0] + 2 :]:  # skip the |---| line
        if not line.lstrip().startswith("|"):
            break
        cells = _cells(line)
        assert len(cells) == len(HEADER), f"row has {len(cells)} cells, not {len(HEADER)}: {line}"
        rows.append({key: _unquote(cell) for key, cell in zip(HEADER, cells, strict=False)})
    return rows


def non_step_tasks(text: str) -> set[str]:
    """Task ids named first on each bullet of the 'Tasks that are not steps' section."""
    section = text.split("## Tasks that are not steps", 1)[1].split("\n## ", 1)[0]
    names = set()
    for bullet in re.findall(r"^- (.+)$", section, flags=re.M):
        head = bullet.split("(", 1)[0]
        names.update(re.findall(r"`([a-z_]+)`", head))
    return names


DOC_TEXT = DOC.read_text(encoding="utf-8")
ROWS = read_table(DOC_TEXT)
ROW_IDS = [row["step"] for row in ROWS]


def test_table_lists_every_step_in_order():
    from mlm_tasks.steps import STEPS

    assert list(STEPS) == ROW_IDS


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
def test_row_names_one_module_one_function(row):
    from mlm_tasks.steps import STEPS

    step = row["step"]
    assert step in STEPS
    assert row["module"] == f"mlm_tasks/steps/{step}.py"
    assert (ROOT / row["module"]).is_file(), row["module"]
    module = importlib.import_module("mlm_tasks.steps." + step)
    func = getattr(module, step, None)
    assert inspect.isfunction(func), f"{row['module']} defines no function {step}()"
    assert func.__module__ == module.__name__, f"{step}() is imported into {row['module']}, not defined there"
    params = list(inspect.signature(func).parameters.values())
    first = ["cfg"] if step in NO_RUN_CONTEXT else ["cfg", "ctx"]
    assert [p.name for p in params[: len(first)]] == first, f"{step}{inspect.signature(func)}"
    assert "PipelineConfig" in str(params[0].annotation), f"{step}{inspect.signature(func)}"
    assert step in NO_RUN_CONTEXT or "RunContext" in str(params[1].annotation), f"{step}{inspect.signature(func)}"
    if step in NO_RUN_CONTEXT:
        assert "ctx" not in [p.name for p in params], f"{step}{inspect.signature(func)}: a ctx it never uses"
    rest = [p.name for p in params[len(first) :] if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    assert not rest, f"{step}(): step-specific inputs must be keyword-only (after `*`): {rest}"
    assert row["inputs"] and row["outputs"], step


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
def test_cli_verb_and_task_id_are_the_step_name(row):
    from mlm_tasks.cli import VERBS, parse_args

    assert row["CLI verb"] == row["step"] and row["CLI verb"] in VERBS
    assert parse_args([row["CLI verb"]]).step == row["step"]
    assert row["task id"] == row["step"]


def test_no_task_pulls_xcom_by_task_id():
    offenders = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for folder in ("plugins", "dags")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "task_ids=" in line
    ]
    assert not offenders, "values flow as XComArgs, never pulled by task id:\n" + "\n".join(offenders)


# --- the DAGs, loaded as tests/dags/test_dag_integrity.py loads them ----------------------------------


@pytest.fixture(scope="module")
def dagbag():
    pytest.importorskip("airflow")
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags"))


def _last_error(trace: str) -> str:
    lines = trace.strip().splitlines()
    raised = [n for n, line in enumerate(lines) if re.match(r"^[\w.]+(Error|Exception)\b", line)]
    return " ".join(line.strip() for line in lines[raised[-1] if raised else -1 :])


def _dag(bag, dag_id: str):
    if dag_id not in bag.dags:
        errors = {Path(f).name: _last_error(e) for f, e in bag.import_errors.items()}
        pytest.fail(f"DAG {dag_id} did not load; import errors: {errors}")
    return bag.dags[dag_id]


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
def test_task_id_is_a_task_of_mlm_pretrain(dagbag, row):
    assert row["task id"] in _dag(dagbag, "mlm_pretrain").task_ids


def test_shard_set_steps_are_tasks_of_mlm_dataset_refresh(dagbag):
    refresh = _dag(dagbag, "mlm_dataset_refresh")
    by_step = {row["step"]: row["task id"] for row in ROWS}
    for step in ("validate", *SHARD_SET_STEPS):
        assert by_step[step] in refresh.task_ids, step


@pytest.mark.parametrize("dag_id", ["mlm_pretrain", "mlm_dataset_refresh"])
def test_every_task_is_a_step_or_documented_as_not_one(dagbag, dag_id):
    documented = {row["task id"] for row in ROWS} | non_step_tasks(DOC_TEXT)
    assert set(_dag(dagbag, dag_id).task_ids) <= documented, set(_dag(dagbag, dag_id).task_ids) - documented
