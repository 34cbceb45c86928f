"""Choosing the nodes of a planned job, all or nothing (the planner's search, `planner/search.py`, chooses its settings).

Algorithm:
    1. Screen every node (in name order) and record why it cannot take one of the job's pods: not a
       candidate of the plan, not schedulable, wrong GPU product, a missing selector label, an NVLink
       domain smaller than the job's NVLink group, no clique for a multi-node NVLink group, the topology
       label missing under ``topologyPolicy: required``, or too few free GPUs (allocatable minus in use).
    2. Group the remaining nodes by (topology domain, NVLink clique): the domain only when a topology
       policy is set or a default network domain is tried (step 4), the clique only when one NVLink group
       spans several nodes.
    3. Among groups with at least ``nnodes`` nodes choose the tightest fit: the smallest number of free
       GPUs left over in the group after placing the job, then the group key (name order). Inside the
       group take the nodes with the fewest free GPUs first (best fit, keeps whole nodes free for larger
       jobs), ties by name. The chosen nodes are returned in name order; the first hosts the Ray head.
    4. ``topologyPolicy: preferred`` runs steps 2-3 with the domain first and, when no domain can hold
       the job, again without it. A multi-node job without a topology policy tries the request's
       ``preferred_domains`` in turn (the network labels from the narrowest domain to the widest: a rack,
       then a block of racks), then no domain: its pods share the smallest domain that holds them.

    5. A job of two pools on separate pods (``trainer_nnodes``: verl's trainer pool and its standalone
       rollout pool) is one gang for steps 2-4; inside a group its nodes are chosen per pool. The trainer
       pool takes the tightest sub-domain of the group that holds it, by the network labels from the
       narrowest (a rack) to the widest, else the group's best-fit nodes; the rollout pool takes the rest,
       nearest the trainer first (its rack, then its block: the weight sync's NCCL path between the pools),
       then best fit. A rollout node must hold a replica (TP x DP GPUs) inside one NVLink domain
       (``nvlink: required``; else such nodes go first). Groups rank by the trainer's domain (narrowest
       first), then step 3's spare GPUs. The trainer's nodes come first in the placement (the first hosts
       the Ray head), then the rollout's, each in name order. A gang that fits one rack keeps both pools and
       the weight sync there.

    Worked example: 4 DGX nodes of 8 GPUs, racks a (dgx-0, dgx-1) and b (dgx-2, dgx-3), dgx-2 has 4 GPUs
    in use, job 2 x 8 with ``topologyPolicy: required``: dgx-2 is excluded (4 of 8 free), rack b keeps one
    node, rack a two: the job lands on dgx-0 (head) and dgx-1, domain ``a``.

The search is deterministic: the same request and snapshot give the same nodes, whatever the input order.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from verl_contract.gpu_product import same_product
from verl_operator.placement.model import NodeCapacity, Placement, PlacementRequest
from verl_operator.planner.mesh import fits_nvlink_domain

#: A group's chosen nodes: (trainer's domain rank, nodes in placement order, where the trainer pool sits).
Picked = tuple[int, tuple[str, ...], str | None]

GroupKey = tuple[str | None, str | None]


def screen_node(request: PlacementRequest, node: NodeCapacity, used: int) -> str | None:
    """Why ``node`` cannot take one pod of the job, or None when it can.

    Args:
        request: The job's request.
        node: The node.
        used: GPUs already requested on the node by other pods and reserved by other jobs.

    Returns:
        A short reason (Kueue TAS snapshot style), or None.
    """
    reason = static_reason(request, node)
    return reason if reason is not None else free_reason(request, node, used)


def static_reason(request: PlacementRequest, node: NodeCapacity) -> str | None:
    """The screens of :func:`screen_node` that read no GPU use: the same for a node until its facts change."""
    if request.candidates is not None and node.name not in request.candidates:
        return "not eligible in the plan (product, selector, taints or GPU count)"
    if not node.schedulable:
        return "not schedulable (cordoned or not Ready)"
    if request.gpu_product is not None and not same_product(node.gpu_product or "", request.gpu_product):
        return f"GPU product {node.gpu_product or 'unknown'}, job needs {request.gpu_product}"
    for key, value in sorted(request.node_selector.items()):
        if node.labels.get(key) != value:
            return f"label {key}={value} missing"
    if request.nvlink_required and request.nvlink_group_size > 1:
        reason = _nvlink_reason(request, node)
        if reason is not None:
            return reason
    if request.topology_policy == "required" and request.topology_key not in node.labels:
        return f"no {request.topology_key} label (topologyPolicy required)"
    return None


def free_reason(request: PlacementRequest, node: NodeCapacity, used: int) -> str | None:
    """The last screen of :func:`screen_node`: too few free GPUs (allocatable minus ``used``), else None."""
    free = node.gpus - used
    if free < request.gpus_per_node:
        return f"{max(free, 0)} of {node.gpus} GPUs free, job needs {request.gpus_per_node} per node"
    return None


def _nvlink_reason(request: PlacementRequest, node: NodeCapacity) -> str | None:
    group = request.nvlink_group_size
    if request.multi_node_nvlink:
        if node.clique is None:
            return f"NVLink group of {group} GPUs spans nodes but the node has no nvidia.com/gpu.clique"
        if node.nvlink_domain_size < node.gpus:
            return f"NVLink domain of {node.nvlink_domain_size} GPUs, the group spans nodes: needs all GPUs linked"
        return None
    # The planner's rule (``mesh.fits_nvlink_domain``) on the GPUs of the node the pod holds.
    if not fits_nvlink_domain(group, min(node.nvlink_domain_size, request.gpus_per_node)):
        return f"NVLink domain of {node.nvlink_domain_size} GPUs, job needs {group} GPUs per NVLink group"
    if node.nvlink_domain_size < node.gpus and request.gpus_per_node != node.gpus:
        # Partial domains (e.g. bridged pairs): which GPUs a partial request gets is the device plugin's
        # choice, so only a pod holding the whole node is sure to hold whole NVLink domains.
        return (
            f"NVLink domains of {node.nvlink_domain_size} GPUs only: a pod of {request.gpus_per_node} "
            f"GPUs must take the whole node ({node.gpus})"
        )
    return None


@dataclass(frozen=True)
class Screen:
    """A request shape's static screens on a snapshot (:func:`screen`): the same until a node's facts change.

    Attributes:
        static: ``(node, reason)`` of every node in name order; None: passes every screen but free GPUs.
        groups: Per topology key of the attempts (steps 3-4; None: no domain), the nodes that pass by group
            key (topology domain, NVLink clique), each group in name order.
    """

    static: tuple[tuple[NodeCapacity, str | None], ...]
    groups: Mapping[str | None, Mapping[GroupKey, tuple[NodeCapacity, ...]]]


def screen(request: PlacementRequest, nodes: Sequence[NodeCapacity]) -> Screen:
    """Step 1 of the module's algorithm without the free-GPU screen, and the groups of step 2, for ``nodes``
    in name order (the caller sorts them)."""
    static = tuple((n, static_reason(request, n)) for n in nodes)
    passing = [n for n, reason in static if reason is None]
    groups: dict[str | None, dict[GroupKey, tuple[NodeCapacity, ...]]] = {}
    for topology_key in _attempts(request):
        grouped: dict[GroupKey, list[NodeCapacity]] = {}
        for node in passing:
            key = _group_key(request, node, topology_key)
            if key is not None:
                grouped.setdefault(key, []).append(node)
        groups[topology_key] = {k: tuple(v) for k, v in grouped.items()}
    return Screen(static=static, groups=groups)


def place(request: PlacementRequest, nodes: Sequence[NodeCapacity], used: Mapping[str, int]) -> Placement:
    """Choose ``request.nnodes`` nodes for the job, or say what is missing.

    Args:
        request: The job's request (from its spec and plan).
        nodes: The cluster snapshot.
        used: GPUs in use or reserved per node name (missing: 0).

    Returns:
        A feasible :class:`Placement` with every node, or an infeasible one with the reasons; never a part.
        :meth:`verl_operator.placement.index.NodeIndex.place` gives the same answer, keeping the
        :class:`Screen` of a request shape from one call to the next.
    """
    return place_screened(request, screen(request, sorted(nodes, key=lambda n: n.name)), used)


def place_screened(
    request: PlacementRequest,
    screened: Screen,
    used: Mapping[str, int],
    closed: frozenset[str] = frozenset(),
) -> Placement:
    """:func:`place` on nodes already screened (:func:`screen`); ``closed`` nodes are left out as if they were
    not in the snapshot. Reads each node's GPU use once; what it does per node is a lookup and a subtraction."""
    if request.nnodes < 1 or request.gpus_per_node < 1:
        return Placement(feasible=False, message="the plan asks for no nodes")
    free: dict[str, int] = {}
    excluded: list[tuple[str, str]] = []
    eligible: list[NodeCapacity] = []
    need = request.gpus_per_node
    busy: dict[tuple[int, int], str] = {}  # one reason text per (free, allocatable), not one per node
    for node, reason in screened.static:
        name = node.name
        if name in closed:
            continue
        if reason is None:
            left = node.gpus - used.get(name, 0)
            if left >= need:
                eligible.append(node)
                free[name] = left
                continue
            reason = busy.get((left, node.gpus))
            if reason is None:
                reason = busy[(left, node.gpus)] = (
                    f"{max(left, 0)} of {node.gpus} GPUs free, job needs {need} per node"
                )
        excluded.append((name, reason))
    excluded_t = tuple(excluded)

    use_domain = request.topology_policy is not None and request.topology_key is not None
    for topology_key in _attempts(request, request.nnodes):
        chosen = _best_group(request, screened.groups[topology_key], free)
        if chosen is not None:
            key, (_, names, trainer_where) = chosen
            where = []
            if key[0] is not None:
                where.append(f"{topology_key}={key[0]}")
            if key[1] is not None:
                where.append(f"clique {key[1]}")
            suffix = f" in {', '.join(where)}" if where else ""
            message = f"{request.nnodes} x {request.gpus_per_node} GPUs on {', '.join(names)}{suffix}"
            if request.two_pools:
                t = request.trainer_nnodes
                at = f" ({trainer_where})" if trainer_where else ""
                message = (
                    f"{request.nnodes} x {request.gpus_per_node} GPUs{suffix}: trainer pool on "
                    f"{', '.join(names[:t])}{at}, rollout pool on {', '.join(names[t:])}"
                )
            return Placement(
                feasible=True,
                nodes=names,
                domain=key[0],
                clique=key[1],
                excluded=excluded_t,
                message=message,
                trainer_nodes=request.trainer_nnodes if request.two_pools else 0,
            )
    return Placement(
        feasible=False, excluded=excluded_t, message=_missing(request, eligible, excluded_t, use_domain)
    )


