"""mlm_tpu_janitor run for real (`airflow dags test`) against the fake TPU API."""

import subprocess
import sys
import time

from mlm_tasks.tpu import registry as tpu_registry
from peers.airflow_home import ROOT, dags_test

ZONE, OTHER_ZONE = "us-central2-b", "europe-west4-a"


def _deployed(fake_tpu, project: str = "proj", **env) -> dict:
    """The project and the TPU API are the deployment's (its environment), never a trigger's."""
    return {"MLM_TPU_PROJECT": project, "MLM_TPU_API_ENDPOINT": fake_tpu.url, "MLM_TPU_TRANSPORT": "rest", **env}


def test_janitor_deletes_expired_nodes_in_every_zone_and_every_place_the_registry_knows(airflow_env, fake_tpu):
    """One `airflow dags test` (~1 CPU-minute on CI's two cores) for both places the janitor looks: the zones of
    its params, and every node the registry says the pipeline made (another project and zone here); a node
    the registry knows that is gone leaves the registry."""
    now = int(time.time())
    fake_tpu.add_node("proj", ZONE, "mlm-pretrain-expired", labels={"expires": str(now - 60), "run": "old"})
    fake_tpu.add_node("proj", ZONE, "mlm-pretrain-fresh", labels={"expires": str(now + 3600)})
    fake_tpu.add_node("proj", ZONE, "someone-elses", labels={"expires": str(now - 60)})
    fake_tpu.add_node("proj", OTHER_ZONE, "mlm-pretrain-expired-too", labels={"expires": str(now - 60)})
    fake_tpu.add_node("proj", "us-east5-a", "mlm-pretrain-not-listed", labels={"expires": str(now - 60)})
    # Made by runs in a project and zone the janitor's params do not name.
    fake_tpu.add_node("other-proj", "asia-east1-c", "mlm-pretrain-far", labels={"expires": str(now - 60)})
    fake_tpu.add_node("other-proj", "asia-east1-c", "mlm-pretrain-far-fresh", labels={"expires": str(now + 3600)})
    tpu_registry.record(fake_tpu.registry, "other-proj", "asia-east1-c", "mlm-pretrain-far", now - 60)
    tpu_registry.record(fake_tpu.registry, "other-proj", "asia-east1-c", "mlm-pretrain-far-fresh", now + 3600)
    tpu_registry.record(fake_tpu.registry, "proj", "us-west4-a", "mlm-pretrain-long-gone", now - 60)
    # google_cloud_default holds the service-account key the fake TPU API insists on (fixture).
    conf = {"zones": [ZONE, OTHER_ZONE]}

    result = dags_test(
        airflow_env,
        "mlm_tpu_janitor",
        conf=conf,
        dagfile=ROOT / "dags" / "mlm_tpu_janitor.py",
        extra_env=_deployed(fake_tpu),
    )

    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-6000:]
    assert fake_tpu.node("proj", ZONE, "mlm-pretrain-expired") is None
    assert fake_tpu.node("proj", OTHER_ZONE, "mlm-pretrain-expired-too") is None
    assert fake_tpu.node("proj", ZONE, "mlm-pretrain-fresh") is not None
    assert fake_tpu.node("proj", ZONE, "someone-elses") is not None
    # Neither in the params' zones nor recorded by the pipeline: not the janitor's to judge.
    assert fake_tpu.node("proj", "us-east5-a", "mlm-pretrain-not-listed") is not None
    assert f"Deleting TPU VM mlm-pretrain-expired in {ZONE} (READY, run old" in log
    assert "Google clients use the credentials of Airflow connection 'google_cloud_default'" in log
    assert fake_tpu.node("other-proj", "asia-east1-c", "mlm-pretrain-far") is None
    assert fake_tpu.node("other-proj", "asia-east1-c", "mlm-pretrain-far-fresh") is not None
    # The deleted node and the long-gone one leave the registry; the live one stays in it.
    assert [e.name for e in tpu_registry.entries(fake_tpu.registry)] == ["mlm-pretrain-far-fresh"]


