"""The placement request of a job: its plan, its spec, and the plan's candidate nodes on today's nodes."""

from __future__ import annotations

from collections.abc import Sequence

from verl_operator.api.plan import Plan
from verl_operator.api.spec import VerlJobSpec
from verl_operator.placement.model import PlacementRequest
from verl_operator.planner.cluster import layouts, select
from verl_operator.planner.facts import NETWORK_DOMAINS, NodeFacts


def request_from_plan(
    plan: Plan, spec: VerlJobSpec, candidates: frozenset[str] | None = None
) -> PlacementRequest:
    """Build the :class:`PlacementRequest` for the planner's ``plan`` of ``spec``.

    Args:
        plan: The plan (from the planner or read back from ``status.plan``).
        spec: The job's spec.
        candidates: The plan's candidate nodes on today's nodes (:func:`plan_candidates`); None: every node
            that passes placement's own screens.
    """
    pools = plan.pools
    two_pools = pools is not None and pools.rollout is not None and not pools.shared_nodes
    return PlacementRequest(
        nnodes=plan.nnodes,
        gpus_per_node=plan.gpus_per_node,
        candidates=candidates,
        # The planned pool's own label value (the spec may spell the product another way).
        gpu_product=(plan.node_pool.gpu_product or spec.resources.gpu_product)
        if spec.resources.gpu_product
        else None,
        node_selector=dict(spec.resources.node_selector),
        nvlink_required=spec.placement.nvlink == "required",
        nvlink_group_size=plan.nvlink_group_size,
        topology_key=spec.placement.topology_key,
        topology_policy=spec.placement.topology_policy,
        preferred_domains=NETWORK_DOMAINS if spec.placement.topology_policy is None else (),
        # Two pools on separate pods: the trainer's pods, a rollout replica's GPUs, the domains they keep to.
        trainer_nnodes=pools.trainer.nnodes if two_pools and pools is not None else 0,
        rollout_replica_gpus=(
            pools.rollout.tensor_parallel_size * pools.rollout.data_parallel_size
            if two_pools and pools is not None and pools.rollout is not None
            else 1
        ),
        pool_domains=NETWORK_DOMAINS if two_pools else (),
    )


def plan_candidates(plan: Plan, spec: VerlJobSpec, nodes: Sequence[NodeFacts]) -> tuple[str, ...]:
    """The nodes ``plan`` may run on among ``nodes``, as the planner chose them: the pool of the plan's GPU
    product, GPU memory and product label, and its layout of ``gpusPerNode`` GPUs per node (the nodes with
    that many GPUs, the pod's CPUs and memory, in a large enough topology domain), in the planner's order.

    The plan carries only their count and a sample (``candidateNodeCount``, ``candidateNodesSample``), so a
    plan read back from ``status`` after a restart places as the planner's own: the same functions run on
    the same facts. When several pools give the plan's layout (another intra-node NVLink size clipped to the
    same group), the first in the planner's pool order is the plan's. No pool or layout of the plan today
    (its nodes are gone): no candidates.
    """
    pools, _ = select(nodes, spec)
    pool_plan = plan.node_pool
    for pool in pools:
        same_pool = (
            pool.product == pool_plan.gpu_product
            and pool.memory_mib == pool_plan.gpu_memory_mib
            and dict(pool.selector) == pool_plan.product_selector
        )
        if not same_pool:
            continue
        for layout in layouts(pool, spec, plan.gpus_per_node):
            if layout.nnodes == plan.nnodes and layout.nvlink_domain == pool_plan.nvlink_domain_size:
                return layout.candidates
    return ()
