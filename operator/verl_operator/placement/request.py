"""The placement request of a job: its plan (the planner's camelCase JSON) and its spec."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_operator.api.spec import VerlJobSpec
from verl_operator.placement.model import PlacementRequest


def request_from_plan(plan: Mapping[str, Any], spec: VerlJobSpec) -> PlacementRequest:
    """Build the :class:`PlacementRequest` for ``plan`` (``PlanResult.to_json_dict()["plan"]``) and ``spec``."""
    return PlacementRequest(
        nnodes=int(plan["nnodes"]),
        gpus_per_node=int(plan["gpusPerNode"]),
        candidates=tuple(plan.get("candidateNodes") or ()),
        gpu_product=spec.resources.gpu_product,
        node_selector=dict(spec.resources.node_selector),
        nvlink_required=spec.placement.nvlink == "required",
        nvlink_group_size=int(plan.get("nvlinkGroupSize") or 1),
        topology_key=spec.placement.topology_key,
        topology_policy=spec.placement.topology_policy,
    )
