"""The lifecycle decision for a placed attempt (``controller.assess``): one row per situation."""

from __future__ import annotations

from typing import Any

import pytest

from verl_operator.controller.assess import assess

WANTED = ["j-r0-head", "j-r0-worker-1"]


def pod(phase: str, exit_code: int | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if exit_code is not None:
        status["containerStatuses"] = [{"name": "ray", "state": {"terminated": {"exitCode": exit_code}}}]
    return {"metadata": {"name": "x"}, "status": status}


RUNNING = {n: pod("Running") for n in WANTED}


@pytest.mark.parametrize(
    ("current", "kwargs", "action", "reason"),
    [
        pytest.param({}, {"released": False}, "create", "", id="nothing-yet-create"),
        pytest.param(
            {WANTED[0]: pod("Pending")}, {"released": False}, "create", "", id="half-created-create"
        ),
        pytest.param(RUNNING, {"released": True}, "running", "AllPodsRunning", id="all-running"),
        pytest.param(
            {WANTED[0]: pod("Running"), WANTED[1]: pod("Pending")},
            {"released": True},
            "starting",
            "PodsStarting",
            id="one-pending",
        ),
        pytest.param(
            {**RUNNING, WANTED[1]: pod("Failed", 11)},
            {"released": True, "backoff_limit": 2},
            "restart",
            "WorkerLost",
            id="worker-lost-restarts",
        ),
        pytest.param(
            {**RUNNING, WANTED[1]: pod("Failed", 11)},
            {"released": True, "backoff_limit": 2, "restarts": 2},
            "fail",
            "BackoffLimitExceeded",
            id="limit-reached",
        ),
        pytest.param(
            {**RUNNING, WANTED[1]: pod("Failed", 10)},
            {"released": True, "backoff_limit": 0},
            "fail",
            "VerlFailed",
            id="no-backoff-keeps-the-reason",
        ),
        pytest.param(
            {**RUNNING, WANTED[0]: pod("Failed", 12)},
            {"released": True, "backoff_limit": 5},
            "fail",
            "TopologyMismatch",
            id="topology-never-retried",
        ),
        pytest.param(
            {WANTED[0]: pod("Running")},
            {"released": True, "backoff_limit": 1},
            "restart",
            "PodLost",
            id="pod-lost-after-release",
        ),
        pytest.param(
            {WANTED[0]: pod("Running")},
            {"released": False, "backoff_limit": 1},
            "create",
            "",
            id="missing-before-release-is-created",
        ),
        pytest.param(
            {WANTED[0]: pod("Succeeded", 0), WANTED[1]: pod("Running")},
            {"released": True},
            "succeed",
            "Succeeded",
            id="head-succeeded",
        ),
        pytest.param(
            {WANTED[0]: pod("Running"), WANTED[1]: pod("Succeeded", 0)},
            {"released": True},
            "starting",
            "PodsStarting",
            id="worker-exit-0-is-not-success",
        ),
        pytest.param(
            RUNNING,
            {"released": True, "elapsed": 11.0, "deadline": 10},
            "fail",
            "DeadlineExceeded",
            id="deadline",
        ),
        pytest.param(
            RUNNING,
            {"released": True, "elapsed": 9.0, "deadline": 10},
            "running",
            "AllPodsRunning",
            id="before-deadline",
        ),
        pytest.param(
            {**RUNNING, WANTED[1]: pod("Failed", 11)},
            {"released": True, "backoff_limit": 3, "elapsed": 99.0, "deadline": 10},
            "fail",
            "DeadlineExceeded",
            id="deadline-wins-over-restart",
        ),
    ],
)
def test_assess(current: dict[str, Any], kwargs: dict[str, Any], action: str, reason: str) -> None:
    args: dict[str, Any] = {"restarts": 0, "backoff_limit": 0, **kwargs}
    verdict = assess(WANTED, current, **args)
    assert (verdict.action, verdict.reason) == (action, reason)


def test_restart_message_counts_restarts() -> None:
    verdict = assess(
        WANTED, {**RUNNING, WANTED[1]: pod("Failed", 11)}, released=True, restarts=1, backoff_limit=3
    )
    assert "restart 2 of 3" in verdict.message and "exited with code 11" in verdict.message
