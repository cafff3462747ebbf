"""The base of every settings section, and the mark of the settings only the deployment may set:
`project: DeploymentOnly[str] = Field("", description="...")` in a `Section`."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from typing import Annotated, TypeVar

from pydantic import BaseModel, ConfigDict
from pydantic.fields import FieldInfo

T = TypeVar("T")


# A setting that reaches a credential, a shell, an endpoint or a machine: no run may set it.
DEPLOYMENT_MARK = object()
DeploymentOnly = Annotated[T, DEPLOYMENT_MARK]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def leaves(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """(dotted name, field) of every setting under `model`; a list of sections' entries read `name[].leaf`."""
    for name, field in model.model_fields.items():
        inner, suffix = field.annotation, ""
        if typing.get_origin(inner) is list:
            inner, suffix = typing.get_args(inner)[0], "[]"
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            yield from leaves(inner, f"{prefix}{name}{suffix}.")
        else:
            yield f"{prefix}{name}", field


def deployment_keys(model: type[BaseModel]) -> tuple[str, ...]:
    """The dotted names of the settings marked `DeploymentOnly`."""
    return tuple(name for name, field in leaves(model) if DEPLOYMENT_MARK in field.metadata)
