"""Values exchanged with the placement search: the request, the node snapshot, the result."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from verl_operator.planner.mesh import nvlink_spans_nodes

TopologyPolicy = Literal["required", "preferred"]

#: Excluded nodes listed in ``status.placement`` (the count is always there): keeps the object small on
#: clusters of thousands of nodes.
MAX_EXCLUDED_IN_STATUS = 20


@dataclass(frozen=True)
class NodeCapacity:
    """What placement needs to know about one node.

    Attributes:
        name: Node name.
        labels: Node labels (for ``nodeSelector`` and the topology key).
        gpus: Allocatable ``nvidia.com/gpu`` (physical GPUs; time-sliced nodes are excluded by the planner).
        gpu_product: The ``nvidia.com/gpu.product`` label, if any.
        nvlink_domain_size: GPUs per intra-node NVLink domain (1 = no NVLink).
        clique: The ``nvidia.com/gpu.clique`` label (multi-node NVLink domain), if any.
        schedulable: False when the node is cordoned or not Ready.
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    gpus: int = 0
    gpu_product: str | None = None
    nvlink_domain_size: int = 1
    clique: str | None = None
    schedulable: bool = True


@dataclass(frozen=True)
class PlacementRequest:
    """What a job asks of the cluster, from its spec and its plan.

    Attributes:
        nnodes: Nodes (Ray pods) of the job.
        gpus_per_node: GPUs each pod holds.
        candidates: Node names the plan may run on, from today's node facts
            (:func:`~verl_operator.placement.request.plan_candidates`; None: every node is a candidate).
        gpu_product: Required ``nvidia.com/gpu.product`` (None: any).
        node_selector: Labels every chosen node must carry.
        nvlink_required: ``spec.placement.nvlink == "required"``.
        nvlink_group_size: GPUs that must share one NVLink domain (max of rollout TP and SP), 1 = none.
        topology_key: Node label naming a network domain (rack, block).
        topology_policy: ``required``: all nodes in one domain; ``preferred``: try that first.
        preferred_domains: Without a topology policy, the network labels a multi-node job tries in turn, from
            the narrowest domain to the widest (``planner.facts.NETWORK_DOMAINS``); empty: none.
        trainer_nnodes: A job of two pools on separate nodes (``plan.pools``): the pods holding the trainer
            pool; the other ``nnodes - trainer_nnodes`` hold the rollout pool. 0: one pool, or both pools on
            every pod.
        rollout_replica_gpus: GPUs of one rollout replica (its TP x DP), which must share an NVLink domain of
            a rollout pod's node.
        pool_domains: The network labels, narrowest first, the trainer pool is kept inside and the rollout
            pool is kept near (``planner.facts.NETWORK_DOMAINS``).
    """

    nnodes: int
    gpus_per_node: int
    candidates: frozenset[str] | None = None
    gpu_product: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    nvlink_required: bool = False
    nvlink_group_size: int = 1
    topology_key: str | None = None
    topology_policy: TopologyPolicy | None = None
    preferred_domains: tuple[str, ...] = ()
    trainer_nnodes: int = 0
    rollout_replica_gpus: int = 1
    pool_domains: tuple[str, ...] = ()

    @property
    def two_pools(self) -> bool:
        """The trainer pool and the rollout pool on separate pods (each pod holds one pool's GPUs)."""
        return 0 < self.trainer_nnodes < self.nnodes

    @property
    def multi_node_nvlink(self) -> bool:
        """True when one NVLink group spans several nodes (needs one ``nvidia.com/gpu.clique``)."""
        return self.nvlink_required and nvlink_spans_nodes(self.nvlink_group_size, self.gpus_per_node)


@dataclass(frozen=True)
class Placement:
    """The outcome of :func:`verl_operator.placement.place`.

    Attributes:
        feasible: True when ``nodes`` holds the whole job (never a partial placement).
        nodes: Chosen node names; index 0 hosts the Ray head. Empty when not feasible. A job of two pools on
            separate pods: the trainer pool's nodes first (``trainer_nodes`` of them), then the rollout pool's.
        domain: The topology domain (value of the topology key) the nodes share, if one was required or found.
        clique: The NVLink clique the nodes share, if multi-node NVLink was required.
        excluded: ``(node, reason)`` for every node that could not take a pod, sorted by node name.
        message: One line for a status condition: the choice, or what is missing.
        trainer_nodes: How many of ``nodes`` (the first) hold the trainer pool; 0: every node holds the whole
            job's pool(s).
    """

    feasible: bool
    nodes: tuple[str, ...] = ()
    domain: str | None = None
    clique: str | None = None
    excluded: tuple[tuple[str, str], ...] = ()
    message: str = ""
    trainer_nodes: int = 0

    def to_status(self, max_excluded: int = MAX_EXCLUDED_IN_STATUS) -> dict[str, object]:
        """The camelCase dict written to ``status.placement`` (at most ``max_excluded`` excluded nodes listed)."""
        return {
            "nodes": list(self.nodes),
            "domain": self.domain,
            "clique": self.clique,
            "message": self.message,
            "excluded": [{"node": n, "reason": r} for n, r in self.excluded[:max_excluded]],
            "excludedCount": len(self.excluded),
        }
