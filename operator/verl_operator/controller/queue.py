"""Queue order, pure: which waiting jobs come before a job, and what they hold for themselves.

The queue is every VerlJob that waits to be placed by the operator (phase ``Pending``, no placement, not
suspended, not handed to Kueue or Volcano, not waiting for an object that keeps its pods from being created), with its plan, or without one when today's nodes cannot host it
(it is planned again whenever a job behind it is placed). Its order is the *rank*: the value of the
PriorityClass named by ``spec.scheduling.priorityClassName`` (higher first; no name: the value of the
``globalDefault`` PriorityClass, else 0; a name that does not exist: 0), then ``metadata.creationTimestamp``
(older first), then ``<namespace>/<name>``.

The backfill rule (:func:`hold_for`): before a job is placed, the jobs ahead of it are placed in rank order
on a copy of the free GPUs. A job ahead that fits there takes its GPUs in the copy. A job ahead that does not
fit, but would fit the cluster's nodes were every GPU free, is *blocked*: every node it could use (all its
screens pass but the free-GPU count) is held for it, so no job behind it takes a GPU there. A job ahead that
would not fit even an idle cluster (too large for the nodes there are today) holds nothing: it waits for
nodes without stopping the queue. The job is placed only on what is left. Hence a job never takes a GPU
that a job ahead of it would take now, nor a GPU on a node where a blocked job ahead of it is waiting for
GPUs to free up: a placement delays no job ahead of it. A smaller job still backfills onto nodes that no
job ahead can use (another GPU product, a node selector, another topology domain) and onto GPUs left over
once every job ahead that fits has been counted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from verl_operator.api.plan import Plan
from verl_operator.api.spec import VerlJobSpec
from verl_operator.api.status import StatusView
from verl_operator.controller.refused import BLOCKED_REASONS
from verl_operator.placement import NodeCapacity, PlacementRequest, request_from_plan
from verl_operator.placement.index import NodeIndex

Rank = tuple[int, str, str]


@dataclass(frozen=True)
class Priorities:
    """The cluster's PriorityClasses as the queue reads them.

    Attributes:
        values: PriorityClass name -> ``value``.
        default: The ``value`` of the ``globalDefault`` class (0 without one): the priority of a job that
            names no class, as Kubernetes gives its pods.
    """

    values: Mapping[str, int]
    default: int = 0

    def of(self, class_name: str | None) -> int:
        """The priority of a job naming ``class_name`` (an unknown name: 0)."""
        if class_name is None:
            return self.default
        return int(self.values.get(class_name, 0))


NO_PRIORITIES = Priorities(values={})


@dataclass(frozen=True)
class Waiting:
    """A job in the queue.

    Attributes:
        key: ``<namespace>/<name>``.
        uid: ``metadata.uid``.
        priority_class: ``spec.scheduling.priorityClassName`` (None: unset).
        created: ``metadata.creationTimestamp`` (RFC 3339 in UTC, so text order is time order).
        request: What it asks of the nodes (from its ``status.plan`` and spec; any node may be a candidate:
            the plan keeps only their count, :func:`hold_for`'s ``request_of`` reads them from the nodes);
            None when it has no plan (it waits for nodes: planned again when it comes up).
        spec: The parsed spec.
        plan: Its ``status.plan`` (None: none).
    """

    key: str
    uid: str
    priority_class: str | None
    created: str
    request: PlacementRequest | None
    spec: VerlJobSpec | None = None
    plan: Plan | None = None

    def rank(self, priorities: Priorities) -> Rank:
        """The sort key of the queue: higher priority, then older, then the name."""
        return rank(priorities.of(self.priority_class), self.created, self.key)


def rank(priority: int, created: str, key: str) -> Rank:
    """The queue's sort key (smaller comes first)."""
    return (-priority, created, key)


def waiting_entry(job: Mapping[str, Any]) -> Waiting | None:
    """The queue entry of a VerlJob body, or None when it is not in the queue (see the module docstring)."""
    meta = job.get("metadata") or {}
    status = StatusView.of(job)
    if meta.get("deletionTimestamp") or status.phase != "Pending" or status.has_placement:
        return None
    if status.reason in BLOCKED_REASONS:  # its pods cannot be created now: it keeps no GPUs from others
        return None
    try:
        spec = VerlJobSpec.model_validate(job.get("spec") or {})
    except ValidationError:
        return None
    if spec.suspend or spec.scheduling.gang != "builtin":
        return None
    plan = status.parsed().plan if status.has_plan else None
    return Waiting(
        key=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        uid=str(meta.get("uid", "")),
        priority_class=spec.scheduling.priority_class_name,
        created=str(meta.get("creationTimestamp") or ""),
        request=request_from_plan(plan, spec) if plan is not None else None,
        spec=spec,
        plan=plan,
    )


def ahead_of(queue: Sequence[Waiting], mine: Rank, uid: str, priorities: Priorities) -> list[Waiting]:
    """The jobs of ``queue`` ranked before ``mine`` (the job ``uid`` itself left out), in rank order."""
    ranked = sorted((w for w in queue if w.uid != uid), key=lambda w: w.rank(priorities))
    return [w for w in ranked if w.rank(priorities) < mine]


@dataclass(frozen=True)
class Hold:
    """What the jobs ahead keep from a job behind them (:func:`hold_for`).

    Attributes:
        used: GPUs in use per node plus those the jobs ahead that fit now would take.
        held: Nodes a blocked job ahead could use: closed to the job behind.
        holders: ``<namespace>/<name>`` of the jobs ahead that take GPUs or hold nodes, in rank order.
    """

    used: Mapping[str, int]
    held: frozenset[str]
    holders: tuple[str, ...]


def usable_nodes(request: PlacementRequest, nodes: Sequence[NodeCapacity] | NodeIndex) -> set[str]:
    """The nodes that could take one pod of the request were all their GPUs free."""
    return (nodes if isinstance(nodes, NodeIndex) else NodeIndex(nodes)).usable(request)


def hold_for(
    ahead: Sequence[Waiting],
    nodes: Sequence[NodeCapacity] | NodeIndex,
    used: Mapping[str, int],
    request_of: Callable[[Waiting], PlacementRequest | None] | None = None,
) -> Hold:
    """Place the jobs ahead, in order, on a copy of the free GPUs (the backfill rule of the module docstring).

    Args:
        ahead: The jobs ranked before the job being placed, in rank order (:func:`ahead_of`).
        nodes: The cluster's nodes (a :class:`~verl_operator.placement.index.NodeIndex` keeps their static
            screens from one placement to the next).
        used: GPUs in use or reserved per node now.
        request_of: The request of a job ahead on today's nodes: its plan's with the candidate nodes read
            from the nodes, or, for a job without a plan (it waited for nodes), planned now; None when it
            still cannot be planned (it holds nothing). None: each job's own :attr:`Waiting.request`, and
            jobs without a plan hold nothing.

    Returns:
        The GPUs and nodes the job being placed must leave alone.
    """
    index = nodes if isinstance(nodes, NodeIndex) else NodeIndex(nodes)
    taken = dict(used)
    held: set[str] = set()
    holders: list[str] = []
    for waiting in ahead:
        if len(held) >= len(index.nodes):
            break  # every node is held
        request = request_of(waiting) if request_of is not None else waiting.request
        if request is None:
            continue  # no plan on today's nodes: it waits for nodes, holding none
        fit = index.place(request, taken, closed=frozenset(held))
        if fit.feasible:
            for name in fit.nodes:
                taken[name] = taken.get(name, 0) + request.gpus_per_node
            holders.append(waiting.key)
            continue
        if not index.place(request, {}).feasible:
            continue  # too large for today's nodes even when idle: it waits for nodes, holding none
        usable = index.usable(request) - held
        if usable:
            held |= usable
            holders.append(waiting.key)
    return Hold(used=taken, held=frozenset(held), holders=tuple(holders))


def queued_message(holders: Sequence[str]) -> str:
    """Why a job that fits the free GPUs waits: the jobs ahead that keep them."""
    shown = ", ".join(holders[:3])
    more = f" and {len(holders) - 3} more" if len(holders) > 3 else ""
    return (
        f"queued behind {shown}{more}: the free GPUs this job fits on are kept for jobs ahead of it in the "
        "queue (priority, then creation time)"
    )
