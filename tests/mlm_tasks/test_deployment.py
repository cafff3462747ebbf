"""The boundary between deployment settings and run settings (mlm_tasks/config/deployment.py): a trigger
(form, REST conf) or a dataset-refresh event may set run settings only, inside the deployment's
roots; the deployment's own settings come on top. Real files: the deployment YAML, config files, a
FIFO and a symlink out of the configs folder."""

from __future__ import annotations

import os

import pytest

from mlm_tasks.config import PipelineConfig
from mlm_tasks.config.deployment import DEPLOYMENT_KEYS, Deployment, check_event, run_config
from mlm_tasks.config.section import Section, leaves
from mlm_tasks.errors import ConfigError
from peers.hostile import billion_laughs

# What a setting reaches, recognised by the words of its name (the schema's naming: *_conn_id, *_port,
# service_account, api_endpoint...) and, for an environment, by its type (a map of strings). A new setting
# named that way must be marked `DeploymentOnly`, or this test fails.
REACHES = {
    "a credential": {"conn", "account", "oslogin", "token", "key", "secret", "password", "credentials"},
    "a shell": {"python", "workdir", "env", "bootstrap", "command", "script", "args"},
    "an endpoint": {"endpoint", "transport", "network", "subnetwork", "ssh", "ips", "url", "host", "port"},
    "a machine": {"project", "machine", "image"},
}
# Marked for a reason no name says: the gate's baselines must lie where runs cannot write.
MARKED_FOR_THEIR_PLACE = {"publish.releases_root"}


def _unmarked(model: type) -> list[str]:
    marked = set(DEPLOYMENT_KEYS) if model is PipelineConfig else set()
    out = []
    for name, field in leaves(model):
        words = set(name.rsplit(".", 1)[-1].split("_"))
        if (any(words & ws for ws in REACHES.values()) or field.annotation == dict[str, str]) and name not in marked:
            out.append(name)
    return out


def test_every_setting_that_reaches_a_credential_shell_endpoint_or_machine_is_marked():
    assert _unmarked(PipelineConfig) == []
    recognised = {n for n in DEPLOYMENT_KEYS if set(n.rsplit(".", 1)[-1].split("_")) & set().union(*REACHES.values())}
    assert set(DEPLOYMENT_KEYS) - recognised == MARKED_FOR_THEIR_PLACE

    class Tomorrow(Section):  # a setting added unmarked is caught
        callback_url: str = ""
        startup_env: dict[str, str] = {}
        steps: int = 1

    assert _unmarked(Tomorrow) == ["callback_url", "startup_env"]


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


def test_without_a_file_airflow_still_refuses_every_deployment_setting(monkeypatch, tmp_path):
    """Secure by default: a platform team that deploys without MLM_DEPLOYMENT (Helm, Cloud Composer) gets the
    built-in boundary in every Airflow task, not an open door; only the CLI applies none (Deployment.load())."""
    monkeypatch.delenv("MLM_DEPLOYMENT", raising=False)
    assert Deployment.load() is None
    builtin = Deployment.for_airflow()
    for overrides in (
        {"tpu.api_endpoint": "http://anywhere"},
        {"publish.hf_conn_id": "x"},
        {"tpu": {"env": {"BROWSER": "sh -c id"}}},
        {"publish.releases_root": str(tmp_path)},
    ):
        with pytest.raises(
            ConfigError,
            match=r"is a deployment setting: the trigger's settings may not set it "
            r"\(the built-in boundary.*point MLM_DEPLOYMENT at it",
        ):
            run_config({"output_root": str(tmp_path / "out"), "overrides": overrides}, builtin)
    with pytest.raises(ConfigError, match="gcp_conn_id is a deployment setting"):
        run_config({"output_root": str(tmp_path / "out"), "gcp_conn_id": "prod_admin"}, builtin)
    # No file names roots, so none are checked; the run's own settings go through.
    cfg = run_config({"output_root": str(tmp_path / "anywhere"), "steps": 3}, builtin)
    assert (cfg.output_root, cfg.train.steps, cfg.gcp_conn_id) == (
        str(tmp_path / "anywhere"),
        3,
        "google_cloud_default",
    )
    # A file cannot open its roots the built-in way: the flag is no field.
    path = tmp_path / "deployment.yaml"
    path.write_text("_open_roots: true\noutput_roots: [/nowhere]\n")
    with pytest.raises(ConfigError, match="_open_roots: Extra inputs are not permitted"):
        Deployment.load(str(path))


