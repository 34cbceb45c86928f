"""Status helpers: metav1.Condition merging, kstatus summary per phase, the mesh column, pod failures."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from verl_operator.api.status import PHASES
from verl_operator.controller.status import (
    PHASE_SUMMARY,
    condition,
    merge_conditions,
    mesh_string,
    pod_failure,
    summary_conditions,
)


def test_condition_shape_is_metav1() -> None:
    cond = condition("Valid", True, "Planned", "ok", 3, "2026-01-01T00:00:00Z").to_wire()
    assert set(cond) == {"type", "status", "observedGeneration", "lastTransitionTime", "reason", "message"}
    assert cond["status"] == "True" and cond["observedGeneration"] == 3


def test_merge_keeps_transition_time_when_status_is_unchanged() -> None:
    old = [
        condition("Ready", False, "Pending", "a", 1, "T1"),
        condition("Valid", True, "Planned", "b", 1, "T1"),
    ]
    new = [
        condition("Ready", False, "Starting", "c", 2, "T2"),
        condition("Valid", False, "PlanInfeasible", "d", 2, "T2"),
    ]
    merged = {c.type: c for c in merge_conditions(old, new)}
    assert merged["Ready"].last_transition_time == "T1" and merged["Ready"].reason == "Starting"
    assert merged["Valid"].last_transition_time == "T2", "a status flip is a transition"
    assert [c.type for c in merge_conditions(old, [condition("Placed", True, "P", "", 2, "T3")])] == [
        "Ready",
        "Valid",
        "Placed",
    ]


@pytest.mark.parametrize("phase", PHASES)
def test_every_phase_has_exactly_one_kstatus_reading(phase: str) -> None:
    conds = {c.type: c.status for c in summary_conditions(phase, "R", "m", 1, "T")}
    ready, reconciling, stalled = PHASE_SUMMARY[phase]
    assert conds == {
        "Ready": "True" if ready else "False",
        "Reconciling": "True" if reconciling else "False",
        "Stalled": "True" if stalled else "False",
    }
    assert not (reconciling and stalled), "a job is never both progressing and stuck"
    assert not (ready and (reconciling or stalled))


def test_mesh_string() -> None:
    rollout = SimpleNamespace(tensor_parallel_size=2)
    plan = SimpleNamespace(data_parallel_size=8, sequence_parallel_size=1, rollout=rollout, training=None)
    assert mesh_string(plan) == "dp8 sp1 tp2"  # type: ignore[arg-type]


def test_the_mesh_string_of_megatron_plans() -> None:
    from verl_operator.api.plan import TrainingPlan

    def plan(**sizes: Any) -> Any:
        t = TrainingPlan(engine="megatron", **sizes)
        return SimpleNamespace(
            data_parallel_size=96,
            sequence_parallel_size=1,
            rollout=SimpleNamespace(tensor_parallel_size=32),
            training=t,
        )

    assert mesh_string(plan(pipeline_parallel_size=12, expert_parallel_size=8, data_parallel_size=8)) == (
        "dp8 tp1 pp12 ep8 rollout-tp32"
    )
    long_context = plan(
        tensor_parallel_size=4,
        pipeline_parallel_size=4,
        virtual_pipeline_parallel_size=2,
        context_parallel_size=2,
        data_parallel_size=3,
    )
    assert mesh_string(long_context) == "dp3 tp4 pp4 vpp2 cp2 rollout-tp32"
    fsdp = plan(data_parallel_size=96)
    fsdp.training = TrainingPlan(engine="fsdp", data_parallel_size=96)
    assert mesh_string(fsdp) == "dp96 sp1 tp32"


def failed_pod(exit_code: int | None, message: str | None = None, **status: Any) -> dict[str, Any]:
    cs: list[dict[str, Any]] = []
    if exit_code is not None:
        term: dict[str, Any] = {"exitCode": exit_code}
        if message is not None:
            term["message"] = message
        cs = [{"name": "ray", "state": {"terminated": term}}]
    return {"metadata": {"name": "p"}, "status": {"phase": "Failed", "containerStatuses": cs, **status}}


@pytest.mark.parametrize(
    ("pod", "reason", "retryable"),
    [
        pytest.param(failed_pod(10), "VerlFailed", True, id="verl-failed-10"),
        pytest.param(failed_pod(11), "WorkerLost", True, id="worker-lost-11"),
        pytest.param(failed_pod(12), "TopologyMismatch", False, id="topology-12-not-retried"),
        pytest.param(failed_pod(2), "InvalidLaunchSpec", False, id="invalid-spec-2"),
        pytest.param(failed_pod(13), "ClusterNotReady", True, id="cluster-not-ready-13"),
        pytest.param(failed_pod(14), "HeadUnreachable", True, id="head-unreachable-14"),
        pytest.param(failed_pod(137), "PodFailed", True, id="killed-137"),
        pytest.param(
            failed_pod(1, json.dumps({"reason": "TopologyMismatch", "message": "NVLink 1 != 2"})),
            "TopologyMismatch",
            False,
            id="termination-log-json-wins",
        ),
        pytest.param(
            failed_pod(None, reason="Evicted", message="node lost"), "PodFailed", True, id="evicted"
        ),
    ],
)
def test_pod_failure_follows_the_exit_code_contract(
    pod: dict[str, Any], reason: str, retryable: bool
) -> None:
    got_reason, message, got_retryable = pod_failure(pod)
    assert (got_reason, got_retryable) == (reason, retryable)
    assert "pod p" in message


def test_termination_message_text_is_kept() -> None:
    _, message, _ = pod_failure(failed_pod(1, "Traceback ... CUDA out of memory"))
    assert "CUDA out of memory" in message and "code 1" in message


def test_the_scheduler_reason_of_a_stuck_pod_is_reported() -> None:
    from verl_operator.controller.assess import unschedulable as _unschedulable

    stuck = {
        "metadata": {"name": "j-r0-worker-1"},
        "status": {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "message": "0/9 nodes are available: 1 Insufficient nvidia.com/gpu.",
                }
            ]
        },
    }
    fine = {
        "metadata": {"name": "j-r0-head"},
        "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]},
    }
    assert _unschedulable([fine, stuck]) == (
        "pod j-r0-worker-1 not scheduled: 0/9 nodes are available: 1 Insufficient nvidia.com/gpu."
    )
    assert _unschedulable([fine]) == ""