def test_janitor_goes_on_after_a_refused_delete_and_fails_naming_it(airflow_env, fake_tpu):
    now = int(time.time())
    # Listed first (names sort), so a janitor that stops at the first error spares the other two.
    fake_tpu.add_node("proj", ZONE, "mlm-pretrain-a-refused", labels={"expires": str(now - 60)})
    fake_tpu.add_node("proj", ZONE, "mlm-pretrain-b-expired", labels={"expires": str(now - 60)})
    fake_tpu.add_node("proj", OTHER_ZONE, "mlm-pretrain-expired-too", labels={"expires": str(now - 60)})
    fake_tpu.refuse_delete("proj", ZONE, "mlm-pretrain-a-refused", code=403)
    conf = {"zones": [ZONE, OTHER_ZONE]}

    # The task fails, so `dags test` runs its retries: no delay between them.
    result = dags_test(
        airflow_env,
        "mlm_tpu_janitor",
        conf=conf,
        dagfile=ROOT / "dags" / "mlm_tpu_janitor.py",
        extra_env=_deployed(fake_tpu, MLM_RETRY_DELAY_S="0"),
        timeout=240,
    )

    log = result.stdout + result.stderr
    assert result.returncode != 0, log[-6000:]
    assert fake_tpu.node("proj", ZONE, "mlm-pretrain-a-refused") is not None
    assert fake_tpu.node("proj", ZONE, "mlm-pretrain-b-expired") is None
    assert fake_tpu.node("proj", OTHER_ZONE, "mlm-pretrain-expired-too") is None
    assert f"Could not delete TPU VM(s) ['{ZONE}/mlm-pretrain-a-refused']" in log, log[-6000:]
    assert "Permission 'tpu.nodes.delete' denied" in log  # the API's reason is logged too


def test_janitor_fails_loudly_when_not_configured(airflow_env, fake_tpu):
    # A conf cannot stand in for the deployment's project: it is ignored.
    conf = {"zones": [ZONE], "project": "from-a-trigger"}
    result = dags_test(
        airflow_env,
        "mlm_tpu_janitor",
        conf=conf,
        dagfile=ROOT / "dags" / "mlm_tpu_janitor.py",
        extra_env=_deployed(fake_tpu, project=""),
    )
    log = result.stdout + result.stderr
    assert result.returncode != 0, "an unconfigured janitor must not pass (or skip) in green"
    assert "The janitor has no project to check: set MLM_TPU_PROJECT" in log, log[-6000:]
    assert fake_tpu.requests == []
    # No MLM_TPU_REGISTRY fails in the same block of both tasks (bad_input_fails_fast), with the message
    # tests/plugins/test_tpu_operators.py holds: not a second `dags test` (~1 CPU-minute on CI).


def test_the_janitor_looks_in_its_zones_then_in_every_recorded_place():
    entries = [
        tpu_registry.Entry("p2", "z9", "mlm-a", 1),
        tpu_registry.Entry("p1", "z1", "mlm-b", 1),
        tpu_registry.Entry("p2", "z9", "mlm-c", 1),
    ]
    assert tpu_registry.places_to_check("p1", ["z1", "z2"], entries) == [("p1", "z1"), ("p1", "z2"), ("p2", "z9")]


def test_janitor_dag_is_thin():
    source = (ROOT / "dags" / "mlm_tpu_janitor.py").read_text()
    assert "@hourly" in source and "doc_md=__doc__" in source
    # plugins/ on the path as Airflow puts it there (the DAG uses plugins/mlm_airflow/notifications.py).
    code = (
        "import sys, runpy; sys.path[:0] = [{root!r}, {plugins!r}]; g = runpy.run_path({path!r}); "
        "assert 'google.cloud.tpu_v2' not in sys.modules and 'tensorflow' not in sys.modules"
    )
    subprocess.run(
        [
            sys.executable,
            "-c",
            code.format(root=str(ROOT), plugins=str(ROOT / "plugins"), path=str(ROOT / "dags" / "mlm_tpu_janitor.py")),
        ],
        check=True,
    )
