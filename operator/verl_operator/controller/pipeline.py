"""The one plan -> place -> children pipeline, shared by the reconciler and ``verl-operator render``.

Pure: the spec and a cluster snapshot in, the plan, the placement and the child manifests out. Who places the
pods is :attr:`verl_operator.api.spec.SchedulingSpec.gang`: the operator (``builtin``) chooses nodes here;
for Kueue and Volcano the placement records the hand-off and the pods carry no node.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_operator.api.plan import Plan, Violation
from verl_operator.api.spec import VerlJobSpec
from verl_operator.api.status import Handoff, PlacementStatus, VerlJobStatus
from verl_operator.controller.queue import Waiting, hold_for, queued_message
from verl_operator.controller.snapshot import Snapshot, gpus_in_use
from verl_operator.controller.status import mesh_string
from verl_operator.manifests import LaunchPlan, build_children
from verl_operator.manifests.names import ChildNames
from verl_operator.placement import PlacementRequest
from verl_operator.planner.overrides import format_value
from verl_operator.planner.resolve import resolve

HANDOFF: dict[str, Handoff] = {"kueue": "Kueue", "volcano": "Volcano"}


@dataclass(frozen=True)
class Planned:
    """The outcome of :func:`plan_and_place`.

    Attributes:
        plan: The plan; None when the spec is infeasible on the cluster (see ``violations``).
        violations: Why there is no plan.
        placement: Where the attempt runs; None when the plan is feasible but the nodes are busy (``message``).
        message: Why the job waits for capacity (empty otherwise).
        queued: It waits only because jobs ahead of it in the queue keep the GPUs it fits on.
    """

    plan: Plan | None
    violations: tuple[Violation, ...] = ()
    placement: PlacementStatus | None = None
    message: str = ""
    queued: bool = False

    @property
    def mesh(self) -> str:
        """``dp8 sp1 tp2`` of the plan ("" without one)."""
        return mesh_string(self.plan) if self.plan is not None else ""


def plan_and_place(
    spec: VerlJobSpec,
    snapshot: Snapshot,
    reserved: Sequence[tuple[str, tuple[str, ...], int]] = (),
    *,
    attempt: int = 0,
    job_uid: str | None = None,
    ahead: Sequence[Waiting] = (),
) -> Planned:
    """Plan ``spec`` on the snapshot's nodes and choose the nodes of attempt ``attempt``.

    Args:
        spec: The parsed spec.
        snapshot: Nodes and GPU pods of the cluster (an empty ``pod_entries``: an idle cluster).
        reserved: ``(job uid, nodes, GPUs per node)`` of placed jobs; the job's own (``job_uid``) is ignored.
        attempt: The Ray cluster incarnation being placed.
        job_uid: The job's uid.
        ahead: The jobs ahead of this one in the queue, in order (:func:`~verl_operator.controller.queue.ahead_of`):
            the job leaves them what :func:`~verl_operator.controller.queue.hold_for` keeps.

    Returns:
        The :class:`Planned` outcome.
    """
    result = snapshot.plan(spec)
    if not result.feasible or result.plan is None:
        return Planned(plan=None, violations=tuple(result.violations))
    plan = result.plan
    gang = spec.scheduling.gang
    if gang != "builtin":
        who = HANDOFF[gang]
        return Planned(
            plan=plan,
            placement=PlacementStatus(attempt=attempt, handoff=who, message=f"placement by {who}"),
        )
    request = snapshot.request(plan, spec)
    used = gpus_in_use(snapshot.pod_entries, reserved, exclude_job_uid=job_uid, live_jobs=snapshot.live_jobs)
    index = snapshot.node_index()
    hold = hold_for(ahead, index, used, lambda w: _request_today(w, snapshot))
    chosen = index.place(request, hold.used, closed=hold.held)
    if not chosen.feasible:
        if hold.holders:
            alone = index.place(request, used)
            if alone.feasible:
                return Planned(plan=plan, message=queued_message(hold.holders), queued=True)
            chosen = alone
        return Planned(plan=plan, message=chosen.message)
    placement = PlacementStatus.model_validate(
        {"attempt": attempt, "gpusPerNode": request.gpus_per_node, **chosen.to_status()}
    )
    return Planned(plan=plan, placement=placement)


def _request_today(waiting: Waiting, snapshot: Snapshot) -> PlacementRequest | None:
    """The request of a queued job on today's nodes: its plan's, or, without one, planned now (None: still
    no plan)."""
    if waiting.spec is None:
        return waiting.request
    plan = waiting.plan if waiting.plan is not None else snapshot.plan(waiting.spec).plan
    return snapshot.request(plan, waiting.spec) if plan is not None else None


#: An override of the plan longer than this is written to status as its key, length and hash only.
STATUS_OVERRIDE_CHARS = 200
#: The one status entry that stands for the user's pass-through overrides: their count and hash.
PASSTHROUGH_MARK = "#passthrough"
#: The value of a long planner override in status.
ELIDED_MARK = "#elided"


def _digest(entries: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()[:16]


def _passthrough(spec: VerlJobSpec) -> list[str]:
    """The user's overrides the planner passes through, as the plan's override list ends with them."""
    resolved = resolve(spec)
    return [] if isinstance(resolved, list) else [ov.raw.strip() for ov in resolved.passthrough]


def status_plan(plan: Plan, spec: VerlJobSpec) -> Plan:
    """The plan as ``status`` keeps it: bounded whatever the spec (etcd takes objects up to 1.5 MB).

    The planner's own overrides stay (a long one, such as ``data.train_files`` with many paths, becomes
    ``key=#elided chars=N sha256=H``); the user's pass-through overrides become one entry
    ``#passthrough count=N sha256=H``. :func:`launch_overrides` gives the full list back from the spec: the
    launch ConfigMap carries it, the status never repeats user input.
    """
    tail = _passthrough(spec) if spec.overrides else []
    full = list(plan.overrides)
    if tail and full[len(full) - len(tail) :] != tail:
        tail = []  # not the plan of this spec: its pass-through is not known, keep the list as it is
    emitted = full[: len(full) - len(tail)]
    out = [
        e
        if len(e) <= STATUS_OVERRIDE_CHARS
        else f"{e.split('=', 1)[0]}={ELIDED_MARK} chars={len(e)} sha256={_digest([e])}"
        for e in emitted
    ]
    if tail:
        out.append(f"{PASSTHROUGH_MARK} count={len(tail)} sha256={_digest(tail)}")
    return plan if out == full else plan.changed(overrides=out)


def _emitted_candidates(spec: VerlJobSpec) -> list[str]:
    """What the planner emits from the user's own strings (paths), for an elided status entry."""
    resolved = resolve(spec)
    if isinstance(resolved, list):
        return []
    p = resolved.problem
    out = [f"actor_rollout_ref.model.path={format_value(p.model_path)}"]
    if p.critic_model_path:
        out.append(f"critic.model.path={format_value(p.critic_model_path)}")
    pins = resolved.problem.pins
    for key in ("train_files", "val_files"):
        if key in pins:
            out.append(f"data.{key}={format_value(pins[key].value)}")
    return out


