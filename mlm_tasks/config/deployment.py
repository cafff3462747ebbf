"""Two kinds of settings: what the deployment sets (`DeploymentOnly` marks, the file's `settings`), and what a
run may set; a run that sets a deployment setting is refused, naming the key (docs/security.md).

    dep = Deployment.load()              # $MLM_DEPLOYMENT (a YAML file), or None: no boundary
    cfg = run_config(params, dep, extra)  # the one door: form, conf and event in, the deployment last"""

from __future__ import annotations

import os
import re
import stat
from typing import Any, Literal

from pydantic import Field, ValidationError

from mlm_tasks.config import loading
from mlm_tasks.config.allowed import Bounds, under_local
from mlm_tasks.config.pipeline import PipelineConfig
from mlm_tasks.config.section import Section, deployment_keys, leaves
from mlm_tasks.config.tpu import TpuConfig
from mlm_tasks.errors import AuthError, ConfigError
from mlm_tasks.paths import scheme

ENV = "MLM_DEPLOYMENT"
# Settings that reach a credential, a shell, an endpoint or a machine: marked `DeploymentOnly` in the schema.
DEPLOYMENT_KEYS = deployment_keys(PipelineConfig)
SECTIONS = {name.split(".")[0] for name, _ in leaves(PipelineConfig) if "." in name}  # tpu, train, ...
# What a dataset-refresh event may set (the sections mlm_dataset_refresh sends), and who may send one.
DATA_SECTIONS = ("corpus", "tokenizer", "shards", "dedup")
REFRESH_DAG = "mlm_dataset_refresh"


class Approver(Section):
    """An Airflow user who may answer approve_release: the auth manager's user id (FAB: Security > List Users)."""

    id: str = Field(min_length=1, max_length=200)
    name: str = Field(min_length=1, max_length=200)


