"""The boundary between deployment settings and run settings (mlm_tasks/deployment.py): a trigger
(form, REST conf) or a dataset-refresh event may set run settings only, inside the deployment's
roots; the deployment's own settings come on top. Real files: the deployment YAML, config files, a
FIFO and a symlink out of the configs folder."""
from __future__ import annotations

import os

import pytest

from mlm_tasks.deployment import Deployment, check_event
from mlm_tasks.errors import ConfigError


@pytest.fixture
def deployment(tmp_path, monkeypatch) -> Deployment:
    configs, out, corpora = tmp_path / "configs", tmp_path / "out", tmp_path / "corpora"
    for d in (configs, out, corpora):
        d.mkdir()
    (configs / "tiny.yaml").write_text("train:\n  steps: 7\n")
    monkeypatch.setenv("TEAM_PROJECT", "team-project")
    path = tmp_path / "deployment.yaml"
    path.write_text(f"""
settings:
  gcp_conn_id: team_gcp
  tpu: {{project: "${{TEAM_PROJECT}}", service_account: trainer@team-project.iam.gserviceaccount.com}}
output_roots: [{out}, "gs://team-bucket/mlm/"]
config_dirs: [{configs}]
input_roots: [{corpora}]
zones: [us-central2-b]
""")
    monkeypatch.setenv("MLM_DEPLOYMENT", str(path))
    return Deployment.load()


def test_no_deployment_file_means_no_boundary(monkeypatch):
    monkeypatch.delenv("MLM_DEPLOYMENT", raising=False)
    assert Deployment.load() is None


def test_a_run_gets_the_deployment_settings_on_top_of_its_own(deployment, tmp_path):
    cfg = deployment.run_config({"config_file": str(tmp_path / "configs" / "tiny.yaml"),
                                 "output_root": str(tmp_path / "out" / "team-a"), "vocab_size": 1000,
                                 "overrides": {"train.learning_rate": 1e-3}})
    assert (cfg.train.steps, cfg.tokenizer.vocab_size, cfg.train.learning_rate) == (7, 1000, 1e-3)
    assert (cfg.gcp_conn_id, cfg.tpu.project) == ("team_gcp", "team-project")  # ${VAR} from the environment
    assert cfg.tpu.service_account == "trainer@team-project.iam.gserviceaccount.com"


@pytest.mark.parametrize("overrides", [
    {"tpu.api_endpoint": "http://anywhere"},          # would receive the GCP connection's token
    {"tpu.env": {"PYTHONWARNINGS": "x", "BROWSER": "sh -c id"}},  # exported on the VM before Python
    {"tpu": {"env": {"HF_ENDPOINT": "http://elsewhere"}}},         # the same, as a nested section
    {"publish.hf_conn_id": "someone_elses_hub"}, {"gcp_conn_id": "prod_admin"}, {"tpu.ssh_conn_id": "x"},
    {"tpu.service_account": "owner@p.iam.gserviceaccount.com"}, {"tpu.project": "other"},
    {"tpu.python": "/bin/sh"}, {"tpu.workdir": "/etc"}, {"sensor.gcp_conn_id": "x"},
])
def test_a_run_may_not_set_a_deployment_setting(deployment, tmp_path, overrides):
    with pytest.raises(ConfigError, match=r"is a deployment setting: the trigger's settings may not set it \(the "
                                          r"deployment sets it in .*deployment\.yaml"):
        deployment.run_config({"output_root": str(tmp_path / "out"), "overrides": overrides})


def test_a_flat_form_name_of_a_deployment_setting_is_refused_too(deployment, tmp_path):
    with pytest.raises(ConfigError, match="tpu.project is a deployment setting"):
        deployment.run_config({"output_root": str(tmp_path / "out"), "tpu_project": "other"})


@pytest.mark.parametrize("root", ["/tmp/elsewhere", "gs://other-bucket/mlm", "gs://team-bucket/mlm/../../x",
                                  "gs://team-bucket/mlmx", "OUT/../../escape"])
def test_output_root_outside_the_allowed_roots_is_refused(deployment, tmp_path, root):
    root = root.replace("OUT", str(tmp_path / "out"))
    with pytest.raises(ConfigError, match=r"outside the roots this deployment allows|has a '\.\.' path segment"):
        deployment.run_config({"output_root": root})


