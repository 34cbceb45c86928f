"""Concrete node placement of a planned VerlJob (pure: values in, a value out).

The planner decides *how many* nodes and GPUs per node a job needs and which nodes qualify at all; this
package decides *which* nodes, given the GPUs already taken on each node. It imports no Kubernetes client:
the controller builds a snapshot (:class:`NodeCapacity` per node plus GPUs in use) and calls :func:`place`.
"""

from __future__ import annotations

from verl_operator.placement.choose import place
from verl_operator.placement.model import NodeCapacity, Placement, PlacementRequest
from verl_operator.placement.request import plan_candidates, request_from_plan

__all__ = ["NodeCapacity", "Placement", "PlacementRequest", "place", "plan_candidates", "request_from_plan"]
