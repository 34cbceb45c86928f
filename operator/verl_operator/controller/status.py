"""Pure helpers for ``status``: conditions in the metav1.Condition shape, phases, the mesh string."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

from verl_operator.api.plan import Plan, Violation
from verl_operator.api.status import Condition, ConditionStatus

#: kstatus-style summary conditions derived from the phase: (Ready, Reconciling, Stalled).
PHASE_SUMMARY: dict[str, tuple[bool, bool, bool]] = {
    "Invalid": (False, False, True),
    "Pending": (False, True, False),
    "Starting": (False, True, False),
    "Running": (True, False, False),
    "Succeeded": (True, False, False),
    "Failed": (False, False, True),
    "Suspended": (False, False, False),
}
_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def format_time(seconds: float) -> str:
    """An RFC 3339 ``...Z`` timestamp (whole seconds, UTC) of seconds since the epoch."""
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime(_TIME_FORMAT)


def parse_time(value: str | None) -> float | None:
    """Seconds since the epoch of an RFC 3339 ``...Z`` timestamp written by the operator (None stays None)."""
    if not value:
        return None
    return dt.datetime.strptime(value, _TIME_FORMAT).replace(tzinfo=dt.UTC).timestamp()


#: Characters of one message in status (``message``, each condition's): six copies of it (the message, the
#: summary conditions, the decision's own) stay far below the 8 KB a status of any spec keeps to.
STATUS_TEXT_CHARS = 480
#: Violations kept in ``status.violations`` (the webhook's denial lists them all), and their parts' sizes.
VIOLATIONS_KEPT = 4
VIOLATION_PART_CHARS = {"field": 120, "message": 240, "suggestion": 80}
SUGGESTIONS_KEPT = 3


def bounded(text: str, limit: int = STATUS_TEXT_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut (user input may be of any size)."""
    if len(text) <= limit:
        return text
    cut = limit - 32
    return f"{text[:cut]}... ({len(text) - cut} more characters)"


def bounded_violations(violations: Sequence[Violation]) -> list[Violation]:
    """The first :data:`VIOLATIONS_KEPT` violations, each part bounded, and one that counts the others."""
    parts = VIOLATION_PART_CHARS
    out = [
        v.changed(
            field=bounded(v.field, parts["field"]),
            message=bounded(v.message, parts["message"]),
            suggestions=[bounded(s, parts["suggestion"]) for s in v.suggestions[:SUGGESTIONS_KEPT]],
        )
        for v in violations[:VIOLATIONS_KEPT]
    ]
    if len(violations) > VIOLATIONS_KEPT:
        more = len(violations) - VIOLATIONS_KEPT
        text = f"{more} more violations not kept in status (kubectl apply through the webhook lists them all)"
        out.append(Violation(field="spec", rule="more-violations", message=text))
    return out


def condition(
    type_: str, status: bool | ConditionStatus, reason: str, message: str, generation: int, now: str
) -> Condition:
    """A condition in the ``metav1.Condition`` shape (its message :func:`bounded`)."""
    value: ConditionStatus = status if isinstance(status, str) else ("True" if status else "False")
    return Condition(
        type=type_,
        status=value,
        observed_generation=generation,
        last_transition_time=now,
        reason=reason,
        message=bounded(message),
    )


def merge_conditions(old: Sequence[Condition], new: Sequence[Condition]) -> list[Condition]:
    """Replace conditions by type (the last of ``new`` wins); keep ``lastTransitionTime`` when the status did
    not change.

    Args:
        old: Current conditions.
        new: Conditions to set.

    Returns:
        All conditions, in a stable order (old order first, new types appended).
    """
    by_type = {c.type: c for c in old}
    order = [c.type for c in old]
    for cond in new:
        prev = by_type.get(cond.type)
        merged = cond
        if prev is not None and prev.status == cond.status:
            merged = cond.changed(last_transition_time=prev.last_transition_time or cond.last_transition_time)
        if cond.type not in by_type:
            order.append(cond.type)
        by_type[cond.type] = merged
    return [by_type[t] for t in order]


