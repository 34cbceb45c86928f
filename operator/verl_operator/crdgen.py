"""Generate the VerlJob CustomResourceDefinition from the pydantic models (the single source of truth).

The pydantic JSON schema is turned into a Kubernetes *structural* schema: ``$ref`` inlined, ``Optional``
unwrapped (omitted means "the planner decides"), ``const`` turned into ``enum``, JSON-Schema-2020
``exclusiveMinimum`` into the OpenAPI v3 boolean form, defaults moved into the descriptions (the API server
must not fill in values that the planner decides), free-form Kubernetes objects marked
``x-kubernetes-preserve-unknown-fields``. Static cross-field rules become CEL ``x-kubernetes-validations``.
"""

from __future__ import annotations

from typing import Any

import yaml

from verl_operator.api.spec import GROUP, KIND, PLURAL, VERSION, VerlJobSpec
from verl_operator.api.status import ACTIVE_PHASES, FINISHED_PHASES, PHASES, VerlJobStatus
from verl_operator.manifests.names import MAX_JOB_NAME

CRD_PATH = "crds/verl-operator.io_verljobs.yaml"
CHART_CRD_PATH = "charts/verl-operator/crds/verl-operator.io_verljobs.yaml"
REGENERATE = "make crds"
HEADER = (
    "# Generated from verl_operator.api by `verl-operator crd`: do not edit.\n"
    f"# Regenerate with: {REGENERATE}\n"
)

#: Cross-field rules the API server checks itself (CEL); the webhook and the planner check the rest.
SPEC_RULES: tuple[dict[str, str], ...] = (
    {
        "rule": "!has(self.rollout) || !has(self.rollout.mode) || self.rollout.mode != 'spmd' || "
        "(has(self.verl.version) && self.verl.version == '0.6')",
        "message": "spec.rollout.mode spmd exists only with spec.verl.version 0.6 (verl 0.7+ removed it)",
        "fieldPath": ".rollout.mode",
    },
    {
        "rule": "!has(self.rollout) || !has(self.rollout.tensorParallelSize) || "
        "self.resources.gpus % self.rollout.tensorParallelSize == 0",
        "message": "spec.rollout.tensorParallelSize must divide spec.resources.gpus",
        "fieldPath": ".rollout.tensorParallelSize",
    },
    {
        "rule": "!has(self.parallelism) || !has(self.parallelism.sequenceParallelSize) || "
        "self.resources.gpus % self.parallelism.sequenceParallelSize == 0",
        "message": "spec.parallelism.sequenceParallelSize must divide spec.resources.gpus",
        "fieldPath": ".parallelism.sequenceParallelSize",
    },
)
RESOURCES_RULES: tuple[dict[str, str], ...] = (
    {
        "rule": "!has(self.gpusPerNode) || self.gpus % self.gpusPerNode == 0",
        "message": "spec.resources.gpusPerNode must divide spec.resources.gpus",
        "fieldPath": ".gpusPerNode",
    },
)
PLACEMENT_RULES: tuple[dict[str, str], ...] = (
    {
        "rule": "!has(self.topologyPolicy) || has(self.topologyKey)",
        "message": "spec.placement.topologyPolicy needs spec.placement.topologyKey",
        "fieldPath": ".topologyPolicy",
    },
)
ROOT_RULES: tuple[dict[str, str], ...] = (
    {
        "rule": f"size(self.metadata.name) <= {MAX_JOB_NAME}",
        "message": f"metadata.name must be at most {MAX_JOB_NAME} characters (child names are DNS labels)",
    },
)

#: Spec fields that may change while the job is Starting or Running; they take effect at once (suspend deletes
#: the pods, the rest are read at each reconcile pass). Every other field is immutable then.
MUTABLE_WHILE_RUNNING = frozenset(
    {"suspend", "backoffLimit", "activeDeadlineSeconds", "startDeadlineSeconds", "ttlSecondsAfterFinished"}
)


#: Spec fields that may change after the job finished (Succeeded or Failed): when to delete it. Nothing else
#: would take effect (a finished job never plans or starts again), so any other change is refused.
MUTABLE_WHEN_FINISHED = frozenset({"ttlSecondsAfterFinished"})