def test_a_run_gets_the_deployment_settings_on_top_of_its_own(deployment, tmp_path):
    cfg = deployment.run_config(
        {
            "config_file": str(tmp_path / "configs" / "tiny.yaml"),
            "output_root": str(tmp_path / "out" / "team-a"),
            "vocab_size": 1000,
            "overrides": {"train.learning_rate": 1e-3},
        }
    )
    assert (cfg.train.steps, cfg.tokenizer.vocab_size, cfg.train.learning_rate) == (7, 1000, 1e-3)
    assert (cfg.gcp_conn_id, cfg.tpu.project) == ("team_gcp", "team-project")  # ${VAR} from the environment
    assert cfg.tpu.service_account == "trainer@team-project.iam.gserviceaccount.com"


@pytest.mark.parametrize(
    "overrides",
    [
        {"tpu.api_endpoint": "http://anywhere"},  # would receive the GCP connection's token
        {"tpu.env": {"PYTHONWARNINGS": "x", "BROWSER": "sh -c id"}},  # exported on the VM before Python
        {"tpu": {"env": {"HF_ENDPOINT": "http://elsewhere"}}},  # the same, as a nested section
        {"tpu.env": {"MLM_TRAIN_HOOKS": "mlm_tasks.training.hooks:fail_at_step=1"}},  # the trainer's test seam
        {"publish.hf_conn_id": "someone_elses_hub"},
        {"gcp_conn_id": "prod_admin"},
        {"tpu.ssh_conn_id": "x"},
        {"tpu.service_account": "owner@p.iam.gserviceaccount.com"},
        {"tpu.project": "other"},
        {"tpu.python": "/bin/sh"},
        {"tpu.workdir": "/etc"},
        {"sensor.gcp_conn_id": "x"},
    ],
)
def test_a_run_may_not_set_a_deployment_setting(deployment, tmp_path, overrides):
    with pytest.raises(
        ConfigError,
        match=r"is a deployment setting: the trigger's settings may not set it \(the "
        r"deployment sets it in .*deployment\.yaml",
    ):
        deployment.run_config({"output_root": str(tmp_path / "out"), "overrides": overrides})


def test_a_flat_form_name_of_a_deployment_setting_is_refused_too(deployment, tmp_path):
    with pytest.raises(ConfigError, match="tpu.project is a deployment setting"):
        deployment.run_config({"output_root": str(tmp_path / "out"), "tpu_project": "other"})


@pytest.mark.parametrize(
    "root",
    [
        "/tmp/elsewhere",
        "gs://other-bucket/mlm",
        "gs://team-bucket/mlm/../../x",
        "gs://team-bucket/mlmx",
        "OUT/../../escape",
    ],
)
def test_output_root_outside_the_allowed_roots_is_refused(deployment, tmp_path, root):
    root = root.replace("OUT", str(tmp_path / "out"))
    with pytest.raises(ConfigError, match=r"outside the roots this deployment allows|has a '\.\.' path segment"):
        deployment.run_config({"output_root": root})


def test_allowed_roots_take_folders_under_them(deployment):
    assert (
        deployment.run_config({"output_root": "gs://team-bucket/mlm/runs-a"}).output_root
        == "gs://team-bucket/mlm/runs-a"
    )


def test_config_file_only_from_the_configs_folder(deployment, tmp_path):
    outside = tmp_path / "mine.yaml"
    outside.write_text("train:\n  steps: 1\n")
    (tmp_path / "configs" / "link.yaml").symlink_to(outside)  # a link out is judged by where it points
    fifo = tmp_path / "configs" / "fifo.yaml"
    os.mkfifo(fifo)  # reading it would hang the task
    out = str(tmp_path / "out")
    for path, message in [
        (outside, "outside the deployment's config folders"),
        ("/dev/zero", "outside"),
        (tmp_path / "configs" / "link.yaml", "outside"),
        (fifo, "not a regular file"),
        (tmp_path / "configs" / "none.yaml", "does not exist"),
    ]:
        with pytest.raises(ConfigError, match=message):
            deployment.run_config({"config_file": str(path), "output_root": out})


def test_local_inputs_only_from_the_input_roots(deployment, tmp_path):
    out = str(tmp_path / "out")
    ok = deployment.run_config(
        {"output_root": out, "corpus_source": "local_files", "local_paths": [str(tmp_path / "corpora" / "*.txt")]}
    )
    assert ok.corpus.local_paths == [str(tmp_path / "corpora" / "*.txt")]
    with pytest.raises(ConfigError, match=r"corpus\.local_paths '/etc/passwd' is outside the folders"):
        deployment.run_config({"output_root": out, "corpus_source": "local_files", "local_paths": ["/etc/passwd"]})
    with pytest.raises(ConfigError, match=r"corpus\.shards_uri 'gs://other/shards' is outside"):
        deployment.run_config({"output_root": out, "overrides": {"corpus.shards_uri": "gs://other/shards"}})


