"""Typed status changes: a decision's change has the status's own fields (a misspelt one or a wrong type fails
where it is written), the placement is cleared by one helper, and the raw status the watch cache keeps is read
through the status model's own names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from verl_operator.api.status import (
    PLACEMENT_CLEARED,
    PlacementStatus,
    StatusChange,
    StatusView,
    VerlJobStatus,
    parse_status,
)
from verl_operator.controller.transition import advance


def test_a_change_has_exactly_the_status_fields_with_their_types() -> None:
    change, status = StatusChange.model_fields, VerlJobStatus.model_fields
    assert set(change) == set(status)
    assert {n: f.annotation for n, f in change.items()} == {n: f.annotation for n, f in status.items()}


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"node": ""}, id="misspelt-field"),
        pytest.param({"attempt": "1"}, id="text-for-a-number"),
        pytest.param({"placement": {"node": ["n1"]}}, id="misspelt-placement-field"),
        pytest.param({"violations": "none"}, id="text-for-a-list"),
        pytest.param({"phase": "Runing"}, id="unknown-phase"),
    ],
)
def test_a_wrong_field_or_type_fails_when_the_change_is_built(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        StatusChange(**fields)


def test_only_the_fields_given_change_and_none_clears_one() -> None:
    old = VerlJobStatus(
        phase="Running", attempt=2, restarts=1, nodes="n1", placement=PlacementStatus(attempt=2, nodes=["n1"])
    )
    new = StatusChange(attempt=3).unplaced().apply(old)
    assert (new.attempt, new.restarts, new.nodes, new.placement, new.phase) == (3, 1, "", None, "Running")
    assert PLACEMENT_CLEARED.fields() == {"placement": None, "nodes": ""}
    assert (StatusChange(attempt=1) | StatusChange(attempt=4, restarts=2)).fields() == {
        "attempt": 4,
        "restarts": 2,
    }


def test_advance_sets_the_phase_and_the_change() -> None:
    old = VerlJobStatus(phase="Starting", nodes="n1", placement=PlacementStatus(nodes=["n1"]))
    new = advance(
        old,
        generation=3,
        now="2026-01-01T00:00:00Z",
        phase="Pending",
        reason="Restarting",
        message="again",
        changes=StatusChange(restarts=1).unplaced(),
    )
    assert (new.phase, new.reason, new.observed_generation, new.restarts) == ("Pending", "Restarting", 3, 1)
    assert (new.nodes, new.placement) == ("", None)
    assert {c.type for c in new.conditions} == {"Ready", "Reconciling", "Stalled"}


@pytest.mark.parametrize(
    "raw",
    [
        None,
        {},
        {"phase": "Pending", "reason": "Queued"},
        {
            "phase": "Running",
            "reason": "Running",
            "startTime": "2026-01-01T00:00:00Z",
            "placement": {"attempt": 0, "nodes": ["n1", "n2"], "gpusPerNode": 4},
        },
        {"phase": "Succeeded", "completionTime": "2026-01-01T01:00:00Z", "placement": {"handoff": "Kueue"}},
    ],
)
def test_the_view_of_a_raw_status_reads_what_the_model_parses(raw: dict[str, Any] | None) -> None:
    view, parsed = StatusView(raw), parse_status(raw)
    assert (view.phase, view.reason) == (parsed.phase, parsed.reason)
    assert (view.start_time, view.completion_time) == (parsed.start_time, parsed.completion_time)
    assert view.has_placement == (parsed.placement is not None)
    assert view.placement_nodes == tuple(parsed.placement.nodes if parsed.placement else ())
    gpus = parsed.placement.gpus_per_node if parsed.placement else None
    assert view.placement_gpus_per_node == (gpus or 0)
    assert view.parsed() == parsed


CONTROLLER = Path(__file__).resolve().parents[2] / "operator" / "verl_operator" / "controller"


def test_a_part_of_the_status_is_changed_typed() -> None:
    placement = PlacementStatus(attempt=2, nodes=["n0", "n1"], gpus_per_node=8)
    released = placement.changed(ungated=True)
    assert (released.ungated, released.attempt, released.nodes, released.gpus_per_node) == (
        True,
        2,
        ["n0", "n1"],
        8,
    )
    assert placement.ungated is False  # the original is untouched
    with pytest.raises(ValidationError, match="ungatd"):
        placement.changed(ungatd=True)  # model_copy(update=...) would have set it without a word
    with pytest.raises(ValidationError, match="attempt"):
        placement.changed(attempt="second")


def test_the_controller_writes_status_parts_only_through_typed_changes() -> None:
    untyped = [
        f"{path.name}:{n}"
        for path in sorted(CONTROLLER.glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "model_copy(" in line
    ]
    assert untyped == []