def test_allowed_roots_take_folders_under_them(deployment):
    assert deployment.run_config({"output_root": "gs://team-bucket/mlm/runs-a"}).output_root == \
        "gs://team-bucket/mlm/runs-a"


def test_config_file_only_from_the_configs_folder(deployment, tmp_path):
    outside = tmp_path / "mine.yaml"
    outside.write_text("train:\n  steps: 1\n")
    (tmp_path / "configs" / "link.yaml").symlink_to(outside)  # a link out is judged by where it points
    fifo = tmp_path / "configs" / "fifo.yaml"
    os.mkfifo(fifo)  # reading it would hang the task
    out = str(tmp_path / "out")
    for path, message in [(outside, "outside the deployment's config folders"), ("/dev/zero", "outside"),
                          (tmp_path / "configs" / "link.yaml", "outside"),
                          (fifo, "not a regular file"), (tmp_path / "configs" / "none.yaml", "does not exist")]:
        with pytest.raises(ConfigError, match=message):
            deployment.run_config({"config_file": str(path), "output_root": out})


def test_local_inputs_only_from_the_input_roots(deployment, tmp_path):
    out = str(tmp_path / "out")
    ok = deployment.run_config({"output_root": out, "corpus_source": "local_files",
                                "local_paths": [str(tmp_path / "corpora" / "*.txt")]})
    assert ok.corpus.local_paths == [str(tmp_path / "corpora" / "*.txt")]
    with pytest.raises(ConfigError, match=r"corpus\.local_paths '/etc/passwd' is outside the folders"):
        deployment.run_config({"output_root": out, "corpus_source": "local_files", "local_paths": ["/etc/passwd"]})
    with pytest.raises(ConfigError, match=r"corpus\.shards_uri 'gs://other/shards' is outside"):
        deployment.run_config({"output_root": out, "overrides": {"corpus.shards_uri": "gs://other/shards"}})


def test_zones_are_the_deployments(deployment):
    base = {"output_root": "gs://team-bucket/mlm", "compute": "tpu_vm"}
    assert deployment.run_config({**base, "tpu_zone": "us-central2-b"}).tpu.zone == "us-central2-b"
    with pytest.raises(ConfigError, match="not one of this deployment's zones"):
        deployment.run_config({**base, "tpu_zone": "europe-west4-a"})


@pytest.mark.parametrize("extra, message", [
    ({"fingerprint": "../../etc", "output_root": "gs://team-bucket/mlm", "data_config": {}}, "not 16 hex digits"),
    ({"fingerprint": "0123456789abcdef", "output_root": "gs://team-bucket/mlm"}, "carries no data settings"),
    ({"fingerprint": "0123456789abcdef", "output_root": "gs://team-bucket/mlm",
      "data_config": {"tpu": {"api_endpoint": "http://x"}}}, "tpu.api_endpoint is a deployment setting: a "
                                                              "dataset-refresh event may not set it"),
])
def test_an_event_is_checked_like_a_form(deployment, extra, message):
    with pytest.raises(ConfigError, match=message):
        check_event(extra, deployment)


def test_a_typo_in_the_deployment_file_names_itself(tmp_path):
    path = tmp_path / "deployment.yaml"
    path.write_text("settings: {tpu: {projekt: x}}\n")
    with pytest.raises(ValueError, match="projekt"):
        Deployment.load(str(path))
    path.write_text("output_root: [x]\n")
    with pytest.raises(ValueError, match="output_root"):
        Deployment.load(str(path))


def test_a_variable_the_environment_lacks_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    path = tmp_path / "deployment.yaml"
    path.write_text("settings: {tpu: {project: '${NOT_SET_ANYWHERE}'}}\n")
    with pytest.raises(ConfigError, match="uses NOT_SET_ANYWHERE, which this service's environment does not set"):
        Deployment.load(str(path))


@pytest.mark.parametrize("zone", ["us-central2-b/nodes/other", "../x", "us-central2-b?x=1", "US-CENTRAL2-B"])
def test_a_zone_a_run_picks_is_only_a_zone(zone):
    """tpu.zone is a run setting that reaches the TPU API's resource path: nothing else passes."""
    from mlm_tasks.config import build_config

    with pytest.raises(ConfigError, match="tpu.zone"):
        build_config({}, {"tpu_zone": zone})
    assert build_config({}, {"tpu_zone": "northamerica-northeast1-a"}).tpu.zone == "northamerica-northeast1-a"
