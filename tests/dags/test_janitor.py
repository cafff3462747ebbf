"""mlm_tpu_janitor run for real (`airflow dags test`) against the fake TPU API."""
import subprocess
import sys
import time

from peers.airflow_home import ROOT, dags_test

ZONE, OTHER_ZONE = "us-central2-b", "europe-west4-a"


def test_janitor_deletes_expired_nodes_only_in_every_zone(airflow_env, fake_tpu):
    now = int(time.time())
    fake_tpu.add_node("proj", ZONE, "mlm-pretrain-expired", labels={"expires": str(now - 60), "run": "old"})
    fake_tpu.add_node("proj", ZONE, "mlm-pretrain-fresh", labels={"expires": str(now + 3600)})
    fake_tpu.add_node("proj", ZONE, "someone-elses", labels={"expires": str(now - 60)})
    fake_tpu.add_node("proj", OTHER_ZONE, "mlm-pretrain-expired-too", labels={"expires": str(now - 60)})
    fake_tpu.add_node("proj", "us-east5-a", "mlm-pretrain-not-listed", labels={"expires": str(now - 60)})
    # google_cloud_default holds the service-account key the fake TPU API insists on (fixture).
    conf = {"project": "proj", "zones": [ZONE, OTHER_ZONE], "api_endpoint": fake_tpu.url, "transport": "rest"}

    result = dags_test(airflow_env, "mlm_tpu_janitor", conf=conf, dagfile=ROOT / "dags" / "mlm_tpu_janitor.py")

    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-6000:]
    assert fake_tpu.node("proj", ZONE, "mlm-pretrain-expired") is None
    assert fake_tpu.node("proj", OTHER_ZONE, "mlm-pretrain-expired-too") is None
    assert fake_tpu.node("proj", ZONE, "mlm-pretrain-fresh") is not None
    assert fake_tpu.node("proj", ZONE, "someone-elses") is not None
    assert fake_tpu.node("proj", "us-east5-a", "mlm-pretrain-not-listed") is not None  # zone not in the list
    assert f"Deleting TPU VM mlm-pretrain-expired in {ZONE} (READY, run old" in log
    assert "Google clients use the credentials of Airflow connection 'google_cloud_default'" in log


def test_janitor_goes_on_after_a_refused_delete_and_fails_naming_it(airflow_env, fake_tpu):
    now = int(time.time())
    # Listed first (names sort), so a janitor that stops at the first error spares the other two.
    fake_tpu.add_node("proj", ZONE, "mlm-pretrain-a-refused", labels={"expires": str(now - 60)})
    fake_tpu.add_node("proj", ZONE, "mlm-pretrain-b-expired", labels={"expires": str(now - 60)})
    fake_tpu.add_node("proj", OTHER_ZONE, "mlm-pretrain-expired-too", labels={"expires": str(now - 60)})
    fake_tpu.refuse_delete("proj", ZONE, "mlm-pretrain-a-refused", code=403)
    conf = {"project": "proj", "zones": [ZONE, OTHER_ZONE], "api_endpoint": fake_tpu.url, "transport": "rest"}

    # The task fails, so `dags test` runs its retries: no delay between them.
    result = dags_test(airflow_env, "mlm_tpu_janitor", conf=conf, dagfile=ROOT / "dags" / "mlm_tpu_janitor.py",
                       extra_env={"MLM_RETRY_DELAY_S": "0"}, timeout=240)

    log = result.stdout + result.stderr
    assert result.returncode != 0, log[-6000:]
    assert fake_tpu.node("proj", ZONE, "mlm-pretrain-a-refused") is not None
    assert fake_tpu.node("proj", ZONE, "mlm-pretrain-b-expired") is None
    assert fake_tpu.node("proj", OTHER_ZONE, "mlm-pretrain-expired-too") is None
    assert f"Could not delete TPU VM(s) ['{ZONE}/mlm-pretrain-a-refused']" in log, log[-6000:]
    assert "Permission 'tpu.nodes.delete' denied" in log  # the API's reason is logged too


def test_janitor_dag_is_thin():
    source = (ROOT / "dags" / "mlm_tpu_janitor.py").read_text()
    assert "@hourly" in source and "doc_md=__doc__" in source
    # plugins/ on the path as Airflow puts it there (the DAG uses plugins/failure_notifier.py).
    code = ("import sys, runpy; sys.path[:0] = [{root!r}, {plugins!r}]; g = runpy.run_path({path!r}); "
            "assert 'google.cloud.tpu_v2' not in sys.modules and 'tensorflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code.format(root=str(ROOT), plugins=str(ROOT / "plugins"),
                                                      path=str(ROOT / "dags" / "mlm_tpu_janitor.py"))], check=True)