def summary_conditions(phase: str, reason: str, message: str, generation: int, now: str) -> list[Condition]:
    """``Ready``, ``Reconciling`` and ``Stalled`` for the phase (kstatus / Flux / Argo CD read these)."""
    ready, reconciling, stalled = PHASE_SUMMARY[phase]
    return [
        condition("Ready", ready, reason if not ready else phase, message, generation, now),
        condition("Reconciling", reconciling, reason if reconciling else phase, message, generation, now),
        condition("Stalled", stalled, reason if stalled else phase, message, generation, now),
    ]


def mesh_string(plan: Plan) -> str:
    """FSDP: ``dp8 sp1 tp2``, data parallel, Ulysses SP, rollout tensor parallel. Megatron: ``dp8 tp1 pp12 ep8
    rollout-tp32``, its data parallel size and model-parallel sizes (CP, EP and VPP where used), then the
    rollout's tensor parallel size."""
    t = plan.training
    rollout_tp = plan.rollout.tensor_parallel_size
    if t is None or t.engine != "megatron":
        return f"dp{plan.data_parallel_size} sp{plan.sequence_parallel_size} tp{rollout_tp}"
    parts = [f"dp{t.data_parallel_size}", f"tp{t.tensor_parallel_size}", f"pp{t.pipeline_parallel_size}"]
    if t.virtual_pipeline_parallel_size:
        parts.append(f"vpp{t.virtual_pipeline_parallel_size}")
    if t.context_parallel_size > 1:
        parts.append(f"cp{t.context_parallel_size}")
    if t.expert_parallel_size > 1:
        parts.append(f"ep{t.expert_parallel_size}")
    return " ".join([*parts, f"rollout-tp{rollout_tp}"])


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new`` (empty: nothing to write).

    A member missing from ``new`` becomes ``null`` (removed); objects are compared member by member; any
    other value (lists included) is replaced whole when it differs.
    """
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif before != value or key not in old:
            patch[key] = value
    return patch


#: Launcher exit codes (the launch contract) -> (reason, retryable).
EXIT_REASONS: dict[int, tuple[str, bool]] = {
    0: ("Succeeded", False),
    2: ("InvalidLaunchSpec", False),
    10: ("VerlFailed", True),
    11: ("WorkerLost", True),
    12: ("TopologyMismatch", False),
    13: ("ClusterNotReady", True),
    14: ("HeadUnreachable", True),
}

RETRYABLE: dict[str, bool] = {reason: retry for reason, retry in EXIT_REASONS.values()}


def pod_success(pod: Mapping[str, Any]) -> str:
    """The message of a succeeded head pod: the launcher's termination message (``verl finished at step 2
    of 2``), or a generic one when the pod has none."""
    import json

    for cs in ((pod.get("status") or {}).get("containerStatuses")) or []:
        text = (((cs.get("state") or {}).get("terminated")) or {}).get("message")
        if not text:
            continue
        try:
            doc = json.loads(str(text).strip().splitlines()[-1])
        except (ValueError, IndexError):
            continue
        if isinstance(doc, dict) and doc.get("message"):
            return f"the verl run finished: {doc['message']}"
    return "the verl run finished"


def pod_failure(pod: Mapping[str, Any]) -> tuple[str, str, bool]:
    """``(reason, message, retryable)`` of a failed Ray pod, from its container's termination state.

    A termination message that is the launcher's one-line JSON gives reason and message; otherwise the exit
    code is mapped by the contract; a pod failed without a container exit (evicted, lost) is retryable.
    """
    name = str((pod.get("metadata") or {}).get("name", "?"))
    statuses = ((pod.get("status") or {}).get("containerStatuses")) or []
    for cs in statuses:
        term = ((cs.get("state") or {}).get("terminated")) or ((cs.get("lastState") or {}).get("terminated"))
        if not term:
            continue
        code = int(term.get("exitCode", 1))
        reason, retryable = EXIT_REASONS.get(code, ("PodFailed", True))
        message = f"pod {name} exited with code {code}"
        text = term.get("message")
        if text:
            try:
                doc = json.loads(str(text).strip().splitlines()[-1])
                reason = str(doc.get("reason", reason))
                retryable = RETRYABLE.get(reason, retryable)
                message = f"pod {name}: {doc.get('message', text)}"
            except (ValueError, IndexError, AttributeError):
                message = f"pod {name} exited with code {code}: {str(text).strip()[:200]}"
        return reason, message, retryable
    status = pod.get("status") or {}
    detail = status.get("message") or status.get("reason") or "failed"
    return "PodFailed", f"pod {name} failed: {detail}", True
