"""The generated CRD: drift of the checked-in copies, structural-schema rules, descriptions, CEL rules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from verl_operator.api.spec import VerlJobSpec
from verl_operator.crdgen import CHART_CRD_PATH, CRD_PATH, REGENERATE, build_crd, render_crd, structural

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "relpath", [pytest.param(CRD_PATH, id="crds"), pytest.param(CHART_CRD_PATH, id="chart")]
)
def test_checked_in_crd_has_not_drifted(relpath: str) -> None:
    path = ROOT / relpath
    if relpath == CHART_CRD_PATH and not path.exists():
        pytest.skip("the chart has no CRD copy yet")
    assert path.read_text() == render_crd(), (
        f"{relpath} is out of date with verl_operator.api.spec; regenerate with: {REGENERATE}"
        + (f" && cp {CRD_PATH} {CHART_CRD_PATH}" if relpath == CHART_CRD_PATH else "")
    )


def walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}[*]")


def root_schema() -> dict[str, Any]:
    schema: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_schema_is_structural_and_described() -> None:
    for path, node in walk(root_schema()):
        assert "type" in node, f"{path}: every node needs a type (structural schema)"
        for forbidden in ("$ref", "anyOf", "allOf", "oneOf", "const", "title", "default"):
            assert forbidden not in node, f"{path}: {forbidden} is not allowed here"
        assert node.get("description") or path == ".metadata", (
            f"{path}: needs a description (kubectl explain)"
        )
        if node["type"] == "object" and "properties" not in node and path != ".metadata":
            assert node.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in node, path


def test_every_model_field_is_in_the_schema() -> None:
    spec = root_schema()["properties"]["spec"]

    def fields(model: Any, prefix: str) -> Iterator[str]:
        for name, info in model.model_fields.items():
            alias = info.alias or name
            yield f"{prefix}.{alias}"
            ann = info.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                yield from fields(ann, f"{prefix}.{alias}")

    paths = {p for p, _ in walk(spec)}
    missing = [f for f in fields(VerlJobSpec, "") if f not in paths]
    assert not missing, f"schema misses {missing}"


def test_passthrough_kubernetes_objects_keep_unknown_fields() -> None:
    spec = root_schema()["properties"]["spec"]["properties"]
    for name in ("volumes", "volumeMounts"):
        assert spec[name]["items"]["x-kubernetes-preserve-unknown-fields"] is True
    # EnvVar is typed whole (name, value, valueFrom); its valueFrom source is kept as written.
    env = spec["env"]["items"]
    assert "x-kubernetes-preserve-unknown-fields" not in env and env["required"] == ["name"]
    assert env["properties"]["valueFrom"]["x-kubernetes-preserve-unknown-fields"] is True
    # The security contexts: typed where users err (booleans, capabilities), other fields kept.
    security = spec["security"]["properties"]
    container = security["containerSecurityContext"]
    assert container["x-kubernetes-preserve-unknown-fields"] is True
    assert container["properties"]["privileged"]["type"] == "boolean"
    assert container["properties"]["capabilities"]["properties"]["add"]["type"] == "array"
    assert security["podSecurityContext"]["properties"]["sysctls"]["maxItems"] == 64
    assert (
        spec["resources"]["properties"]["tolerations"]["items"]["x-kubernetes-preserve-unknown-fields"]
        is True
    )
    assert spec["resources"]["properties"]["nodeSelector"]["additionalProperties"]["type"] == "string"


def test_names_columns_and_status() -> None:
    crd = build_crd()
    names = crd["spec"]["names"]
    assert names["shortNames"] == ["vj"] and names["categories"] == ["verl"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ".status.phase",
        "GPUs": ".spec.resources.gpus",
        "Mesh": ".status.mesh",
        "Nodes": ".status.nodes",
        "Step": ".status.progress.columns.step",
        "Step time": ".status.progress.columns.stepTime",
        "Gen %": ".status.progress.columns.generation",
        "ETA": ".status.progress.columns.eta",
        "Age": ".metadata.creationTimestamp",
    }


def test_cel_rules_cover_the_static_cross_field_checks() -> None:
    spec = root_schema()["properties"]["spec"]
    rules = [r["rule"] for r in spec["x-kubernetes-validations"]]
    rules += [r["rule"] for r in spec["properties"]["resources"]["x-kubernetes-validations"]]
    text = " ".join(rules)
    assert "self.gpus % self.gpusPerNode == 0" in text
    assert "self.rollout.mode != 'spmd'" in text and "self.verl.version == '0.6'" in text


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        pytest.param(
            {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}], "description": "d"},
            {"type": "integer", "minimum": 1, "description": "d"},
            id="optional-int-unwrapped",
        ),
        pytest.param(
            {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "description": "d"},
            {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1, "description": "d"},
            id="exclusive-minimum-openapi-v3",
        ),
        pytest.param(
            {"const": "vllm", "type": "string", "default": "vllm", "description": "d"},
            {"type": "string", "enum": ["vllm"], "description": "d Default: vllm."},
            id="const-to-enum-default-in-description",
        ),
    ],
)
def test_structural_conversion(schema: dict[str, Any], expected: dict[str, Any]) -> None:
    assert structural(schema, {}) == expected


def test_unsupported_union_is_an_error() -> None:
    with pytest.raises(ValueError, match="unsupported union"):
        structural({"anyOf": [{"type": "integer"}, {"type": "string"}]}, {})


def test_rendered_yaml_parses_and_has_header() -> None:
    text = render_crd()
    assert text.startswith("# Generated") and REGENERATE in text.splitlines()[1]
    assert yaml.safe_load(text)["metadata"]["name"] == "verljobs.verl-operator.io"
