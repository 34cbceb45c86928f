"""The placement request of a job: its plan and its spec."""

from __future__ import annotations

from verl_operator.api.plan import Plan
from verl_operator.api.spec import VerlJobSpec
from verl_operator.placement.model import PlacementRequest


def request_from_plan(plan: Plan, spec: VerlJobSpec) -> PlacementRequest:
    """Build the :class:`PlacementRequest` for the planner's ``plan`` of ``spec``."""
    return PlacementRequest(
        nnodes=plan.nnodes,
        gpus_per_node=plan.gpus_per_node,
        candidates=tuple(plan.candidate_nodes),
        # The planned pool's own label value (the spec may spell the product another way).
        gpu_product=(plan.node_pool.gpu_product or spec.resources.gpu_product)
        if spec.resources.gpu_product
        else None,
        node_selector=dict(spec.resources.node_selector),
        nvlink_required=spec.placement.nvlink == "required",
        nvlink_group_size=plan.nvlink_group_size,
        topology_key=spec.placement.topology_key,
        topology_policy=spec.placement.topology_policy,
    )