def _attempts(request: PlacementRequest, nnodes: int | None = None) -> list[str | None]:
    """Steps 3-4, the topology key of each attempt (None: no domain): the policy's key (then, when preferred,
    none); without a policy, the preferred domains, then none. ``nnodes`` 1: a single node needs no domain
    but the policy's (None: every key the request's shape may try, for :func:`screen`)."""
    if request.topology_policy is not None and request.topology_key is not None:
        return (
            [request.topology_key, None] if request.topology_policy == "preferred" else [request.topology_key]
        )
    if nnodes == 1:
        return [None]
    return [*request.preferred_domains, None]


def _group_key(request: PlacementRequest, node: NodeCapacity, topology_key: str | None) -> GroupKey | None:
    domain = None
    if topology_key is not None:
        domain = node.labels.get(topology_key)
        if domain is None:
            return None
    clique = node.clique if request.multi_node_nvlink else None
    return (domain, clique)


def _best_group(
    request: PlacementRequest, groups: Mapping[GroupKey, Sequence[NodeCapacity]], free: Mapping[str, int]
) -> tuple[GroupKey, Picked] | None:
    """Step 3: the tightest group of at least ``nnodes`` nodes with the GPUs free (``free``: the nodes that
    have them), and its best-fit nodes (step 5: per pool)."""
    best: tuple[tuple[int, int, str, str], GroupKey, Picked] | None = None
    needed = request.nnodes * request.gpus_per_node
    for key, group in groups.items():
        members = [(free[n.name], n.name) for n in group if n.name in free]
        if len(members) < request.nnodes:
            continue
        spare = sum(f for f, _ in members) - needed
        if best is not None and (0, spare, key[0] or "", key[1] or "") >= best[0]:
            continue  # no pick of this group can rank better
        if request.two_pools:
            picked = _pick_pools(request, [n for n in group if n.name in free], free)
            if picked is None:
                continue
        else:
            # Fewest free GPUs first, then the name: == sorted(members)[:nnodes] (heapq documents it),
            # without sorting a group of thousands of nodes.
            chosen = heapq.nsmallest(request.nnodes, members)
            picked = (0, tuple(sorted(name for _, name in chosen)), None)
        rank = (picked[0], spare, key[0] or "", key[1] or "")
        if best is None or rank < best[0]:
            best = (rank, key, picked)
    return None if best is None else (best[1], best[2])


