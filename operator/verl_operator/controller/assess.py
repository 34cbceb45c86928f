"""What to do with a placed job's current Ray cluster, decided from its pods (pure).

:func:`assess` reads the pods of the current attempt and returns one :class:`Verdict`; the reconciler carries
it out. Order of precedence: the active deadline, then a deleted node, a failed or a lost pod (restart or
fail), then the head's success, then creating/releasing the pods, then Running or Starting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from verl_operator.controller.status import pod_failure, pod_success

Action = Literal["fail", "restart", "succeed", "create", "running", "starting"]


@dataclass(frozen=True)
class Verdict:
    """The decision for one reconcile pass.

    Attributes:
        action: ``fail`` (the job fails for good), ``restart`` (a new Ray cluster, attempt + 1), ``succeed``,
            ``create`` (create missing children, release the gang when all exist), ``running``, ``starting``.
        reason: CamelCase reason (for ``fail``/``restart``).
        message: One line for status and events.
    """

    action: Action
    reason: str = ""
    message: str = ""


def pod_phase(pod: Mapping[str, Any] | None) -> str:
    """A pod's phase (``Pending`` when unknown, ``Missing`` when there is no pod)."""
    if pod is None:
        return "Missing"
    return str((pod.get("status") or {}).get("phase") or "Pending")


def unschedulable(pods: Iterable[Mapping[str, Any]]) -> str:
    """The scheduler's reason for the first pod it cannot place (``PodScheduled=False``), if any."""
    for pod in sorted(pods, key=lambda p: str(p["metadata"]["name"])):
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("message"):
                return f"pod {pod['metadata']['name']} not scheduled: {cond['message']}"
    return ""


def assess(
    wanted: Sequence[str],
    current: Mapping[str, Mapping[str, Any]],
    *,
    released: bool,
    restarts: int,
    backoff_limit: int,
    elapsed: float | None = None,
    deadline: int | None = None,
    nodes_gone: Sequence[tuple[str, str]] = (),
) -> Verdict:
    """Decide the next step of a placed attempt.

    Args:
        wanted: Pod names of the attempt, head first.
        current: Existing pods of the attempt by name.
        released: True once the gang was released (every pod existed and was ungated).
        restarts: Restarts so far (``status.restarts``).
        backoff_limit: ``spec.backoffLimit``.
        elapsed: Seconds since ``status.startTime`` (None: not started).
        deadline: ``spec.activeDeadlineSeconds``.
        nodes_gone: ``(node, pod)`` for each chosen node of the attempt that no longer exists: its pod is lost
            at once (released or not), a retryable failure (``NodeLost``).

    Returns:
        The :class:`Verdict`.
    """
    if deadline is not None and elapsed is not None and elapsed > deadline:
        return Verdict("fail", "DeadlineExceeded", f"ran longer than activeDeadlineSeconds {deadline}")
    failed = [current[n] for n in wanted if pod_phase(current.get(n)) == "Failed"]
    lost = [n for n in wanted if n not in current] if released else []
    if nodes_gone or failed or lost:
        if nodes_gone:
            node, pod = nodes_gone[0]
            reason, message, retryable = "NodeLost", f"node {node} of pod {pod} was deleted", True
        elif failed:
            reason, message, retryable = pod_failure(failed[0])
        else:
            reason, message, retryable = "PodLost", f"pod {lost[0]} disappeared", True
        if retryable and restarts < backoff_limit:
            text = f"{message}; restarting the whole Ray cluster (restart {restarts + 1} of {backoff_limit})"
            return Verdict("restart", reason, text)
        if retryable and backoff_limit:
            return Verdict("fail", "BackoffLimitExceeded", f"{message}; backoffLimit {backoff_limit} reached")
        return Verdict("fail", reason, message)
    if wanted and pod_phase(current.get(wanted[0])) == "Succeeded":
        return Verdict("succeed", "Succeeded", pod_success(current[wanted[0]]))
    if not released:
        return Verdict("create")
    running = sum(1 for n in wanted if pod_phase(current.get(n)) == "Running")
    if running == len(wanted):
        return Verdict("running", "AllPodsRunning", f"{len(wanted)} Ray pods running")
    message = f"{running} of {len(wanted)} Ray pods running"
    blocked = unschedulable(current.values())
    return Verdict("starting", "PodsStarting", f"{message}; {blocked}" if blocked else message)