def _same(field: str) -> str:
    """CEL: ``spec.<field>`` is unchanged (set to the same value, or unset in both)."""
    return (
        f"(has(self.spec.{field}) ? has(oldSelf.spec.{field}) && self.spec.{field} == oldSelf.spec.{field} "
        f": !has(oldSelf.spec.{field}))"
    )


def finished_field_rules() -> tuple[dict[str, str], ...]:
    """CEL transition rules (on the root, which sees the old status) that refuse a spec change of a finished
    job: it would be stored and never acted on (the API server has no other way to say so at apply)."""
    finished = ", ".join(f"'{p}'" for p in sorted(FINISHED_PHASES, key=PHASES.index))
    guard = f"!has(oldSelf.status) || !has(oldSelf.status.phase) || !(oldSelf.status.phase in [{finished}])"
    rules = []
    for field in VerlJobSpec.model_json_schema(by_alias=True)["properties"]:
        if field in MUTABLE_WHEN_FINISHED:
            continue
        rules.append(
            {
                "rule": f"{guard} || {_same(field)}",
                "message": (
                    f"spec.{field} cannot change after the job finished (Succeeded or Failed): a finished job "
                    "never runs again; create a new job (or delete and recreate this one)"
                ),
                "fieldPath": f".spec.{field}",
            }
        )
    return tuple(rules)


