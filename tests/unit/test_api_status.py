"""The typed status: parsing what the API server returns, the generated schema, the status merge patch."""

from __future__ import annotations

from typing import Any

import pytest

from verl_operator.api.status import PHASES, VerlJobStatus, parse_status
from verl_operator.controller.status import merge_patch
from verl_operator.crdgen import build_crd


def status_schema() -> dict[str, Any]:
    root = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema: dict[str, Any] = root["properties"]["status"]
    return schema


def test_the_phase_enum_is_the_phase_list() -> None:
    assert status_schema()["properties"]["phase"]["enum"] == list(PHASES)


def test_conditions_are_a_map_keyed_by_type() -> None:
    conditions = status_schema()["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert set(conditions["items"]["required"]) == {"type", "status"}


def test_the_plan_is_typed_in_the_schema() -> None:
    plan = status_schema()["properties"]["plan"]
    assert "x-kubernetes-preserve-unknown-fields" not in plan
    assert plan["properties"]["nodePool"]["properties"]["gpuProduct"]["type"] == "string"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(None, {"attempt": 0, "restarts": 0}, id="no-status"),
        pytest.param({"attempt": 2, "plan": {"nnodes": "x"}}, {"attempt": 2}, id="bad-plan-dropped"),
        pytest.param({"phase": "Exploded", "restarts": 1}, {"restarts": 1}, id="unknown-phase-dropped"),
        pytest.param(
            {"placement": {"attempt": 1, "nodes": ["a"], "gpusPerNode": 8}, "attempt": 1},
            {"placement": {"attempt": 1, "nodes": ["a"], "gpusPerNode": 8}},
            id="placement-kept",
        ),
    ],
)
def test_parse_status_keeps_what_parses(raw: dict[str, Any] | None, expected: dict[str, Any]) -> None:
    wire = parse_status(raw).to_wire()
    for key, value in expected.items():
        got = wire[key]
        assert got == value if not isinstance(value, dict) else all(got[k] == v for k, v in value.items())
    if raw and "phase" in raw:
        assert "phase" not in wire


def test_placed_means_the_placement_is_for_this_attempt() -> None:
    assert parse_status({"attempt": 1, "placement": {"attempt": 1}}).placed
    assert not parse_status({"attempt": 2, "placement": {"attempt": 1}}).placed
    assert not VerlJobStatus().placed


@pytest.mark.parametrize(
    ("old", "new", "patch"),
    [
        pytest.param({"a": 1}, {"a": 1}, {}, id="unchanged-writes-nothing"),
        pytest.param({"a": 1, "b": 2}, {"a": 1}, {"b": None}, id="removed-is-null"),
        pytest.param({"p": {"x": 1, "y": 2}}, {"p": {"x": 1}}, {"p": {"y": None}}, id="nested-removal"),
        pytest.param({"l": [1, 2]}, {"l": [1]}, {"l": [1]}, id="lists-replace-whole"),
        pytest.param({}, {"n": 0}, {"n": 0}, id="new-falsy-value"),
    ],
)
def test_merge_patch(old: dict[str, Any], new: dict[str, Any], patch: dict[str, Any]) -> None:
    assert merge_patch(old, new) == patch
