"""The launch spec (``launch.json``): the operator's instructions to the launcher in every Ray pod.

The operator builds a :class:`LaunchSpec` per VerlJob attempt and writes :meth:`LaunchSpec.to_json` into the
ConfigMap ``<job>-launch``; the launcher reads the mounted file with :meth:`LaunchSpec.model_validate`. The
fields, their JSON names and their bounds are docs/launch-contract.md's table. Unknown keys are kept, not
refused (an operator newer than the launcher image may add fields), and listed by :func:`unknown_fields`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

API_VERSION: Final = "verl-operator.io/v1alpha1"
KIND: Final = "LaunchSpec"
#: Where the spec is mounted in every Ray pod: the ConfigMap key ``LAUNCH_KEY`` in the directory ``LAUNCH_DIR``.
LAUNCH_DIR = "/etc/verl-operator"
LAUNCH_KEY = "launch.json"
LAUNCH_PATH = f"{LAUNCH_DIR}/{LAUNCH_KEY}"
#: The pod's environment (set by the operator): the spec's path, ``head`` or ``worker``, the 0-based attempt.
LAUNCH_SPEC_ENV = "VERL_LAUNCH_SPEC"
ROLE_ENV = "VERL_OPERATOR_ROLE"
ATTEMPT_ENV = "VERL_OPERATOR_ATTEMPT"
#: Ray's ports on the head pod: the GCS (``ray start --port``) and the dashboard (jobs API).
RAY_GCS_PORT = 6379
RAY_DASHBOARD_PORT = 8265
#: Bootstrap deadlines (seconds) when the spec gives none.
CLUSTER_READY_SECONDS = 600
WORKER_JOIN_SECONDS = 600

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: A dotted Python module name (``verl.trainer.main_ppo``): what ``python3 -m`` runs. The VerlJob's
#: ``spec.verl.entrypoint`` has the same pattern (one definition, the API models import it).
MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
_MODULE = re.compile(MODULE_PATTERN)
#: verl's PPO trainer, the module a job runs unless its spec names another.
DEFAULT_MODULE = "verl.trainer.main_ppo"
# Hydra override grammar, the part that matters here: `key=value`, `+key=value`, `++key=value`, `~key`.
_OVERRIDE = re.compile(r"^(\+{1,2}|~)?[A-Za-z_][\w.\-/@]*(=.*)?$", re.DOTALL)


class _Part(BaseModel):
    """A part of the document: immutable, camelCase in JSON (snake_case accepted too), unknown keys kept."""

    model_config = ConfigDict(frozen=True, extra="allow", alias_generator=to_camel, populate_by_name=True)


class JobRef(_Part):
    """The VerlJob this spec was made for (for messages)."""

    name: str = Field(min_length=1)
    namespace: str = Field(min_length=1)
    uid: str = ""


class HeadAddress(_Part):
    """Where the workers find the Ray head (the head pod's stable DNS name)."""

    host: str = Field(min_length=1)
    port: int = Field(default=RAY_GCS_PORT, ge=1, le=65535)
    dashboard_port: int = Field(default=RAY_DASHBOARD_PORT, ge=1, le=65535)


class Expect(_Part):
    """What the plan assumed about every node's GPUs; the head checks each node's probe against it."""

    #: GPU Feature Discovery spelling of the plan's node pool; None: not checked.
    gpu_product: str | None = None
    #: ``memory.total`` per GPU of the plan's node pool; None: not checked.
    gpu_memory_mib: int | None = Field(
        default=None, validation_alias="gpuMemoryMiB", serialization_alias="gpuMemoryMiB", gt=0
    )
    require_nvlink: bool = False
    #: When ``require_nvlink``: every aligned group of this many consecutive GPUs of a node is NVLink-connected.
    nvlink_group_size: int = Field(default=1, ge=1)


class Checkpoint(_Part):
    """Where verl keeps checkpoints, and whether a first attempt resumes from them."""

    dir: str | None = None
    resume: bool = False

    @field_validator("dir")
    @classmethod
    def _not_empty(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or "\x00" in value):
            raise ValueError("must be a path (or null), got an empty string")
        return value


class Timeouts(_Part):
    """Deadlines of the bootstrap phases, in seconds (an integral value stays an integer in JSON)."""

    cluster_ready_seconds: int | float = Field(default=CLUSTER_READY_SECONDS, gt=0)
    worker_join_seconds: int | float = Field(default=WORKER_JOIN_SECONDS, gt=0)


class LaunchSpec(_Part):
    """The operator's instructions to the launcher (one per VerlJob attempt)."""

    api_version: Literal["verl-operator.io/v1alpha1"]
    kind: Literal["LaunchSpec"]
    job: JobRef
    #: The verl dialect the overrides were written for (``0.6``, ``0.9``).
    verl_version: str = Field(pattern=r"^\d+\.\d+(\.\d+)?$")
    #: Ray nodes (pods) of the job, head included.
    nnodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    head: HeadAddress
    #: verl's command, run as an argv list; ``overrides`` are appended in order. The module after ``-m``
    #: (``spec.verl.entrypoint``, e.g. ``python3 -m verl.trainer.main_ppo``) is a dotted Python module name.
    entrypoint: tuple[str, ...] = Field(min_length=1)
    overrides: tuple[str, ...] = ()
    #: Environment for Ray and verl; never replaces a variable already set in the pod.
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
            if index > 0 and value[index - 1] == "-m" and not _MODULE.match(item):
                raise ValueError(
                    f"item {index} {item!r} after -m is not a dotted Python module name "
                    "(letters, digits and underscores, separated by dots: verl.trainer.main_ppo)"
                )
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
    def module(self) -> str | None:
        """The Python module ``entrypoint`` runs (the item after ``-m``), or None for another command."""
        items = self.entrypoint
        return next((items[i + 1] for i in range(len(items) - 1) if items[i] == "-m"), None)

    @property
    def total_gpus(self) -> int:
        """GPUs the whole Ray cluster must register: ``nnodes * gpusPerNode``."""
        return self.nnodes * self.gpus_per_node

    def to_document(self) -> dict[str, Any]:
        """The JSON document (camelCase keys, every field written, nulls included)."""
        return self.model_dump(mode="json", by_alias=True)

    def to_json(self) -> str:
        """``launch.json``'s text: the document with sorted keys, indented, a final newline (stable bytes)."""
        return json.dumps(self.to_document(), indent=2, sort_keys=True) + "\n"


def unknown_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """The keys of a parsed document that this model does not know (dotted camelCase paths, sorted).

    Args:
        model: A parsed spec (or a part of it).
        prefix: The path of ``model`` inside the document.
    """
    found = [f"{prefix}{key}" for key in (model.model_extra or {})]
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            found.extend(unknown_fields(value, f"{prefix}{info.alias or name}."))
    return sorted(found)