def rollout_fits(request: PlacementRequest, node: NodeCapacity) -> bool:
    """A rollout replica (TP x DP GPUs) sits inside one NVLink domain of the GPUs a rollout pod holds on
    ``node`` (the planner's rule, ``mesh.fits_nvlink_domain``); a partial domain only when the pod holds the
    whole node (the device plugin chooses the GPUs of a partial request). A replica larger than a pod spans
    nodes: the gang's own clique screen (step 1) covers it."""
    replica, gpn = request.rollout_replica_gpus, request.gpus_per_node
    if replica <= 1 or replica > gpn:
        return True
    if not fits_nvlink_domain(replica, min(node.nvlink_domain_size, gpn)):
        return False
    return node.nvlink_domain_size >= node.gpus or gpn == node.gpus


def _pick_pools(
    request: PlacementRequest, group: Sequence[NodeCapacity], free: Mapping[str, int]
) -> Picked | None:
    """Step 5 in one group: the trainer pool's nodes in the tightest, narrowest network domain that holds
    them, then the rollout pool's nearest them; None when the group has too few nodes for a rollout pod."""
    t = request.trainer_nnodes
    r = request.nnodes - t
    strict = request.nvlink_required
    rollout_ok = {n.name for n in group if rollout_fits(request, n)}
    need = t * request.gpus_per_node

    def rollout_left(trainer: Sequence[NodeCapacity]) -> int:
        names = {n.name for n in trainer}
        return sum(1 for n in group if n.name not in names and (not strict or n.name in rollout_ok))

    trainer: list[NodeCapacity] | None = None
    level, where = len(request.pool_domains), None
    for i, label in enumerate(request.pool_domains):
        by_value: dict[str, list[NodeCapacity]] = {}
        for node in group:
            value = node.labels.get(label)
            if value is not None:
                by_value.setdefault(value, []).append(node)
        options = []
        for value, nodes in by_value.items():
            if len(nodes) < t:
                continue
            # Trainer nodes that cannot hold a replica first: keeps the ones that can for the rollout pool.
            chosen = heapq.nsmallest(t, nodes, key=lambda n: (n.name in rollout_ok, free[n.name], n.name))
            if rollout_left(chosen) < r:
                continue
            options.append((sum(free[n.name] for n in nodes) - need, value, chosen))
        if options:
            _, value, trainer = min(options, key=lambda o: (o[0], o[1]))
            level, where = i, f"{label}={value}"
            break
    if trainer is None:
        trainer = heapq.nsmallest(t, group, key=lambda n: (n.name in rollout_ok, free[n.name], n.name))
        if rollout_left(trainer) < r:
            return None
    taken = {n.name for n in trainer}
    shared: list[tuple[str, str]] = []
    for label in request.pool_domains:
        values = {n.labels.get(label) for n in trainer}
        if len(values) == 1 and (value := values.pop()) is not None:
            shared.append((label, value))

    def nearness(node: NodeCapacity) -> int:
        return next((i for i, (k, v) in enumerate(shared) if node.labels.get(k) == v), len(shared))

    rest = [n for n in group if n.name not in taken and (not strict or n.name in rollout_ok)]
    rollout = heapq.nsmallest(
        r, rest, key=lambda n: (nearness(n), n.name not in rollout_ok, free[n.name], n.name)
    )
    if len(rollout) < r:
        return None
    names = tuple(sorted(n.name for n in trainer)) + tuple(sorted(n.name for n in rollout))
    return level, names, where