def test_a_mixtures_sources_read_only_from_the_input_roots(deployment, tmp_path):
    """Each corpus.mixture source names files and datasets as corpus.* does: each is judged the same way."""
    out, own = str(tmp_path / "out"), str(tmp_path / "corpora" / "*.txt")

    def mixture(**second):
        source = {"name": "b", "source": "local_files", **second}
        return {
            "output_root": out,
            "corpus_source": "mixture",
            "overrides": {"corpus.mixture": [{"name": "a", "local_paths": [own]}, source]},
        }

    assert deployment.run_config(mixture(local_paths=[own])).corpus.mixture[1].local_paths == [own]
    with pytest.raises(ConfigError, match=r"corpus\.mixture\[1\]\.local_paths '/etc/passwd' is outside the folders"):
        deployment.run_config(mixture(local_paths=["/etc/passwd"]))
    with pytest.raises(ConfigError, match=r"corpus\.mixture\[1\]\.dump_path '/tmp/x.bz2' is outside the folders"):
        deployment.run_config(mixture(source="wiki_dump", dump_path="/tmp/x.bz2"))
    with pytest.raises(ConfigError, match=r"corpus\.mixture\[1\]\.hf_path '/etc' is a path outside"):
        deployment.run_config(mixture(source="hf_dataset", hf_path="/etc"))


def test_zones_are_the_deployments(deployment):
    base = {"output_root": "gs://team-bucket/mlm", "compute": "tpu_vm"}
    assert deployment.run_config({**base, "tpu_zone": "us-central2-b"}).tpu.zone == "us-central2-b"
    with pytest.raises(ConfigError, match="not one of this deployment's zones"):
        deployment.run_config({**base, "tpu_zone": "europe-west4-a"})


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"fingerprint": "../../etc", "output_root": "gs://team-bucket/mlm", "data_config": {}}, "not 16 hex digits"),
        ({"fingerprint": "0123456789abcdef", "output_root": "gs://team-bucket/mlm"}, "carries no data settings"),
        (
            {
                "fingerprint": "0123456789abcdef",
                "output_root": "gs://team-bucket/mlm",
                "data_config": {"tpu": {"api_endpoint": "http://x"}},
            },
            "The dataset-refresh event sets tpu: an event may set only the data sections",
        ),
    ],
)
def test_an_event_is_checked_like_a_form(deployment, extra, message):
    with pytest.raises(ConfigError, match=message):
        check_event(extra, deployment)


def test_a_typo_in_the_deployment_file_names_itself(tmp_path):
    path = tmp_path / "deployment.yaml"
    path.write_text("settings: {tpu: {projekt: x}}\n")
    with pytest.raises(ValueError, match="projekt"):
        Deployment.load(str(path))
    path.write_text("output_root: [x]\n")
    with pytest.raises(ConfigError, match="output_root: Extra inputs"):
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


def _pinned(tmp_path, monkeypatch, extra: str = "") -> Deployment:
    """A deployment shaped like deploy/deployment.yaml that also pins release policy."""
    out, corpora = tmp_path / "out", tmp_path / "corpora"
    for d in (out, corpora):
        d.mkdir(exist_ok=True)
    path = tmp_path / "pinned.yaml"
    path.write_text(f"""
settings:
  gcp_conn_id: team_gcp
  publish: {{hf_conn_id: hf_team_restricted, require_approval: true}}
  gate: {{max_eval_loss: 3.0}}
  tpu: {{project: team-project, service_account: trainer@team-project.iam.gserviceaccount.com}}
output_roots: [{out}]
input_roots: [{corpora}]
{extra}
""")
    monkeypatch.setenv("MLM_DEPLOYMENT", str(path))
    return Deployment.load()


def _event(tmp_path, data_config: dict, **extra) -> dict:
    return {
        "fingerprint": "0123456789abcdef",
        "output_root": str(tmp_path / "out" / "refresh"),
        "data_config": data_config,
        **extra,
    }


