"""Import boundaries: mlm_tasks runs without Airflow; parsing the DAGs loads no TensorFlow, quickly."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, **env) -> str:
    import os

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_importing_mlm_tasks_does_not_import_airflow_or_tensorflow():
    mods = ["mlm_tasks." + p.stem for p in (ROOT / "mlm_tasks").glob("*.py") if p.stem != "__main__"]
    mods += ["mlm_tasks.steps." + p.stem for p in (ROOT / "mlm_tasks" / "steps").glob("*.py") if p.stem != "__init__"]
    assert "mlm_tasks.steps.train" in mods
    code = ("import sys\n" + "".join(f"import {m}\n" for m in mods)
            + "print(sorted({m.split('.')[0] for m in sys.modules} & {'airflow', 'tensorflow', 'transformers'}))")
    assert _run(code) == "[]"


def test_parsing_the_dag_folder_imports_no_tensorflow_and_is_fast(tmp_path):
    code = f"""
import sys, time
import airflow.sdk
from airflow.dag_processing.dagbag import DagBag
t = time.perf_counter()
bag = DagBag(dag_folder={str(ROOT / 'dags')!r})
took = time.perf_counter() - t
assert not bag.import_errors, bag.import_errors
print(sorted(bag.dag_ids), 'tensorflow' in sys.modules, 'transformers' in sys.modules, round(took, 2))
"""
    out = _run(code, AIRFLOW_HOME=str(tmp_path), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"),
               PYTHONPATH=f"{ROOT}:{ROOT / 'plugins'}").splitlines()[-1]
    dag_ids, tf_loaded, hf_loaded, took = eval(out.split("] ")[0] + "]"), *out.split("] ")[1].split()
    assert {"mlm_pretrain", "mlm_tpu_janitor"} <= set(dag_ids)
    assert tf_loaded == "False" and hf_loaded == "False"
    print(f"DagBag parse took {took}s")  # a figure for the log; timings are benchmarked in bench/, not asserted
