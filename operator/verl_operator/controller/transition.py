"""What one reconcile pass decided: the :class:`Transition` value, and :func:`advance` that builds it.

A transition is a plain value: the new status, at most one event, the children to create, the pods to
delete or release, and the in-process reservation to record. :mod:`verl_operator.controller.decide` computes
it without side effects; :class:`verl_operator.controller.reconcile.JobReconciler` applies it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from verl_operator.api.status import Condition, Phase, StatusChange, VerlJobStatus
from verl_operator.controller.status import bounded, bounded_violations, merge_conditions, summary_conditions


@dataclass(frozen=True)
class Event:
    """A core/v1 Event to record on the VerlJob."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Transition:
    """The outcome of one decision.

    Attributes:
        status: The whole new status (None: leave it as it is). The reconciler writes the merge patch from
            the old status to this one, and nothing when they are equal.
        event: The event of a phase or reason change (None: no event).
        create: Children to ensure, in order: a missing one is created, a ConfigMap whose ``launch.json``
            differs is updated, an existing pod is left alone.
        delete: Names of pods to delete.
        ungate: Names of pods to release from the gang gate (after ``create``).
        delete_job: Delete the VerlJob itself (``ttlSecondsAfterFinished`` passed).
        reserve: ``(nodes, GPUs per node)`` this process just chose for the job; None keeps what it had.
        unreserve: Forget this process's placement of the job (finished, restarted, suspended).
        recheck: Decide again in the same pass once ``create`` is applied (then every pod may exist).
        planning_seconds: Time the planner took in this decision, for the metrics (None: not planned).
    """

    status: VerlJobStatus | None = None
    event: Event | None = None
    create: tuple[Mapping[str, Any], ...] = ()
    delete: tuple[str, ...] = ()
    ungate: tuple[str, ...] = ()
    delete_job: bool = False
    reserve: tuple[tuple[str, ...], int] | None = None
    unreserve: bool = False
    recheck: bool = False
    planning_seconds: float | None = None


def advance(
    old: VerlJobStatus,
    *,
    generation: int,
    now: str,
    phase: Phase,
    reason: str,
    message: str,
    conditions: Sequence[Condition] = (),
    changes: StatusChange | None = None,
) -> VerlJobStatus:
    """The status after a decision: phase, reason and message, conditions merged, other fields changed.

    The message and the violations are bounded (:func:`~verl_operator.controller.status.bounded`): user
    input quoted in them never makes the status large.

    The summary conditions (``Ready``, ``Reconciling``, ``Stalled``) of the phase are taken first and the
    decision's own ``conditions`` after them, so a specific condition (``Ready`` with the pods and their
    nodes) wins over the summary of the same type; only the winner is compared with the old condition.

    Args:
        old: The status read at the start of the pass.
        generation: ``metadata.generation`` acted on.
        now: The pass's time (RFC 3339), for new transitions.
        phase: The new phase.
        reason: CamelCase reason.
        message: One line.
        conditions: Conditions the decision sets.
        changes: Other fields to set (typed: a misspelt field fails where it is written; None clears one).

    Returns:
        The new status.
    """
    message = bounded(message)
    # One condition per type before the merge: a summary condition that a specific one replaces must not
    # count as a transition (a Stalled=True kept from pass to pass keeps its lastTransitionTime).
    wanted = {c.type: c for c in [*summary_conditions(phase, reason, message, generation, now), *conditions]}
    merged = merge_conditions(old.conditions, list(wanted.values()))
    change = StatusChange(
        phase=phase, reason=reason, message=message, observed_generation=generation, conditions=merged
    )
    if changes is not None:
        change |= changes
    if change.violations:  # user input may be quoted in them: the status stays bounded
        change |= StatusChange(violations=bounded_violations(change.violations))
    return change.apply(old)


def on_change(old: VerlJobStatus, new: VerlJobStatus, event: Event) -> Event | None:
    """``event`` when the phase or the reason changed, else None (a steady state posts no events)."""
    return event if (old.phase, old.reason) != (new.phase, new.reason) else None