@pytest.mark.parametrize(
    "data_config",
    [
        {"publish": {"hf_conn_id": "huggingface_default", "require_approval": False}},
        {"gate": {}},
        {"tpu": {}},
        {"model": {"init_from": "/etc"}},
        {"corpus": {}, "train": {"steps": 10**9}},
    ],
)
def test_an_event_may_set_data_sections_only(tmp_path, monkeypatch, data_config):
    dep = _pinned(tmp_path, monkeypatch)
    with pytest.raises(ConfigError, match="an event may set only the data sections corpus, tokenizer, shards"):
        check_event(_event(tmp_path, data_config), dep)


def test_an_events_data_comes_under_the_deployment_whose_pins_hold(tmp_path, monkeypatch):
    dep = _pinned(tmp_path, monkeypatch)
    corpus = {"source": "local_files", "local_paths": [str(tmp_path / "corpora" / "*.txt")]}
    event = check_event(_event(tmp_path, {"corpus": corpus}), dep)
    cfg = run_config({"output_root": str(tmp_path / "out")}, dep, event)
    assert cfg.output_root == str(tmp_path / "out" / "refresh") and cfg.corpus.local_paths == corpus["local_paths"]
    assert (
        cfg.publish.hf_conn_id,
        cfg.publish.require_approval,
        cfg.gate.max_eval_loss,
        cfg.tpu.project,
        cfg.gcp_conn_id,
    ) == ("hf_team_restricted", True, 3.0, "team-project", "team_gcp")
    outside = check_event(_event(tmp_path, {"corpus": {"source": "local_files", "local_paths": ["/etc/*"]}}), dep)
    with pytest.raises(ConfigError, match="outside the folders this deployment lets runs read"):
        run_config({"output_root": str(tmp_path / "out")}, dep, outside)


def test_a_rest_made_event_is_refused_or_taken_as_a_form_by_the_deployments_choice(tmp_path, monkeypatch):
    rest = _event(tmp_path, {"corpus": {"source": "wiki_sample"}}, from_rest_api=True)
    with pytest.raises(ConfigError, match="made by the REST API, not by mlm_dataset_refresh"):
        check_event(rest, _pinned(tmp_path, monkeypatch), source_dag_id=None)
    with pytest.raises(ConfigError, match="made by DAG 'other', not by mlm_dataset_refresh"):
        check_event({**rest, "from_rest_api": False}, _pinned(tmp_path, monkeypatch), source_dag_id="other")
    with pytest.raises(ConfigError, match="not by mlm_dataset_refresh"):
        check_event(rest, None, source_dag_id=None)  # no deployment file: refused too
    as_form = _pinned(tmp_path, monkeypatch, "foreign_events: as_form")
    assert check_event(rest, as_form, source_dag_id=None) == rest
    with pytest.raises(ConfigError, match="may set only the data sections"):
        check_event({**rest, "data_config": {"gate": {}}}, as_form, source_dag_id=None)


@pytest.mark.parametrize("key", ["init_from", "overrides.corpus.hf_path", "overrides.downstream"])
def test_a_hub_or_folder_setting_reads_no_folder_outside_the_roots(tmp_path, monkeypatch, key):
    """datasets and transformers read a local folder when the string names one: /etc, a relative path
    that exists here (looks like owner/name), a file:// URI."""
    dep = _pinned(tmp_path, monkeypatch)
    secret = tmp_path / "airflow-auth" / "keys"
    secret.mkdir(parents=True)
    (secret / "keys.json").write_text('{"private_key": "not a real key"}\n')
    monkeypatch.chdir(tmp_path)
    out = str(tmp_path / "out")

    def params(value):
        if key == "init_from":
            return {"output_root": out, "init_from": value}
        if key == "overrides.corpus.hf_path":
            return {"output_root": out, "overrides": {"corpus.source": "hf_dataset", "corpus.hf_path": value}}
        return {
            "output_root": out,
            "overrides": {
                "downstream.tasks": [
                    {"name": "t", "source": "hf_dataset", "hf_path": value, "text_columns": ["private_key"]}
                ]
            },
        }

    for value in ("/etc", "airflow-auth/keys", f"file://{secret}", "./airflow-auth/keys", "gs://elsewhere/x"):
        with pytest.raises(ConfigError, match=r"is a path outside the folders this deployment lets runs read"):
            dep.run_config(params(value))
    with pytest.raises(ConfigError, match="neither a Hub repo id"):
        dep.run_config(params("owner/name/extra"))
    if key != "init_from":  # a Hub id loads (no network here: validate's own checks are another test's)
        assert dep.run_config(params("wikitext")) is not None


