"""The launch spec: the JSON the operator mounts into every Ray pod (``launch.json``).

The format is fixed by the launch contract (docs/launch-contract.md). It is parsed here with the launcher's
own models so that the launcher does not depend on the operator's code. Unknown keys are tolerated (an
operator newer than the launcher image may add fields) and reported by :func:`unknown_fields`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from verl_launcher.exits import ExitCode, LauncherError

#: Environment variable holding the path of the launch spec.
LAUNCH_SPEC_ENV = "VERL_LAUNCH_SPEC"
#: Where the operator mounts the spec when the variable is not set.
DEFAULT_LAUNCH_SPEC = "/etc/verl-operator/launch.json"

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Hydra override grammar, the part that matters here: `key=value`, `+key=value`, `++key=value`, `~key`.
_OVERRIDE = re.compile(r"^(\+{1,2}|~)?[A-Za-z_][\w.\-/@]*(=.*)?$", re.DOTALL)


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True,
        extra="allow",
        alias_generator=to_camel,
        populate_by_name=True,
    )


class JobRef(_Model):
    """The VerlJob this spec was made for."""

    name: str = Field(min_length=1)
    namespace: str = Field(min_length=1)
    uid: str = ""


class HeadAddress(_Model):
    """Where the workers find the Ray head (the head pod's stable DNS name)."""

    host: str = Field(min_length=1)
    port: int = Field(default=6379, ge=1, le=65535)
    dashboard_port: int = Field(default=8265, ge=1, le=65535)


class Expect(_Model):
    """What the plan assumed about every node's GPUs; the head checks each node's probe against it."""

    gpu_product: str | None = None
    gpu_memory_mib: int | None = Field(default=None, alias="gpuMemoryMiB", gt=0)
    require_nvlink: bool = False
    nvlink_group_size: int = Field(default=1, ge=1)


class Checkpoint(_Model):
    """Where verl keeps checkpoints, and whether a fresh start should resume from them."""

    dir: str | None = None
    resume: bool = False

    @field_validator("dir")
    @classmethod
    def _not_empty(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or "\x00" in value):
            raise ValueError("must be a path (or null), got an empty string")
        return value


class Timeouts(_Model):
    """Deadlines of the bootstrap phases, in seconds."""

    cluster_ready_seconds: float = Field(default=600, gt=0)
    worker_join_seconds: float = Field(default=600, gt=0)


class LaunchSpec(_Model):
    """The operator's instructions to the launcher (one per VerlJob attempt)."""

    api_version: Literal["verl-operator.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["LaunchSpec"]
    job: JobRef
    verl_version: str = Field(pattern=r"^\d+\.\d+(\.\d+)?$")
    nnodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    head: HeadAddress
    entrypoint: tuple[str, ...] = Field(min_length=1)
    overrides: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    expect: Expect = Field(default_factory=Expect)
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    timeouts: Timeouts = Field(default_factory=Timeouts)

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for index, item in enumerate(value):
            if not item or "\x00" in item:
                raise ValueError(f"item {index} is empty or holds a NUL byte")
        return value

    @field_validator("overrides")
    @classmethod
    def _overrides(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for index, item in enumerate(value):
            if "\x00" in item or not _OVERRIDE.match(item):
                raise ValueError(
                    f"item {index} {item!r} is not a Hydra override (key=value, +key=value, ++key=value or ~key)"
                )
            if not item.startswith("~") and "=" not in item:
                raise ValueError(f"item {index} {item!r} has no '=': write key=value")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
            if "\x00" in text:
                raise ValueError(f"the value of {name} holds a NUL byte")
        return value

    @property
    def total_gpus(self) -> int:
        """GPUs the whole Ray cluster must register: ``nnodes * gpusPerNode``."""
        return self.nnodes * self.gpus_per_node


def _field_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts) or "(root)"


def format_validation_error(source: str, error: ValidationError) -> str:
    """Render a pydantic error as ``<source>: field `a.b`: problem; ...`` naming every bad field.

    Args:
        source: Where the spec came from (a path), shown first.
        error: The validation error.

    Returns:
        One line naming each failing field and its problem.
    """
    problems = [f"field `{_field_path(tuple(e['loc']))}`: {e['msg']}" for e in error.errors()]
    return f"invalid launch spec {source}: " + "; ".join(problems)


def parse_launch_spec(data: Any, source: str = "launch.json") -> LaunchSpec:
    """Validate decoded JSON as a launch spec.

    Args:
        data: The decoded JSON document.
        source: A name for messages (usually the file path).

    Returns:
        The validated spec.

    Raises:
        LauncherError: With ``INVALID_LAUNCH_SPEC``, naming every bad field.
    """
    if not isinstance(data, dict):
        raise LauncherError(
            ExitCode.INVALID_LAUNCH_SPEC,
            f"invalid launch spec {source}: the document must be a JSON object, got {type(data).__name__}",
        )
    try:
        return LaunchSpec.model_validate(data)
    except ValidationError as exc:
        raise LauncherError(ExitCode.INVALID_LAUNCH_SPEC, format_validation_error(source, exc)) from exc


def load_launch_spec(path: str | Path) -> LaunchSpec:
    """Read and validate the launch spec file.

    Args:
        path: The JSON file (normally ``$VERL_LAUNCH_SPEC``).

    Returns:
        The validated spec.

    Raises:
        LauncherError: With ``INVALID_LAUNCH_SPEC`` when the file is missing, not JSON, or invalid.
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise LauncherError(
            ExitCode.INVALID_LAUNCH_SPEC, f"cannot read the launch spec {source}: {exc.strerror or exc}"
        ) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LauncherError(
            ExitCode.INVALID_LAUNCH_SPEC,
            f"invalid launch spec {source}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
        ) from exc
    return parse_launch_spec(data, source)


def unknown_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """List the keys of the document that the launcher does not know (dotted paths, camelCase).

    Args:
        model: A parsed spec (or a part of it).
        prefix: The path of ``model`` inside the document.

    Returns:
        Dotted paths of the unknown keys, sorted.
    """
    found = [f"{prefix}{key}" for key in (model.model_extra or {})]
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            found.extend(unknown_fields(value, f"{prefix}{info.alias or name}."))
    return sorted(found)
