"""Build the placement snapshot (node capacities, GPUs in use) from the operator's in-memory indices.

What a decision derives from the nodes alone (the plan of a spec, a plan's candidate nodes, the nodes in name
order with the static screens of each request shape) depends only on the nodes' facts, which change far
less often than a job is placed: a :class:`SnapshotMemo` keeps them for one version of the facts (the watch
cache counts the changes) and starts over when the version moves on. A decision then costs what it reads
of GPU use, not a scan of every node per plan and per placement.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_operator.api.plan import Plan, PlanResult
from verl_operator.api.spec import VerlJobSpec
from verl_operator.controller.queue import NO_PRIORITIES, Priorities, Waiting
from verl_operator.manifests.children import KUEUE_QUEUE_LABEL
from verl_operator.manifests.names import ANNOTATION_NODE, LABEL_JOB
from verl_operator.placement import NodeCapacity, PlacementRequest, plan_candidates, request_from_plan
from verl_operator.placement.index import NodeIndex
from verl_operator.planner import plan_job
from verl_operator.planner.budget import Budget
from verl_operator.planner.facts import NodeFacts, node_facts

TERMINAL_POD_PHASES = frozenset({"Succeeded", "Failed"})


def node_capacity(node: Mapping[str, Any] | NodeFacts) -> NodeCapacity:
    """A :class:`NodeCapacity` from a Node object or its facts (through the planner's facts)."""
    facts = node if isinstance(node, NodeFacts) else node_facts(node)
    return NodeCapacity(
        name=facts.name,
        labels=dict(facts.labels),
        gpus=facts.gpus,
        gpu_product=facts.gpu_product or None,
        nvlink_domain_size=facts.nvlink_domain_size,
        clique=facts.clique,
        schedulable=facts.schedulable and facts.ready,
    )


def pod_gpu_request(pod: Mapping[str, Any]) -> int:
    """``nvidia.com/gpu`` requested by a pod (sum over containers; limits when requests are absent)."""
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        value = (res.get("requests") or {}).get("nvidia.com/gpu") or (res.get("limits") or {}).get(
            "nvidia.com/gpu"
        )
        if value:
            total += int(str(value))
    return total


def pod_usage_entry(pod: Mapping[str, Any]) -> tuple[str, str, int, str | None] | None:
    """``(node, pod uid, gpus, "<namespace>/<job>")`` for a live pod holding GPUs on a node, else None.

    A pod counts on its bound node (``spec.nodeName``) or, while still gated, on the node the operator pinned
    it to (annotation ``verl-operator.io/node``). A VerlJob's pod handed to another scheduler (Kueue's queue
    label, Volcano's ``schedulerName``) has no job key: no reservation of the operator stands for its GPUs,
    so it counts like any other pod once bound (a pending one has no node to count on).
    """
    status = pod.get("status") or {}
    if status.get("phase") in TERMINAL_POD_PHASES:
        return None
    gpus = pod_gpu_request(pod)
    meta = pod.get("metadata") or {}
    node = (pod.get("spec") or {}).get("nodeName") or (meta.get("annotations") or {}).get(ANNOTATION_NODE)
    if not gpus or not node:
        return None
    labels = meta.get("labels") or {}
    job = labels.get(LABEL_JOB)
    handed_off = KUEUE_QUEUE_LABEL in labels or (pod.get("spec") or {}).get("schedulerName") == "volcano"
    key = f"{meta.get('namespace', '')}/{job}" if job and not handed_off else None
    return str(node), str(meta.get("uid", "")), gpus, key


def gpus_in_use(
    pod_entries: Iterable[tuple[str, str, int, str | None]],
    reservations: Iterable[tuple[str, tuple[str, ...], int]],
    exclude_job_uid: str | None = None,
    live_jobs: frozenset[str] | None = None,
) -> dict[str, int]:
    """GPUs taken per node: pods that are not VerlJob pods plus the placements of active VerlJobs.

    Args:
        pod_entries: ``(node, pod uid, gpus, "<namespace>/<job>" or None)`` of live GPU pods.
        reservations: ``(job uid, nodes, gpus per node)`` of VerlJobs placed and not finished.
        exclude_job_uid: The job being placed (its own old reservation does not count).
        live_jobs: ``<namespace>/<name>`` of existing VerlJobs; pods of a job not in it (deleted, its pods
            not yet garbage-collected) count like any other pod. None: VerlJob pods never count.

    Returns:
        Node name -> GPUs in use.
    """
    used: dict[str, int] = {}
    for node, _, gpus, job in pod_entries:
        if job is None or (live_jobs is not None and job not in live_jobs):
            used[node] = used.get(node, 0) + gpus
    for uid, nodes, per_node in reservations:
        if uid == exclude_job_uid:
            continue
        for node in nodes:
            used[node] = used.get(node, 0) + per_node
    return used


#: Plans a memo keeps per version of the node facts (least recently used dropped first): a plan is a few KB,
#: and a cluster's queue and admission reviews repeat far fewer distinct specs.
MAX_PLANS = 512
#: Candidate sets kept per version (one per distinct pool, GPUs per node and placement constraints; a set of
#: 5000 names takes 0.5 MB: at most 32 MB), least recently used dropped first.
MAX_CANDIDATE_SETS = 64


def candidates_key(plan: Plan, spec: VerlJobSpec) -> Hashable:
    """What :func:`~verl_operator.placement.plan_candidates` reads of a plan and a spec: the plan's pool and
    layout, and the spec's resources, dtype and placement (its node selector, tolerations, CPUs, memory,
    topology)."""
    pool = plan.node_pool
    return (
        pool.gpu_product,
        pool.gpu_memory_mib,
        pool.nvlink_domain_size,
        tuple(sorted(pool.product_selector.items())),
        plan.nnodes,
        plan.gpus_per_node,
        spec.resources.model_dump_json(),
        spec.model.dtype,
        spec.placement.model_dump_json(),
    )


class SnapshotMemo:
    """What decisions derive from one version of the node facts, kept until the version changes.

    Shared by the reconcile threads and the admission reviews (one lock; a value is computed outside it, so
    two threads may compute the same one once each). Every value is a pure function of the facts and its
    key, so a hit gives what a fresh computation would.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version: int | None = None
        self._index: NodeIndex | None = None
        self._plans: OrderedDict[str, PlanResult] = OrderedDict()
        self._candidates: OrderedDict[Hashable, frozenset[str]] = OrderedDict()
        #: Plans computed and plans answered from the memo, since the start (the benchmark and tests read them).
        self.plans_computed = 0
        self.plans_reused = 0

    def _at(self, version: int) -> None:
        """Forget everything of another version (under the lock)."""
        if version != self._version:
            self._version = version
            self._index = None
            self._plans.clear()
            self._candidates.clear()

    def plan(
        self,
        version: int,
        spec: VerlJobSpec,
        nodes: Sequence[NodeFacts | Mapping[str, Any]],
        budget: Budget | None = None,
    ) -> PlanResult:
        """The planner's result for ``spec`` on the nodes of ``version`` (planned once per spec and version).

        ``budget``: the planner's budget when planning now (an admission review's deadline). A result cut
        short by it (``plan-too-large``) is not kept: with more time the plan may exist. Any other result is
        what an unbounded plan gives (the planner is pure), so reconciles and reviews share them.
        """
        key = spec.model_dump_json()
        with self._lock:
            self._at(version)
            found = self._plans.get(key)
            if found is not None:
                self._plans.move_to_end(key)
                self.plans_reused += 1
                return found
        result = plan_job(spec, list(nodes), budget=budget)
        cut_short = any(v.rule == "plan-too-large" for v in result.violations)
        with self._lock:
            self.plans_computed += 1
            if self._version == version and not cut_short:
                self._plans[key] = result
                while len(self._plans) > MAX_PLANS:
                    self._plans.popitem(last=False)
        return result

    def candidates(
        self, version: int, plan: Plan, spec: VerlJobSpec, nodes: Sequence[NodeFacts | Mapping[str, Any]]
    ) -> frozenset[str]:
        """:func:`~verl_operator.placement.plan_candidates` of ``plan`` on the nodes of ``version``."""
        key = candidates_key(plan, spec)
        with self._lock:
            self._at(version)
            found = self._candidates.get(key)
            if found is not None:
                self._candidates.move_to_end(key)
                return found
        facts = [n if isinstance(n, NodeFacts) else node_facts(n) for n in nodes]
        names = frozenset(plan_candidates(plan, spec, facts))
        with self._lock:
            if self._version == version:
                self._candidates[key] = names
                while len(self._candidates) > MAX_CANDIDATE_SETS:
                    self._candidates.popitem(last=False)
        return names

    def index(self, version: int, capacities: Sequence[NodeCapacity]) -> NodeIndex:
        """The :class:`NodeIndex` of the nodes of ``version`` (built once per version)."""
        with self._lock:
            self._at(version)
            if self._index is None:
                self._index = NodeIndex(capacities)
            return self._index


@dataclass
class Snapshot:
    """What the reconciler reads from the watch cache for one placement.

    Attributes:
        nodes: Every node's facts (Node objects are accepted too).
        pod_entries: ``(node, pod uid, gpus, "<namespace>/<job>" or None)`` of live GPU pods.
        reservations: ``(job uid, nodes, gpus per node)`` of placed, unfinished VerlJobs.
        live_uids: UIDs of existing VerlJobs.
        live_jobs: ``<namespace>/<name>`` of existing VerlJobs.
        capacities: The nodes as placement sees them, kept per Node by the cache; None: derive from ``nodes``.
        queue: The jobs waiting to be placed (:mod:`verl_operator.controller.queue`).
        priorities: The cluster's PriorityClasses (the queue's order).
        facts_version: The version of the nodes' facts (the watch cache's count of changes), with ``memo``:
            what is derived from the nodes is reused while it stays the same. None: derived on every call.
        memo: Values derived from the nodes of ``facts_version`` (:class:`SnapshotMemo`).
    """

    nodes: Sequence[Mapping[str, Any] | NodeFacts]
    pod_entries: Sequence[tuple[str, str, int, str | None]]
    reservations: Sequence[tuple[str, tuple[str, ...], int]]
    live_uids: frozenset[str] = frozenset()
    live_jobs: frozenset[str] = frozenset()
    capacities: Sequence[NodeCapacity] | None = None
    queue: Sequence[Waiting] = ()
    priorities: Priorities = NO_PRIORITIES
    facts_version: int | None = None
    memo: SnapshotMemo | None = None

    def plan(self, spec: VerlJobSpec) -> PlanResult:
        """The planner's result for ``spec`` on the snapshot's nodes (from the memo when it has it)."""
        if self.memo is None or self.facts_version is None:
            return plan_job(spec, list(self.nodes))
        return self.memo.plan(self.facts_version, spec, self.nodes)

    def request(self, plan: Plan, spec: VerlJobSpec) -> PlacementRequest:
        """The placement request of ``plan``, its candidate nodes read from the snapshot's nodes (a plan in
        ``status`` carries only their count)."""
        if self.memo is None or self.facts_version is None:
            facts = [n if isinstance(n, NodeFacts) else node_facts(n) for n in self.nodes]
            candidates = frozenset(plan_candidates(plan, spec, facts))
        else:
            candidates = self.memo.candidates(self.facts_version, plan, spec, self.nodes)
        return request_from_plan(plan, spec, candidates)

    def node_index(self) -> NodeIndex:
        """The snapshot's nodes as a :class:`NodeIndex` (one per version of the facts when memoised)."""
        if self.memo is None or self.facts_version is None:
            return NodeIndex(self.node_capacities())
        return self.memo.index(self.facts_version, self.node_capacities())

    def node_capacities(self) -> list[NodeCapacity]:
        """:attr:`capacities`, or each node's capacity derived now."""
        if self.capacities is not None:
            return list(self.capacities)
        return [node_capacity(n) for n in self.nodes]

    def facts_of(self, name: str) -> NodeFacts | None:
        """The facts of one node, or None when it is unknown."""
        for node in self.nodes:
            facts = node if isinstance(node, NodeFacts) else None
            if facts is not None and facts.name == name:
                return facts
            if facts is None and str((node.get("metadata") or {}).get("name")) == name:  # type: ignore[union-attr]
                return node_facts(node)  # type: ignore[arg-type]
        return None


@dataclass
class Reservations:
    """Placements decided by this process that the job index may not show yet (uid -> nodes, GPUs per node).

    Reconciles of different jobs run in worker threads: reads take a copy (``list``/``dict`` of a dict are
    single operations under the GIL), so a release by one job never breaks another's iteration.
    """

    decided: dict[str, tuple[tuple[str, ...], int]] = field(default_factory=dict)

    def merged(
        self, indexed: Sequence[tuple[str, tuple[str, ...], int]], live_uids: frozenset[str]
    ) -> list[tuple[str, tuple[str, ...], int]]:
        """Index reservations overridden by this process's newer decisions; deleted jobs reserve nothing."""
        for uid in [u for u in list(self.decided) if u not in live_uids]:
            self.decided.pop(uid, None)
        out = {uid: (nodes, gpn) for uid, nodes, gpn in indexed}
        out.update(dict(self.decided))
        return [(uid, nodes, gpn) for uid, (nodes, gpn) in sorted(out.items())]