def _missing(
    request: PlacementRequest,
    eligible: Sequence[NodeCapacity],
    excluded: Sequence[tuple[str, str]],
    by_domain: bool,
) -> str:
    need = f"{request.nnodes} nodes with {request.gpus_per_node} free GPUs"
    scopes = []
    if by_domain and request.topology_policy == "required":
        scopes.append(f"one {request.topology_key} domain")
    if request.multi_node_nvlink:
        scopes.append("one NVLink clique")
    if scopes:
        need += " in " + " and ".join(scopes)
    if request.two_pools and request.nvlink_required and request.rollout_replica_gpus > 1:
        need += (
            f", {request.nnodes - request.trainer_nnodes} of them for the rollout pool with an NVLink domain "
            f"that holds a replica of {request.rollout_replica_gpus} GPUs"
        )
    counts: dict[str, int] = {}
    for _, reason in excluded:
        counts[reason] = counts.get(reason, 0) + 1
    top = "; ".join(
        f"{count} node{'s' if count > 1 else ''}: {reason}"
        for reason, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    )
    msg = f"waiting for capacity: job needs {need}; {len(eligible)} node(s) qualify"
    if scopes and eligible:
        together = max(
            _count_by_group(request, eligible, by_domain and request.topology_policy == "required").values()
        )
        msg += f" (at most {together} together)"
    return f"{msg}; excluded: {top}" if top else msg


def _count_by_group(
    request: PlacementRequest, eligible: Sequence[NodeCapacity], by_domain: bool
) -> dict[GroupKey, int]:
    counts: dict[GroupKey, int] = {}
    for node in eligible:
        key = _group_key(request, node, request.topology_key if by_domain else None)
        if key is not None:
            counts[key] = counts.get(key, 0) + 1
    return counts or {(None, None): 0}