def launch_overrides(plan: Plan, spec: VerlJobSpec) -> list[str]:
    """The full override list of a plan read from status (:func:`status_plan`), from the job's spec.

    An elided entry is the candidate of the spec with the same key whose hash matches (or, the spec changed
    since the plan, the spec's value of that key); the pass-through entry is the spec's pass-through list.
    """
    entries = list(plan.overrides)
    if not any(e.startswith(PASSTHROUGH_MARK) or f"={ELIDED_MARK} " in e for e in entries):
        return entries
    candidates = _emitted_candidates(spec)
    out: list[str] = []
    for entry in entries:
        if entry.startswith(PASSTHROUGH_MARK):
            out += _passthrough(spec)
            continue
        key, _, value = entry.partition("=")
        if not value.startswith(f"{ELIDED_MARK} "):
            out.append(entry)
            continue
        same_key = [c for c in candidates if c.split("=", 1)[0] == key]
        match = [c for c in same_key if value.endswith(f"sha256={_digest([c])}")]
        out.append((match or same_key or [entry])[0])
    return out


def children_of(
    job: Mapping[str, Any], spec: VerlJobSpec, status: VerlJobStatus, launcher_image: str | None = None
) -> list[dict[str, Any]]:
    """Every child manifest of the job's current attempt, from its plan and placement.

    ``launcher_image`` is the operator's image, whose launcher jobs with ``spec.verl.launcher: inject`` copy
    into their Ray pods (None: ``verl-launcher`` from the job's image).

    Raises:
        ValueError: The status has no plan or no placement (the job is not placed).
    """
    if status.plan is None or status.placement is None:
        raise ValueError("the job has no plan and placement to build children from")
    plan = status.plan.changed(overrides=launch_overrides(status.plan, spec))
    launch = LaunchPlan.from_plan(plan, spec, status.placement.nodes, launcher_image)
    return build_children(job, spec, launch, status.attempt)


def pod_names(job: Mapping[str, Any], status: VerlJobStatus) -> list[str]:
    """The pod names of the job's current attempt, head first: the names :func:`children_of` gives its pods,
    without building any manifest (one pod per node of the plan).

    Raises:
        ValueError: The status has no plan and placement (the job is not placed).
    """
    if status.plan is None or status.placement is None:
        raise ValueError("the job has no plan and placement to name pods from")
    meta = job["metadata"]
    names = ChildNames(str(meta["name"]), str(meta.get("namespace") or ""))
    return [names.pod(status.attempt, i) for i in range(status.plan.nnodes)]
