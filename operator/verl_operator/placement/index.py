"""A node snapshot kept between placements: the nodes in name order and each request shape's static screens.

:func:`~verl_operator.placement.choose.place` screens every node of the snapshot on every call: whether the
node is a candidate of the plan, schedulable, of the job's GPU product, carries its selector labels, its
NVLink domains and topology label; then the free GPUs. Only the last screen reads GPU use. A
:class:`NodeIndex` is built once per version of the nodes' facts (the watch cache replaces it when a Node
changes a fact) and keeps, per request shape (:func:`shape_of`: the request without its node count), the
nodes with their static screen (:func:`~verl_operator.placement.choose.static_reason`) and the passing ones
grouped by topology domain and NVLink clique (:class:`~verl_operator.placement.choose.Screen`), so a
placement reads the free GPUs of the nodes that pass and nothing else; the nodes that fail keep their reason.

It answers exactly as :func:`~verl_operator.placement.choose.place` does on the same nodes (a unit test
compares them on random snapshots). Thread-safe: reconciles and admission reviews share an index.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Mapping, Sequence

from verl_operator.placement.choose import Screen, place_screened, screen
from verl_operator.placement.model import NodeCapacity, Placement, PlacementRequest

#: Request shapes an index keeps screens for (a shape holds a pair per node: 0.34 MB at 5000 nodes, at most
#: 22 MB): more than the distinct pools, selectors, GPUs per node and NVLink groups of
#: a cluster's queue; past it the oldest is dropped.
MAX_SHAPES = 64


def shape_of(request: PlacementRequest) -> Hashable:
    """What the static screens of ``request`` read: everything but its node count."""
    return (
        request.candidates,
        request.gpus_per_node,
        request.gpu_product,
        tuple(sorted(request.node_selector.items())),
        request.nvlink_required,
        request.nvlink_group_size,
        request.topology_key,
        request.topology_policy,
        request.preferred_domains,
    )


class NodeIndex:
    """The nodes of one snapshot in name order, with the static screens of the request shapes placed on it."""

    def __init__(self, nodes: Sequence[NodeCapacity]) -> None:
        self.nodes: tuple[NodeCapacity, ...] = tuple(sorted(nodes, key=lambda n: n.name))
        self._lock = threading.Lock()
        self._screens: dict[Hashable, Screen] = {}

    def screened(self, request: PlacementRequest) -> Screen:
        """The :class:`~verl_operator.placement.choose.Screen` of ``request``'s shape (computed once per shape)."""
        key = shape_of(request)
        with self._lock:
            found = self._screens.get(key)
        if found is not None:
            return found
        screened = screen(request, self.nodes)
        with self._lock:
            if len(self._screens) >= MAX_SHAPES:
                self._screens.pop(next(iter(self._screens)))
            self._screens[key] = screened
        return screened

    def place(
        self, request: PlacementRequest, used: Mapping[str, int], closed: frozenset[str] = frozenset()
    ) -> Placement:
        """:func:`~verl_operator.placement.choose.place` on the index's nodes less ``closed``."""
        return place_screened(request, self.screened(request), used, closed)

    def usable(self, request: PlacementRequest) -> set[str]:
        """The nodes that could take one pod of ``request`` were all their GPUs free."""
        return {
            n.name
            for n, reason in self.screened(request).static
            if reason is None and n.gpus >= request.gpus_per_node
        }