def test_a_pattern_is_judged_by_the_files_it_reaches_links_resolved(tmp_path, monkeypatch):
    dep = _pinned(tmp_path, monkeypatch)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "notes.txt").write_text("private\n")
    (tmp_path / "corpora" / "link").symlink_to(elsewhere)
    (tmp_path / "corpora" / "own").mkdir()
    (tmp_path / "corpora" / "own" / "notes.txt").write_text("ok\n")
    base = {"output_root": str(tmp_path / "out"), "corpus_source": "local_files"}
    with pytest.raises(ConfigError, match=r"reaches .*elsewhere/notes\.txt', outside .* \(through a link\?\)"):
        dep.run_config({**base, "local_paths": [str(tmp_path / "corpora" / "*" / "notes.txt")]})
    assert dep.run_config({**base, "local_paths": [str(tmp_path / "corpora" / "own" / "*.txt")]})


def test_a_file_uri_is_judged_as_the_absolute_path_it_is_used_as(tmp_path, monkeypatch):
    dep = _pinned(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path / "out")  # "etc" relative to here would be inside the root
    for root in ("file:///etc", f"file://{tmp_path}/elsewhere"):
        with pytest.raises(ConfigError, match="outside the roots this deployment allows"):
            dep.run_config({"output_root": root})
    assert dep.run_config({"output_root": f"file://{tmp_path}/out/a"}).output_root == f"file://{tmp_path}/out/a"


def test_the_deployments_limits_bound_what_a_run_spends(tmp_path, monkeypatch):
    dep = _pinned(
        tmp_path,
        monkeypatch,
        "limits: {max_ttl_hours: 48, max_train_hours: 24, max_batch_size: 256, "
        "max_steps: 100000, accelerator_types: [v4-8, v4-32]}",
    )
    monkeypatch.setenv("MLM_DEPLOYMENT", str(tmp_path / "pinned.yaml"))
    out = str(tmp_path / "out")
    assert dep.run_config({"output_root": out, "steps": 1000, "batch_size": 256})
    for overrides, message in [
        ({"train.batch_size": 257}, r"train\.batch_size 257 is over .*max_batch_size: 256"),
        ({"eval.batch_size": 1024}, r"eval\.batch_size 1024 is over"),
        ({"train.steps": 200_000}, r"train\.steps 200000 is over .*max_steps"),
        ({"train.timeout_hours": 30}, r"train\.timeout_hours 30 is over .*max_train_hours"),
        ({"train.budget_minutes": 24 * 60 + 1}, r"budget_minutes / 60 24\.0\d* is over"),
    ]:
        with pytest.raises(ConfigError, match=message):
            dep.run_config({"output_root": out, "overrides": overrides})


def test_publish_needs_a_recorded_approve_by_a_listed_approver(tmp_path, monkeypatch):
    from mlm_tasks.config.deployment import check_approval
    from mlm_tasks.errors import AuthError

    dep = _pinned(tmp_path, monkeypatch, "approvers: [{id: '1', name: admin}]")
    answer = {"chosen_options": ["Approve"], "params_input": {}, "responded_by_user": {"id": "1", "name": "admin"}}
    assert check_approval(answer, dep.approvers) == "Release approved by admin (id 1)."
    for approval, message in [
        (None, "recorded no answer for this run"),  # approve_release marked success by hand
        ({"chosen_options": ["Reject"], "responded_by_user": {"id": "1", "name": "admin"}}, "not Approve"),
        ({**answer, "responded_by_user": {"id": "3", "name": "user"}}, "user \\(id 3\\), who is not one of"),
    ]:
        with pytest.raises(AuthError, match=message):
            check_approval(approval, dep.approvers)
    assert check_approval({**answer, "responded_by_user": {"id": "3", "name": "user"}}, [])  # no list: any answer


def test_release_policy_is_the_deployments(tmp_path, monkeypatch):
    dep = _pinned(tmp_path, monkeypatch, "hub_namespaces: [ml-team]\n")
    out = str(tmp_path / "out")
    for overrides, message in [
        ({"publish.require_approval": False}, "publish.require_approval is a deployment"),
        ({"gate.max_eval_loss": 100.0}, "gate.max_eval_loss is a deployment setting"),
        ({"publish.releases_root": out}, "publish.releases_root is a deployment setting"),
        ({"publish.repo_id": "someone/x"}, "not under one of this deployment's Hub namespaces"),
        ({"publish.repo_id": "no-owner"}, "a Hub repo id is owner/name"),
    ]:
        with pytest.raises(ConfigError, match=message):
            dep.run_config({"output_root": out, "overrides": overrides})
    assert dep.run_config({"output_root": out, "hub_repo_id": "ml-team/roberta"}).publish.repo_id == "ml-team/roberta"


