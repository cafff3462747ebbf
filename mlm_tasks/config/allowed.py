"""What a run may reach under a deployment: where it writes and reads, its zone, its limits, its Hub owners.

dep.check_allowed(cfg)   # a ConfigError naming the setting and the deployment's bound it crosses"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, PrivateAttr

from mlm_tasks.config.section import Section
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import bucket_and_name, scheme
from mlm_tasks.storage import local_path

if TYPE_CHECKING:
    from mlm_tasks.config.pipeline import PipelineConfig

# Corpus settings that name local files or gs:// objects to read (of corpus and of each corpus.mixture source).
INPUT_KEYS = ("local_paths", "dump_path", "shards_uri", "tokenizer_uri")
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})?$")


class Limits(Section):
    """What one run may spend, whatever it asks for (check_allowed refuses more, naming the limit)."""

    max_ttl_hours: float | None = Field(None, gt=0, description="The most tpu.ttl_hours (the janitor's bound).")
    max_train_hours: float | None = Field(None, gt=0, description="The most train.timeout_hours, and budget.")
    accelerator_types: list[str] = Field(default_factory=list, description="tpu.accelerator_type values allowed.")
    max_batch_size: int | None = Field(None, ge=1, description="The most train.batch_size and eval.batch_size.")
    max_steps: int | None = Field(None, ge=1, description="The most train.steps.")


class Bounds(Section):
    """The deployment file's bounds on a run (`Deployment` adds its settings, approvers and events)."""

    source: str = Field("", description="The file these came from (for messages).")
    output_roots: list[str] = Field(default_factory=list, description="Where a run may write.")
    config_dirs: list[str] = Field(default_factory=list, description="Where config_file may come from.")
    input_roots: list[str] = Field(default_factory=list, description="Where local corpora and shards may come from.")
    zones: list[str] = Field(default_factory=list, description="The tpu.zone values a run may pick (empty: any).")
    limits: Limits = Field(default_factory=Limits, description="What one run may spend.")
    hub_namespaces: list[str] = Field(default_factory=list, description="Hub owners repo ids may name (empty: any).")

    # Set only by `Deployment.builtin()`, never by a file: no roots to check (there is no file to name them).
    _open_roots: bool = PrivateAttr(False)

    def check_allowed(self, cfg: PipelineConfig) -> None:
        """Where the run writes and reads, and its zone, within the deployment's limits."""
        if self._open_roots:
            return
        if not any(_under(cfg.output_root, r) for r in self.output_roots):
            raise ConfigError(
                f"output_root {cfg.output_root!r} is outside the roots this deployment allows "
                f"({self.output_roots}): use one of them or a folder under one."
            )
        releases = cfg.publish.releases_root
        if releases and _under(cfg.output_root, releases):  # a run's folders never lie among the baselines
            raise ConfigError(
                f"output_root {cfg.output_root!r} is inside the deployment's releases_root {releases!r} "
                "(the published models' baselines): use another folder."
            )
        # A mixture's sources read files and Hub datasets as corpus.* does: each is checked the same way.
        mixture = [(f"corpus.mixture[{i}]", s) for i, s in enumerate(cfg.corpus.mixture)]
        for where, corpus in [("corpus", cfg.corpus), *mixture]:
            for leaf in INPUT_KEYS:  # a mixture source has no shards_uri or tokenizer_uri
                self._check_input(f"{where}.{leaf}", getattr(corpus, leaf, None), glob=leaf == "local_paths")
            self._check_hub_or_path(f"{where}.hf_path", corpus.hf_path)  # datasets loads a Hub id or a folder
        self._check_hub_or_path("model.init_from", cfg.model.init_from)
        for i, task in enumerate(cfg.downstream.tasks):  # downstream task files are read like a corpus
            for key in ("train_file", "validation_file"):
                self._check_input(f"downstream.tasks[{i}].{key}", getattr(task, key), glob=False)
            self._check_hub_or_path(f"downstream.tasks[{i}].hf_path", task.hf_path)
        if self.zones and cfg.compute == "tpu_vm" and cfg.tpu.zone not in self.zones:
            raise ConfigError(f"tpu.zone {cfg.tpu.zone!r} is not one of this deployment's zones {self.zones}.")
        self._check_limits(cfg)
        for key in ("repo_id", "tokenizer_repo_id"):
            repo = getattr(cfg.publish, key)
            if repo and self.hub_namespaces and repo.split("/")[0] not in self.hub_namespaces:
                raise ConfigError(
                    f"publish.{key} {repo!r} is not under one of this deployment's Hub namespaces "
                    f"{self.hub_namespaces} (`hub_namespaces` in {self.source})."
                )

    def _check_input(self, key: str, values: Any, glob: bool) -> None:
        """Each value of a setting that names files to read under the roots; a `glob` pattern's matches too."""
        readable = [*self.input_roots, *self.output_roots]
        for value in values if isinstance(values, list) else [values]:
            if value and not any(_under(value, r) for r in readable):
                raise ConfigError(
                    f"{key} {value!r} is outside the folders this deployment lets runs read ({readable}): "
                    "put the data there."
                )
            for path in _expanded(value) if glob and value else []:
                if not any(_under(path, r) for r in readable):
                    raise ConfigError(
                        f"{key} {value!r} reaches {path!r}, outside the folders this deployment lets runs "
                        f"read ({readable}) (through a link?): put the data there."
                    )

    def _check_limits(self, cfg: PipelineConfig) -> None:
        lim, train = self.limits, cfg.train
        hours = train.timeout_hours if train.timeout_hours is not None or cfg.compute != "tpu_vm" else cfg.tpu.ttl_hours
        over = [
            ("tpu.ttl_hours", cfg.tpu.ttl_hours, lim.max_ttl_hours, "max_ttl_hours"),
            ("train.timeout_hours", hours, lim.max_train_hours, "max_train_hours"),
            ("train.budget_minutes / 60", (train.budget_minutes or 0) / 60, lim.max_train_hours, "max_train_hours"),
            ("train.batch_size", train.batch_size, lim.max_batch_size, "max_batch_size"),
            ("eval.batch_size", cfg.eval.batch_size, lim.max_batch_size, "max_batch_size"),
            ("train.steps", train.steps or 0, lim.max_steps, "max_steps"),
        ]
        for key, value, limit, name in over:
            if limit is not None and value is not None and value > limit:
                raise ConfigError(
                    f"{key} {value:g} is over this deployment's limit ({name}: {limit:g} in "
                    f"{self.source}, `limits`): ask for less, or ask whoever runs the deployment."
                )
        if lim.accelerator_types and cfg.compute == "tpu_vm" and cfg.tpu.accelerator_type not in lim.accelerator_types:
            raise ConfigError(
                f"tpu.accelerator_type {cfg.tpu.accelerator_type!r} is not one this deployment allows "
                f"({lim.accelerator_types}, `limits.accelerator_types` in {self.source})."
            )

    def _check_hub_or_path(self, key: str, value: str | None) -> None:
        """A Hub repo id, or a folder under the roots, judged as the loader reads it (an existing path from disk)."""
        if not value:
            return
        readable = [*self.input_roots, *self.output_roots]
        local = local_path(value)
        if scheme(value) == "gs" or value.startswith(("/", ".", "~", "file://")) or os.path.lexists(local):
            if not any(_under(value, r) for r in readable):
                raise ConfigError(
                    f"{key} {value!r} is a path outside the folders this deployment lets runs read "
                    f"({readable}): put it there, or give a Hub repo id (owner/name)."
                )
        elif not HUB_ID.match(value):
            raise ConfigError(
                f"{key} {value!r} is neither a Hub repo id (owner/name: letters, digits, '-', '_', '.') "
                "nor a folder under the deployment's roots: fix it."
            )


def _expanded(pattern: str) -> list[str]:
    """The real paths a local pattern matches; the pattern itself when it matches nothing yet."""
    import glob

    if scheme(pattern) == "gs":
        return [pattern]
    local = os.path.expanduser(local_path(pattern))
    found = glob.glob(local, recursive=True)
    return [os.path.realpath(p) for p in found] or [local]


def under_local(real: str, root: str) -> bool:
    root = os.path.realpath(root)
    return real == root or real.startswith(root.rstrip("/") + "/")


def _under(uri: str, root: str) -> bool:
    """Is `uri` the root or inside it? gs:// by normalised path (`..` never climbs out); local by real path."""
    if "gs" in (scheme(uri), scheme(root)):
        if scheme(uri) != scheme(root) or "/../" in f"{uri}/":
            return False
        path, top = (posixpath.normpath("/".join(bucket_and_name(u))) for u in (uri, root))
        return path == top or path.startswith(top + "/")
    return under_local(
        os.path.realpath(str(Path(local_path(uri)).expanduser())), str(Path(local_path(root)).expanduser())
    )
