"""``plan_job``: a VerlJob spec plus the cluster's Node objects in, a plan or violations out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from verl_operator.api.plan import PlanResult, Violation
from verl_operator.api.spec import VerlJobSpec
from verl_operator.planner.budget import Budget, PlanTooLarge, limited, spend
from verl_operator.planner.cluster import Layout, Pool, cpu_needed, layouts, select
from verl_operator.planner.facts import NodeFacts, node_facts
from verl_operator.planner.job_pools import plan_modes
from verl_operator.planner.mesh import pod_memory
from verl_operator.planner.report import build_result
from verl_operator.planner.resolve import Resolved, resolve
from verl_operator.planner.search import Failed, Found, search
from verl_operator.planner.split_model import Measured


def _infeasible(violations: list[Violation], warnings: list[str] | None = None) -> PlanResult:
    """A result without a plan."""
    return PlanResult(feasible=False, violations=violations, warnings=list(warnings or []), plan=None)


def plan_job(
    spec: VerlJobSpec,
    nodes: Sequence[Mapping[str, Any] | NodeFacts],
    budget: Budget | None = None,
    measured: Measured | None = None,
) -> PlanResult:
    """Plan a VerlJob on the cluster's nodes.

    Pure: the same spec and nodes give the same result; no clock, environment, network or Kubernetes client.
    Bounded: the search takes at most ``budget.steps`` steps (``budget.MAX_STEPS`` by default); a spec that
    needs more is answered with a ``plan-too-large`` violation (as is one past a deadline the caller set).

    Algorithm:
        1. Resolve the model shape (``spec.model.shape`` or the built-in catalog), parse the overrides and merge
           them with the structured fields into pinned inputs (conflicts are violations).
        2. Read the nodes' facts, drop ineligible nodes (with reasons) and group the rest into pools of one GPU
           product; pools are tried smallest GPU memory first, layouts most GPUs per node first.
        3. For each layout, search the open settings (``search.search``) and return the first valid plan.
        Example: Qwen2.5-7B GRPO on one 8 x H100 node, nothing pinned -> 1 node x 8 GPUs, SP 1, fsdpSize -1,
        rollout.n 5, trainBatchSize 1024 (the multiple of 8 / gcd(8, 5) = 8 nearest verl's default 1024),
        ppoMiniBatchSize 256 (1024 / 4), rollout TP 1.

    Args:
        spec: The job spec.
        nodes: Kubernetes Node objects as camelCase dicts, or their :class:`NodeFacts` already read (the
            operator keeps them per Node, so a plan does not re-read every Node object).
        measured: A previous run's measured rollout:trainer balance (``advisor.balance``): it chooses a
            two-pool job's split when the spec leaves it open (else the throughput model does).

    Returns:
        The result: ``feasible`` with a plan, or the violations.
    """
    budget = budget if budget is not None else Budget()
    try:
        with limited(budget):
            return plan_modes(spec, nodes, _plan, measured)  # the trainer mode's pools (planner/job_pools.py)
    except PlanTooLarge as exc:
        return _infeasible([too_large(spec, exc)])


def too_large(spec: VerlJobSpec, exc: PlanTooLarge) -> Violation:
    """The violation for a plan that ran out of its budget."""
    return Violation(
        field="spec",
        rule="plan-too-large",
        message=(
            f"the job is too large to plan: {exc.why} ({spec.resources.gpus} GPUs; every open setting multiplies "
            "the candidates)"
        ),
        suggestions=[
            "pin spec.rollout.tensorParallelSize, spec.parallelism.sequenceParallelSize and the batch sizes",
            "or set spec.resources.gpusPerNode",
        ],
    )


def _plan(
    spec: VerlJobSpec, nodes: Sequence[Mapping[str, Any] | NodeFacts], standalone_rollout: bool = False
) -> PlanResult:
    """Plan one pool; ``standalone_rollout``: its GPUs hold no rollout replica (``Problem.standalone_rollout``)."""
    resolved = resolve(spec)
    if isinstance(resolved, list):
        return _infeasible(resolved)
    if standalone_rollout:
        resolved = replace(resolved, problem=replace(resolved.problem, standalone_rollout=True))
    if spec.model.dtype == "float16" and spec.verl.version == "0.6" and resolved.problem.needs_critic:
        return _infeasible([_fp16_critic_06()])
    result = _plan_resolved(spec, resolved, nodes)
    if not resolved.warnings:
        return result
    return result.model_copy(update={"warnings": [*resolved.warnings, *result.warnings]})


def _plan_resolved(
    spec: VerlJobSpec, resolved: Resolved, nodes: Sequence[Mapping[str, Any] | NodeFacts]
) -> PlanResult:
    """Steps 2-3 of ``plan_job`` for a resolved spec."""
    gpn_val = resolved.gpus_per_node

    # The cluster.
    facts = [n if isinstance(n, NodeFacts) else node_facts(n) for n in nodes]
    pools, excluded = select(facts, spec)
    if not pools:
        return _infeasible(
            [
                Violation(
                    field="spec.resources",
                    rule="no-eligible-nodes",
                    message=f"none of the {len(facts)} nodes can host the job" + _reasons_text(excluded),
                    suggestions=_exclusion_suggestions(excluded),
                )
            ]
        )

    # The nearest miss over all pools and layouts: the one that got furthest, the last of those (larger GPUs).
    nearest: Failed | None = None
    nearest_pool: Pool | None = None
    any_layout = False
    for pool in pools:
        for layout in layouts(pool, spec, gpn_val):
            spend()
            any_layout = True
            partial, whole = _domain_fit(pool, layout)
            problem = replace(
                resolved.problem,
                gpu_memory_bytes=pool.memory_mib * 1024 * 1024,
                nvlink_domain=layout.nvlink_domain,
            )
            problem = replace(problem, partial_domain_nodes=partial, whole_node_fits=whole)
            outcome = search(problem, layout, resolved.fixed, resolved.default_rollout_n)
            if isinstance(outcome, Found):
                return build_result(
                    problem,
                    layout,
                    pool,
                    excluded,
                    outcome,
                    resolved.passthrough,
                )
            if nearest is None or outcome.depth >= nearest.depth:
                nearest, nearest_pool = outcome, pool
    if not any_layout:
        return _infeasible([capacity_violation(spec, pools, gpn_val)])
    if nearest is None or nearest_pool is None:
        return _infeasible([])
    return _infeasible(_memory_from_spec(nearest.violations, nearest_pool, spec))


def _memory_from_spec(violations: Sequence[Violation], pool: Pool, spec: VerlJobSpec) -> list[Violation]:
    """A GPU memory that only ``spec.resources.gpuMemoryMiB`` gives (the pool's nodes publish none): a memory
    violation names that field, with the value it took, not the GPU count."""
    mib = spec.resources.gpu_memory_mib
    if mib is None or any(n.gpu_memory_mib is not None for n in pool.nodes):
        return list(violations)
    out = []
    for v in violations:
        if v.rule.startswith("memory-") and v.field == "spec.resources.gpus":
            v = v.model_copy(
                update={
                    "field": "spec.resources.gpuMemoryMiB",
                    "message": f"{v.message} (spec.resources.gpuMemoryMiB {mib}: the nodes publish no GPU memory)",
                    "suggestions": [
                        "set spec.resources.gpuMemoryMiB to one GPU's memory in MiB (an H100 80GB: 81559)",
                        *v.suggestions,
                    ],
                }
            )
        out.append(v)
    return out


def _domain_fit(pool: Pool, layout: Layout) -> tuple[int, int]:
    """``Problem.partial_domain_nodes`` and ``whole_node_fits`` of a layout (see ``rules_rollout.nvlink_groups``)."""
    chosen = set(layout.candidates)
    partial = [n for n in pool.nodes if n.name in chosen and n.nvlink_domain_size < n.gpus]
    return len(partial), sum(n.gpus == layout.gpus_per_node for n in partial)


def capacity_violation(spec: VerlJobSpec, pools: Sequence[Pool], gpus_per_node: int | None) -> Violation:
    """Why no pool has a layout for the job: the GPU count, the GPUs per node, CPUs or a topology domain."""
    gpus = spec.resources.gpus
    pool_text = "; ".join(
        f"{len(p.nodes)} x {p.product} with up to {max(n.gpus for n in p.nodes)} GPUs" for p in pools
    )
    message = f"{gpus} GPUs" + (f" at {gpus_per_node} per node" if gpus_per_node else "")
    message += f" do not fit the eligible nodes ({pool_text})"
    suggestions = [
        "use a GPU count that is a multiple of the GPUs per node",
        f"at most {max(len(p.nodes) for p in pools)} nodes are eligible in one pool",
    ]
    key = spec.placement.topology_key
    if key and spec.placement.topology_policy == "required":
        labelled = [n for p in pools for n in p.nodes if key in n.labels]
        domains: dict[str, int] = {}
        for n in labelled:
            domains[n.labels[key]] = domains.get(n.labels[key], 0) + 1
        largest = max(domains.values(), default=0)
        message += (
            f" within one {key} domain (topologyPolicy: required; the largest has {largest} eligible nodes, "
            f"{sum(len(p.nodes) for p in pools) - len(labelled)} eligible nodes lack the label)"
        )
        suggestions.append("set spec.placement.topologyPolicy: preferred")
    # Per pod of the largest layout the pools could offer (the pinned GPUs per node when given).
    per = gpus_per_node or max(1, min(gpus, max((n.gpus for p in pools for n in p.nodes), default=1)))
    suggestions.append(
        f"nodes need {cpu_needed(spec, per) // 1000}+ allocatable CPUs per {per} GPUs (verl's placement group) "
        f"and the pod's memory request, {pod_memory(spec.resources.memory_per_node, per)} per {per} GPUs "
        "(spec.resources.memoryPerNode)"
    )
    return Violation(
        field="spec.resources.gpus", rule="not-enough-gpus", message=message, suggestions=suggestions
    )


def _reasons_text(excluded: Mapping[str, str]) -> str:
    """`` (2 nodes: reason; gpu-3: reason)``: the five commonest reasons, with a count or the node's name."""
    by_reason: dict[str, list[str]] = {}
    for node, reason in excluded.items():
        by_reason.setdefault(reason, []).append(node)
    if not by_reason:
        return ""
    ordered = sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:5]
    parts = [
        f"{nodes[0] if len(nodes) == 1 else f'{len(nodes)} nodes'}: {reason}" for reason, nodes in ordered
    ]
    return f" ({'; '.join(parts)})"


def _exclusion_suggestions(excluded: Mapping[str, str]) -> list[str]:
    """What would make an excluded node eligible, by the kinds of reasons seen."""
    text = " ".join(excluded.values())
    out: list[str] = []
    if "bfloat16" in text:
        out.append("set spec.model.dtype: float16 for GPUs older than compute capability 8.0")
    if "MIG" in text or "time-sliced" in text:
        out.append(
            "use nodes with whole GPUs: MIG disabled (nvidia.com/mig.config=all-disabled), no time-slicing"
        )
    if "GPU memory unknown" in text:
        out.append("set spec.resources.gpuMemoryMiB or label the nodes nvidia.com/gpu.memory=<MiB>")
    return out or ["check spec.resources.gpuProduct, nodeSelector and tolerations"]


def _fp16_critic_06() -> Violation:
    return Violation(
        field="spec.model.dtype",
        rule="dtype",
        message=(
            "float16 with a critic (algorithm ppo) on verl 0.6: its critic's FSDP wrapper always uses bfloat16 "
            "parameters unless a mixed_precision block is given (workers/fsdp_workers.py, CriticWorker "
            "_build_critic_model_optimizer), which 0.6's critic config cannot take"
        ),
        suggestions=["use spec.verl.version 0.9", "or a critic-free algorithm (grpo)", "or bfloat16 GPUs"],
    )