# What a user who may only trigger runs sent (issue 45), each through the one door of the validate task (the
# form's flat fields and the REST conf are both these params), and what the refusal names.
HOSTILE = {
    "billion-laughs": ({"config_file": "lol.yaml"}, r"lol\.yaml line 1: lol uses a YAML anchor or alias \(&l0\)"),
    "tpu-scalar-beside-dotted": (
        {"overrides": {"tpu": "x", "tpu.zone": "us-central2-b"}},
        r"Cannot set 'tpu\.zone': 'tpu' is set to 'x', not to a section",
    ),
    "train-scalar-beside-dotted": (
        {"overrides": {"train": 5, "train.steps": 3}},
        r"Cannot set 'train\.steps': 'train' is set to 5, not to a section",
    ),
    "form-field-then-scalar-section": (  # the form's steps is train.steps: set first, then train as a value
        {"steps": 2, "overrides": {"train": 5, "train.steps": 3}},
        r"Cannot set 'train' to 5: it is a section of settings \(\['steps'\]\)",
    ),
    "empty-segment-output-root": (
        {"output_root": "gs://team-bucket//mlm/x"},
        r"output_root 'gs://team-bucket//mlm/x' has an empty or '\.' path segment.*write gs://team-bucket/mlm/x\.",
    ),
    "dot-segment-shards": (
        {
            "corpus_source": "tfrecord_shards",
            "overrides": {
                "corpus.shards_uri": "gs://team-bucket/./mlm/s",
                "corpus.tokenizer_uri": "gs://team-bucket/t",
            },
        },
        r"corpus\.shards_uri 'gs://team-bucket/\./mlm/s' has an empty or '\.' path segment",
    ),
    "invalid-bucket": (
        {"output_root": "gs://Team_Bucket/mlm/x"},
        r"output_root 'gs://Team_Bucket/mlm/x': the bucket name 'Team_Bucket' is not a valid Cloud Storage bucket",
    ),
    "overrides-not-a-mapping": ({"overrides": "train.steps=3"}, r"overrides 'train\.steps=3' is not a mapping"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_what_a_hostile_triggerer_sends_is_refused_at_once_naming_the_key(case, deployment, tmp_path):
    import time

    params, message = HOSTILE[case]
    configs, out = tmp_path / "configs", tmp_path / "out"
    (configs / "lol.yaml").write_text(billion_laughs())
    assert 500 < len(billion_laughs()) < 600
    params = {"config_file": str(configs / "tiny.yaml"), "output_root": str(out / "run"), **params}
    params["config_file"] = str(configs / params["config_file"])
    for dep in (deployment, Deployment.builtin()):  # a deployment file's boundary, and the built-in one
        started = time.monotonic()
        with pytest.raises(ConfigError, match=message):
            run_config(params, dep)
        # A bound on a hang, not a timing (bench/ times things): the bomb, expanded, takes over 30 s; a refusal
        # before any expansion or I/O takes milliseconds, and a loaded CI machine's first imports seconds (3.9 s seen).
        assert time.monotonic() - started < 10.0, case
    assert list(out.iterdir()) == []  # nothing written


def test_the_cli_refuses_them_with_exit_2_and_no_traceback(tmp_path, capsys):
    from mlm_tasks.cli import main

    bomb = tmp_path / "lol.yaml"
    bomb.write_text(billion_laughs())
    assert main(["validate", "--config", str(bomb), "--set", f"output_root={tmp_path / 'out'}"]) == 2
    assert main(["validate", "--set", "output_root=gs://team-bucket//mlm/x"]) == 2
    err = capsys.readouterr().err
    assert "lol uses a YAML anchor or alias (&l0)" in err and "write gs://team-bucket/mlm/x" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_an_events_output_root_is_judged_as_written_too(deployment, tmp_path):
    """The third door (a dataset-refresh event) sets output_root: an empty segment is refused there as in a form."""
    extra = {"fingerprint": "0123456789abcdef", "output_root": "gs://team-bucket//mlm/x", "data_config": {}}
    with pytest.raises(ConfigError, match=r"output_root 'gs://team-bucket//mlm/x' has an empty or '\.' path segment"):
        run_config({"output_root": "gs://team-bucket/mlm/x"}, deployment, check_event(extra, deployment))