def immutable_field_rules() -> tuple[dict[str, str], ...]:
    """CEL transition rules (on the root) that keep the pod-shaping spec fields fixed while the job runs.

    A field may still change in the update that sets ``suspend: true`` (or any later one): the pods are
    deleted, and resuming plans the new spec and restarts from the last checkpoint.
    """
    active = ", ".join(f"'{p}'" for p in sorted(ACTIVE_PHASES, key=PHASES.index))
    guard = (
        f"!has(oldSelf.status) || !has(oldSelf.status.phase) || !(oldSelf.status.phase in [{active}]) || "
        "(has(self.spec.suspend) && self.spec.suspend)"
    )
    rules = []
    for field in VerlJobSpec.model_json_schema(by_alias=True)["properties"]:
        if field in MUTABLE_WHILE_RUNNING:
            continue
        same = _same(field)
        rules.append(
            {
                "rule": f"{guard} || {same}",
                "message": (
                    f"spec.{field} cannot change while the job is Starting or Running: set spec.suspend: true "
                    "(in the same or an earlier update; resuming plans the new spec and restarts from the last "
                    "checkpoint), or delete and recreate the job"
                ),
                "fieldPath": f".spec.{field}",
            }
        )
    return tuple(rules)


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in schema:
        target = dict(defs[schema["$ref"].rsplit("/", 1)[-1]])
        extra = {k: v for k, v in schema.items() if k != "$ref"}
        return _resolve({**target, **extra}, defs)
    if "anyOf" in schema:
        options = [o for o in schema["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"unsupported union in schema: {schema}")
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        return _resolve({**options[0], **rest}, defs)
    return schema


def structural(schema: dict[str, Any], defs: dict[str, Any], where: str = "spec") -> dict[str, Any]:
    """Convert one pydantic JSON schema node to a structural OpenAPI v3 schema node.

    A little over 60 lines: one branch per JSON-schema construct (const, object, array, scalar), kept together
    as the one conversion table.

    Args:
        schema: The JSON schema node.
        defs: The ``$defs`` of the root schema.
        where: Dotted path for error messages and descriptions.

    Returns:
        The structural schema node.

    Raises:
        ValueError: A schema construct the CRD cannot express.
    """
    node = _resolve(dict(schema), defs)
    out: dict[str, Any] = {}
    # A model's docstring: its first paragraph (an "Attributes:" section repeats the field descriptions).
    description = str(node.get("description") or node.get("title") or where).split("\n\n")[0]
    if "default" in node and node["default"] not in (None, [], {}, ""):
        description = f"{description} Default: {node['default']}."
    out["description"] = description
    out.update({k: v for k, v in node.items() if k.startswith("x-kubernetes-")})
    kind = node.get("type")
    if "const" in node:
        out["type"] = kind or "string"
        out["enum"] = [node["const"]]
        return out
    if kind == "object" or "properties" in node:
        out["type"] = "object"
        props = node.get("properties")
        if props:
            out["properties"] = {k: structural(v, defs, f"{where}.{k}") for k, v in props.items()}
            required = [r for r in node.get("required", []) if r in props]
            if required:
                out["required"] = required
        else:
            for key in ("minProperties", "maxProperties"):
                if key in node:
                    out[key] = node[key]
            extra = node.get("additionalProperties", True)
            if isinstance(extra, dict) and extra:
                out["additionalProperties"] = structural(extra, defs, f"{where}[*]")
            else:
                out["x-kubernetes-preserve-unknown-fields"] = True
        return out
    if kind == "array":
        out["type"] = "array"
        out["items"] = structural(node.get("items", {"type": "object"}), defs, f"{where}[]")
        for key in ("minItems", "maxItems"):
            if key in node:
                out[key] = node[key]
        return out
    if kind not in ("string", "integer", "number", "boolean"):
        raise ValueError(f"{where}: unsupported schema type {kind!r}")
    out["type"] = kind
    for key in ("enum", "minimum", "maximum", "minLength", "maxLength", "pattern", "format"):
        if key in node:
            out[key] = node[key]
    if "exclusiveMinimum" in node:
        out["minimum"] = node["exclusiveMinimum"]
        out["exclusiveMinimum"] = True
    if "exclusiveMaximum" in node:
        out["maximum"] = node["exclusiveMaximum"]
        out["exclusiveMaximum"] = True
    return out


def status_schema() -> dict[str, Any]:
    """The structural schema of ``status`` (written only by the operator), from :class:`VerlJobStatus`."""
    raw = VerlJobStatus.model_json_schema(by_alias=True)
    schema = structural(raw, raw.get("$defs", {}), "status")
    schema["description"] = "Observed state, written by the operator only."
    return schema


def build_crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition manifest for VerlJob."""
    raw = VerlJobSpec.model_json_schema(by_alias=True)
    defs = raw.get("$defs", {})
    spec = structural(raw, defs)
    spec["description"] = "Desired state: the verl job, its model, data and resources."
    spec["x-kubernetes-validations"] = list(SPEC_RULES)
    spec["properties"]["resources"]["x-kubernetes-validations"] = list(RESOURCES_RULES)
    spec["properties"]["placement"]["x-kubernetes-validations"] = list(PLACEMENT_RULES)
    root = {
        "type": "object",
        "description": "A verl RL post-training job: planned, validated and placed on NVLink-correct nodes.",
        "required": ["spec"],
        "x-kubernetes-validations": [*ROOT_RULES, *immutable_field_rules(), *finished_field_rules()],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of the object."},
            "kind": {"type": "string", "description": "Kind of the object."},
            "metadata": {"type": "object"},  # the API server allows nothing more here
            "spec": spec,
            "status": status_schema(),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["vj"],
                "categories": ["verl"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "GPUs", "type": "integer", "jsonPath": ".spec.resources.gpus"},
                        {"name": "Mesh", "type": "string", "jsonPath": ".status.mesh"},
                        {"name": "Nodes", "type": "string", "jsonPath": ".status.nodes"},
                        {"name": "Step", "type": "string", "jsonPath": ".status.progress.columns.step"},
                        {
                            "name": "Step time",
                            "type": "string",
                            "jsonPath": ".status.progress.columns.stepTime",
                        },
                        {
                            "name": "Gen %",
                            "type": "string",
                            "jsonPath": ".status.progress.columns.generation",
                        },
                        {"name": "ETA", "type": "string", "jsonPath": ".status.progress.columns.eta"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


#: Plain scalars that YAML 1.1 readers (kubectl, Go's yaml.v2) take for booleans; PyYAML does not quote them.
YAML11_BOOLS = frozenset(
    {"y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on", "On", "ON", "off", "Off", "OFF"}
)


class _Dumper(yaml.SafeDumper):
    """A SafeDumper that quotes YAML 1.1 boolean words (a key such as "n" must stay a string for kubectl)."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if value in YAML11_BOOLS:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')
    return dumper.represent_str(value)


_Dumper.add_representer(str, _represent_str)


def render_crd() -> str:
    """The CRD as YAML text with the generated-file header (what ``crds/`` holds)."""
    return HEADER + yaml.dump(build_crd(), Dumper=_Dumper, sort_keys=False, width=100)