class Deployment(Bounds):
    settings: dict[str, Any] = Field(default_factory=dict, description="Deployment settings for every run.")
    approvers: list[Approver] = Field(default_factory=list, description="Who may approve a release (empty: no check).")
    foreign_events: Literal["refuse", "as_form"] = Field("refuse", description="Shards events from elsewhere.")

    @classmethod
    def for_airflow(cls) -> Deployment:
        """What every Airflow task judges a run by: the deployment file, else the built-in boundary."""
        return cls.load() or cls.builtin()

    @classmethod
    def builtin(cls) -> Deployment:
        """DEPLOYMENT_KEYS refused from every trigger; roots, zones and limits open (no file names them)."""
        dep = cls(source="the built-in boundary (no deployment file: MLM_DEPLOYMENT is unset)")
        dep._open_roots = True
        return dep

    @classmethod
    def load(cls, path: str | None = None) -> Deployment | None:
        path = path or os.environ.get(ENV)
        if not path:
            return None
        tree = _expand(loading.read_yaml_config(path))
        unset = sorted(set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", repr(tree))))
        if unset:
            raise ConfigError(
                f"The deployment file {path} uses {', '.join(unset)}, which this service's environment "
                "does not set: set them (.env) or write the values into the file."
            )
        # An empty root (${VAR} set to nothing) allows nothing; a local entry may be `:`-separated folders.
        for key in ("output_roots", "config_dirs", "input_roots", "zones"):
            if isinstance(tree.get(key), list):
                parts = ([v] if scheme(v) == "gs" else v.split(":") for v in tree[key] if isinstance(v, str))
                tree[key] = [part for entry in parts for part in entry if part]
        try:
            dep = cls.model_validate({**tree, "source": str(path)})
        except ValidationError as exc:  # the keys by name, not a traceback
            wrong = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ConfigError(
                f'The deployment file {path} is not valid ({wrong}): fix it (docs/security.md, "Security model").'
            ) from None
        loading.build_config(dep.settings)  # a typo in the deployment's own settings fails here, naming it
        return dep

    def owned_keys(self) -> list[str]:
        return sorted({*DEPLOYMENT_KEYS, *_dotted(self.settings)})

    def run_config(self, params: dict[str, Any]) -> PipelineConfig:
        """The run's config from trigger params, refusing what a run may not set; the deployment's on top."""
        config_file, settings = loading.split_params(params)
        run = {loading.PARAM_PATHS.get(k, k): v for k, v in settings.items()}
        self.refuse_owned(run, "the trigger's settings")
        base = loading.read_yaml_config(self.check_config_file(config_file)) if config_file else {}
        cfg = loading.build_config(loading.merge(base, loading.nested(run)), _dotted(self.settings))
        self.check_allowed(cfg)
        return cfg

    def refuse_owned(self, run: dict[str, Any], where: str) -> None:
        owned = self.owned_keys()
        for key in _dotted(loading.nested(run)):
            hit = next((d for d in owned if key == d or key.startswith(d + ".") or d.startswith(key + ".")), None)
            if hit and self._open_roots:
                raise ConfigError(
                    f"{hit} is a deployment setting: {where} may not set it ({self.source}; it comes from its default "
                    "and the services' environment). Remove it from the run; to set it, write a deployment file "
                    f"(`settings`, docs/security.md) and point {ENV} at it in every Airflow service."
                )
            if hit:
                raise ConfigError(
                    f"{hit} is a deployment setting: {where} may not set it (the deployment sets it in {self.source}, "
                    "`settings`). Remove it from the run, or ask whoever runs the deployment to change it there."
                )

    def check_config_file(self, path: str) -> str:
        real = os.path.realpath(path)
        if not self._open_roots and not any(under_local(real, d) for d in self.config_dirs):
            raise ConfigError(
                f"config_file {path!r} is outside the deployment's config folders "
                f"{self.config_dirs}: pick a file there (the form's default is one)."
            )
        try:
            info = os.stat(real)
        except FileNotFoundError:
            raise ConfigError(f"Config file {path} does not exist: pick one in {self.config_dirs}.") from None
        if not stat.S_ISREG(info.st_mode) or info.st_size > loading.MAX_CONFIG_BYTES:
            raise ConfigError(
                f"config_file {path!r} is not a regular file of at most {loading.MAX_CONFIG_BYTES} bytes: "
                "pick a YAML config file."
            )
        return real


def run_config(params: dict[str, Any], dep: Deployment | None, event: dict[str, Any] | None = None) -> PipelineConfig:
    """The one door of a run's settings: the trigger's params, a checked refresh event's data sections and
    output_root (`check_event`), then the deployment's settings and limits."""
    cfg = dep.run_config(params) if dep else loading.config_from_params(params)
    if event is None:
        return cfg
    tree = {**cfg.model_dump(mode="json"), **event["data_config"], "output_root": event["output_root"]}
    cfg = loading.build_config(tree, _dotted(dep.settings) if dep else None)
    if dep:
        dep.check_allowed(cfg)
    return cfg


def check_event(
    extra: dict[str, Any], dep: Deployment | None, source_dag_id: str | None = REFRESH_DAG
) -> dict[str, Any]:
    """A dataset-refresh event's extra, checked like a form: from mlm_dataset_refresh (or foreign_events: as_form),
    a fingerprint, data sections only, and those run settings."""
    foreign = bool(extra.get("from_rest_api")) or source_dag_id != REFRESH_DAG
    if foreign and (dep is None or dep.foreign_events == "refuse"):
        made_by = "the REST API" if extra.get("from_rest_api") else f"DAG {source_dag_id!r}"
        raise ConfigError(
            f"The shards event that triggered this run was made by {made_by}, not by {REFRESH_DAG}: this deployment "
            "takes only the refresh DAG's events. Trigger the run from the form instead (corpus.source=tfrecord_shards "
            "for shards built elsewhere), or set foreign_events: as_form in the deployment file."
        )
    fingerprint = extra.get("fingerprint")
    if not isinstance(fingerprint, str) or not re.fullmatch(r"[0-9a-f]{16}", fingerprint):
        raise ConfigError(
            f"The dataset-refresh event's fingerprint {fingerprint!r} is not 16 hex digits: the "
            "event was not written by mlm_dataset_refresh. Trigger the run by hand."
        )
    data = extra.get("data_config")
    if not isinstance(data, dict) or not isinstance(extra.get("output_root"), str):
        raise ConfigError(
            "The dataset-refresh event carries no data settings or output_root: it was not written "
            "by mlm_dataset_refresh. Trigger the run by hand."
        )
    other = sorted(set(data) - set(DATA_SECTIONS))
    if other:
        raise ConfigError(
            f"The dataset-refresh event sets {', '.join(other)}: an event may set only the data sections "
            f"{', '.join(DATA_SECTIONS)} (what {REFRESH_DAG} sends). Trigger the run by hand to change anything else."
        )
    if any(not isinstance(data[k], dict) for k in data):
        raise ConfigError(
            "The dataset-refresh event's data sections are not mappings of settings: it was not "
            f"written by {REFRESH_DAG}. Trigger the run by hand."
        )
    if dep is not None:
        dep.refuse_owned({"output_root": extra["output_root"], **data}, "a dataset-refresh event")
    return extra


def janitor_api(dep: Deployment | None = None) -> tuple[TpuConfig, str]:
    """The janitor's TPU API settings and GCP connection id: the deployment file's `settings` (`dep`, default:
    MLM_DEPLOYMENT's), else the environment (MLM_TPU_PROJECT, ...). No project is an error, not a green skip."""
    dep = dep if dep is not None else Deployment.load()
    settings = dep.settings if dep else {}
    tpu = settings.get("tpu", {})
    project = tpu.get("project") or os.environ.get("MLM_TPU_PROJECT", "")
    if not project:
        raise ConfigError(
            "The janitor has no project to check: set MLM_TPU_PROJECT (and MLM_TPU_ZONES) in "
            "the environment of the Airflow services, or tpu.project in the deployment file."
        )
    api = TpuConfig(
        project=project,
        transport=tpu.get("transport") or os.environ.get("MLM_TPU_TRANSPORT", "grpc"),
        api_endpoint=tpu.get("api_endpoint") or os.environ.get("MLM_TPU_API_ENDPOINT") or None,
    )
    return api, settings.get("gcp_conn_id") or os.environ.get("MLM_GCP_CONN_ID", "google_cloud_default")


def check_approval(approval: Any, approvers: list[Approver]) -> str:
    """Who approved, from approve_release's recorded HITL answer; an AuthError when there is none, it is not
    "Approve", or the approver is not listed."""
    if not isinstance(approval, dict) or "chosen_options" not in approval:
        raise AuthError(
            "publish.require_approval is set, but approve_release recorded no answer for this run (it was "
            "skipped, or marked done by hand): nothing is published. Clear approve_release so that an "
            "approver answers it in Required actions."
        )
    chosen = list(approval.get("chosen_options") or [])
    user = approval.get("responded_by_user") or {}
    who = f"{user.get('name') or '?'} (id {user.get('id') or '?'})"
    if chosen != ["Approve"]:
        raise AuthError(f"approve_release's recorded answer is {chosen} by {who}, not Approve: nothing is published.")
    if approvers and str(user.get("id")) not in {a.id for a in approvers}:
        raise AuthError(
            f"The release was approved by {who}, who is not one of this deployment's approvers "
            f"({', '.join(a.name for a in approvers)}): nothing is published. Ask one of them."
        )
    return f"Release approved by {who}."


def _expand(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _expand(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v) for v in value]
    return os.path.expandvars(value) if isinstance(value, str) else value


def _dotted(tree: dict[str, Any]) -> dict[str, Any]:
    """{dotted path: value} of the settings a tree sets; a dict-valued setting (tpu.env) is one leaf."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if key in SECTIONS and isinstance(value, dict):
            out.update({f"{key}.{leaf}": v for leaf, v in value.items()})
        else:
            out[key] = value
    return out
