"""Build the placement snapshot (node capacities, GPUs in use) from the operator's in-memory indices."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_operator.controller.queue import NO_PRIORITIES, Priorities, Waiting
from verl_operator.manifests.children import KUEUE_QUEUE_LABEL
from verl_operator.manifests.names import ANNOTATION_NODE, LABEL_JOB
from verl_operator.placement import NodeCapacity
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
    """

    nodes: Sequence[Mapping[str, Any] | NodeFacts]
    pod_entries: Sequence[tuple[str, str, int, str | None]]
    reservations: Sequence[tuple[str, tuple[str, ...], int]]
    live_uids: frozenset[str] = frozenset()
    live_jobs: frozenset[str] = frozenset()
    capacities: Sequence[NodeCapacity] | None = None
    queue: Sequence[Waiting] = ()
    priorities: Priorities = NO_PRIORITIES

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
