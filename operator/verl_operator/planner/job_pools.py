"""Planning a job in its trainer mode: one pool (the colocated planner alone) or a trainer pool and a rollout
pool (the colocated planner on the trainer pool's GPUs, the rollout pool's replicas, the mode's rules)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from verl_operator.api.plan import (
    CANDIDATE_SAMPLE,
    Plan,
    PlanResult,
    PoolPlan,
    PoolsPlan,
    RolloutPoolPlan,
    Violation,
)
from verl_operator.api.spec import VerlJobSpec
from verl_operator.planner import catalog, rules_async, split_model
from verl_operator.planner.cluster import Layout, layouts, select
from verl_operator.planner.facts import NodeFacts, node_facts
from verl_operator.planner.mesh import nvlink_group_per_node
from verl_operator.planner.overrides import OverrideError as _OverrideError
from verl_operator.planner.overrides import parse_override
from verl_operator.planner.pool_split import (
    Split,
    pinned_split,
    pool_overrides,
    recipe_overrides,
    trainer_spec,
)
from verl_operator.planner.pools import ARR, MAIN_PPO, ModeInputs, read_mode

#: At most this many splits are planned when the spec leaves the split open (nearest the model's first).
MAX_SPLITS = 6

#: The colocated planner: a spec, the nodes, and whether the pool's GPUs hold no rollout replica.
PlanOne = Callable[[VerlJobSpec, Sequence[Mapping[str, Any] | NodeFacts], bool], PlanResult]


def _infeasible(violations: list[Violation], warnings: Sequence[str] = ()) -> PlanResult:
    return PlanResult(feasible=False, violations=violations, warnings=list(warnings), plan=None)


def plan_modes(
    spec: VerlJobSpec,
    nodes: Sequence[Mapping[str, Any] | NodeFacts],
    plan_one: PlanOne,
    measured: split_model.Measured | None = None,
) -> PlanResult:
    """Plan ``spec`` in its trainer mode with ``plan_one`` (the colocated planner).

    Algorithm:
        1. Read the mode (``pools.read_mode``); verl's colocated trainer plans as before.
        2. Two pools: check the mode's rules on the keys (``rules_async.before_plan``); take the pinned split
           (``spec.resources.rolloutGpus`` or the pool keys), else the splits nearest the balance in whole
           nodes: a previous run's measured one (``measured``, from ``advisor.balance``) when given, else the
           throughput model's (``split_model``).
        3. For each split: plan the trainer pool on its GPUs, then the rollout pool's replicas; the first
           split that plans wins.
        Example: GRPO Qwen2.5-7B on 16 H100, separate_async, trainer.nnodes=1, rollout nnodes 1 -> trainer
        pool 1 x 8, rollout pool 1 x 8 (8 replicas of TP 1), 2 nodes.
    """
    inputs, violations, warnings = read_mode(spec)
    removed = rules_async.removed_keys(spec.verl.version, _keys(spec))
    if violations:
        return _infeasible(violations + removed, warnings)
    if not inputs.two_pools:
        if spec.resources.rollout_gpus is not None:
            return _infeasible([_no_rollout_pool(spec, inputs)], warnings)
        result = _with_removed(plan_one(spec, nodes, False), removed)
        if result.plan is not None and (inputs.mode != "sync" or inputs.entrypoint != MAIN_PPO):
            result = result.model_copy(update={"plan": _single(result.plan, inputs)})
        if result.plan is not None and inputs.emit:
            overrides = [*inputs.emit, *result.plan.overrides]
            result = result.model_copy(
                update={"plan": result.plan.model_copy(update={"overrides": overrides})}
            )
        return _warned(result, warnings)
    if removed:
        return _infeasible(removed, warnings)
    before = rules_async.before_plan(spec.verl.version, inputs, spec.rollout.mode)
    if before.violations:
        return _infeasible(before.violations, warnings)
    facts = [n if isinstance(n, NodeFacts) else node_facts(n) for n in nodes]
    node_gpus = max((f.gpus for f in facts), default=0) or spec.resources.gpus
    split, vs = pinned_split(spec, inputs, node_gpus)
    if vs:
        return _infeasible(vs, warnings)
    fraction = _fraction(spec, inputs)
    balance = measured.rollout_fraction if measured is not None else fraction
    source = "pinned" if split is not None else ("measured" if measured is not None else "model")
    splits = [split] if split is not None else _open_splits(spec, balance, node_gpus)
    if split is not None and measured is not None:
        near = _open_splits(spec, measured.rollout_fraction, node_gpus)[:1]
        if near and near[0].rollout_gpus != split.rollout_gpus:
            warnings = [
                *warnings,
                f"the spec pins {split.rollout_gpus} rollout GPUs; the measured balance "
                f"({measured.rollout_fraction:.0%} rollout) would give {near[0].rollout_gpus} "
                f"(spec.resources.rolloutGpus: {near[0].rollout_gpus})",
            ]
    if not splits:
        return _infeasible(
            [
                Violation(
                    field="spec.resources.gpus",
                    rule="pools-agree",
                    message=f"{spec.resources.gpus} GPU cannot hold a trainer pool and a rollout pool",
                    suggestions=["use 2 or more GPUs"],
                )
            ],
            warnings,
        )
    first: PlanResult | None = None
    for candidate in splits[:MAX_SPLITS]:
        result = _plan_split(spec, facts, inputs, before, candidate, node_gpus, plan_one)
        if result.plan is not None:
            pools = result.plan.pools
            assert pools is not None
            update: dict[str, Any] = {"split": source, "model_rollout_fraction": fraction}
            if measured is not None:
                update["measured_rollout_fraction"] = round(measured.rollout_fraction, 4)
                update["split_basis"] = measured.basis[:512]
            plan = result.plan.model_copy(update={"pools": pools.model_copy(update=update)})
            return _warned(result.model_copy(update={"plan": plan}), warnings)
        first = first or result
    assert first is not None
    return _warned(first, warnings)


def _no_rollout_pool(spec: VerlJobSpec, inputs: ModeInputs) -> Violation:
    """``spec.resources.rolloutGpus`` on a mode whose rollout shares the trainer's GPUs."""
    how = (
        "set spec.verl.trainerMode: separate_async"
        if spec.verl.version == "0.9"
        else "set spec.verl.entrypoint: recipe.fully_async_policy.fully_async_main (or one_step_off's)"
    )
    return Violation(
        field="spec.resources.rolloutGpus",
        rule="pool-size",
        message=(
            f"spec.resources.rolloutGpus {spec.resources.rollout_gpus}: the {inputs.mode} trainer "
            f"({inputs.entrypoint}) runs the rollout on the trainer's GPUs, it has no standalone rollout pool"
        ),
        suggestions=["drop spec.resources.rolloutGpus", how],
    )


def _plan_split(
    spec: VerlJobSpec,
    facts: Sequence[NodeFacts],
    inputs: ModeInputs,
    before: rules_async.Before,
    split: Split,
    node_gpus: int,
    plan_one: PlanOne,
) -> PlanResult:
    """The trainer pool planned on ``split``'s trainer GPUs, then the rollout pool."""
    tspec = trainer_spec(spec, inputs, split, before.extra, before.drop_keys)
    result = plan_one(tspec, facts, inputs.mode != "separate_async")
    if result.plan is None:
        return result
    plan = result.plan
    dp = _int(inputs, f"{ARR}.rollout.data_parallel_size") or 1
    rollout, vs, ws = rules_async.rollout_pool(
        spec.verl.version, inputs, split, plan.rollout.tensor_parallel_size, dp
    )
    if vs or rollout is None:
        return _infeasible(vs, result.warnings)
    job_layout = _job_layout(spec, facts, plan, split, node_gpus)
    if isinstance(job_layout, Violation):
        return _infeasible([job_layout], result.warnings)
    memory = _pool_memory(spec, inputs, plan, rollout)
    if isinstance(memory, Violation):
        return _infeasible([memory], result.warnings)
    (trainer_peak, trainer_parts), (rollout_peak, rollout_parts) = memory
    rollout = rollout.model_copy(update={"peak_gib": rollout_peak, "memory_gib": rollout_parts})
    overrides = [*inputs.emit, *(_replaced(o, before.replace) for o in plan.overrides)]
    overrides += pool_overrides(inputs, split) + before.emit + recipe_overrides(spec, inputs)
    pools = PoolsPlan(
        mode=inputs.mode,
        entrypoint=inputs.entrypoint,
        trainer=PoolPlan(
            gpus=split.trainer_gpus,
            nnodes=plan.nnodes,
            gpus_per_node=plan.gpus_per_node,
            mesh=_trainer_mesh(plan),
            peak_gib=trainer_peak,
            memory_gib=trainer_parts,
        ),
        rollout=rollout,
        nodes=split.nodes(node_gpus),
        shared_nodes=split.shared(node_gpus),
        split="pinned",
        invariants=before.invariants,
    )
    plan = plan.model_copy(
        update={
            "pools": pools,
            "overrides": overrides,
            # The job's pods hold both pools: placement, the pods, Kueue and launch.json read these.
            "nnodes": job_layout.nnodes,
            "gpus_per_node": job_layout.gpus_per_node,
            "nodes": list(job_layout.candidates[: job_layout.nnodes]),
            "candidate_node_count": len(job_layout.candidates),
            "candidate_nodes_sample": list(job_layout.candidates[:CANDIDATE_SAMPLE]),
            "cpu_per_node": job_layout.cpu_per_node or plan.cpu_per_node,
            "nvlink_group_per_node": nvlink_group_per_node(plan.nvlink_group_size, job_layout.gpus_per_node),
            "node_pool": plan.node_pool.model_copy(update={"nvlink_domain_size": job_layout.nvlink_domain}),
        }
    )
    return result.model_copy(update={"plan": plan, "warnings": [*result.warnings, *ws]})


def _job_layout(
    spec: VerlJobSpec, facts: Sequence[NodeFacts], plan: Plan, split: Split, node_gpus: int
) -> Layout | Violation:
    """The job's pods: ``nodes`` pods of one size that hold both pools, on the trainer plan's node pool.

    Both pools on the same nodes: pods of trainer + rollout GPUs per node; else one pod per pool node, which
    needs the pools' GPUs per node to agree (pods of one size make one gang for placement and Kueue).
    """
    if split.shared(node_gpus):
        pod_gpus = split.trainer_gpn + split.rollout_gpn
    elif split.trainer_gpn == split.rollout_gpn:
        pod_gpus = split.trainer_gpn
    else:
        return Violation(
            field="spec.overrides",
            rule="pools-layout",
            message=(
                f"the trainer pool's {split.trainer_gpn} GPUs per node and the rollout pool's {split.rollout_gpn} "
                f"make pods of two sizes on {split.nodes(node_gpus)} nodes: the job's pods are one gang of one size"
            ),
            suggestions=[
                f"give both pools {max(split.trainer_gpn, split.rollout_gpn)} GPUs per node",
                "or as many nodes each, with their GPUs per node together on one node",
            ],
        )
    nodes = split.nodes(node_gpus)
    pools, _ = select(facts, spec)
    pool_plan = plan.node_pool
    for pool in pools:
        if pool.product != pool_plan.gpu_product or pool.memory_mib != pool_plan.gpu_memory_mib:
            continue
        for layout in layouts(pool, spec, pod_gpus):
            if layout.nnodes == nodes:
                return layout
    return Violation(
        field="spec.resources.gpus",
        rule="not-enough-gpus",
        message=(
            f"both pools need {nodes} nodes with {pod_gpus} GPUs each ({split.trainer_gpus} trainer + "
            f"{split.rollout_gpus} rollout GPUs) on the trainer's node pool ({pool_plan.gpu_product}); "
            "the eligible nodes do not have them"
        ),
        suggestions=[
            "use fewer GPUs",
            f"at most {max((len(p.nodes) for p in pools), default=0)} nodes are eligible",
        ],
    )


GIB = 1024**3
STANDALONE_GMU = f"{ARR}.rollout.standalone_gpu_memory_utilization"
Parts = tuple[float, dict[str, float]]


def _pool_memory(
    spec: VerlJobSpec, inputs: ModeInputs, plan: Plan, rollout: RolloutPoolPlan
) -> tuple[Parts, Parts] | Violation:
    """Each pool's GPU: ``(peak GiB, parts)`` of the trainer's and of the rollout's.

    The trainer GPU of separate_async hosts hybrid replicas (the colocated estimate, every phase); that of
    fully_async and one_step_off holds no KV cache (the training and log-prob phases without vLLM's residue).
    A rollout GPU holds no optimizer: vLLM's budget (``gpu_memory_utilization``, or fully_async's
    ``standalone_gpu_memory_utilization`` for its standalone replicas: 0.9.1
    ``experimental/fully_async_policy/fully_async_rollouter.py`` lines 115-122) and the CUDA reserve; the
    replica's weights (TP-sharded) must leave room for the KV cache in that budget.
    """
    mem = plan.memory
    phases = [("rollout", mem.rollout), ("train", mem.train), ("logProb", mem.log_prob)]
    if inputs.mode != "separate_async":
        phases = phases[1:]
    trainer: Parts = (0.0, {})
    for _, phase in phases:
        parts = {
            k: v for k, v in phase.parts_gib.items() if inputs.mode == "separate_async" or k != "vllmResidual"
        }
        peak = round(
            phase.peak_gib
            - (phase.parts_gib.get("vllmResidual", 0.0) if inputs.mode != "separate_async" else 0.0),
            2,
        )
        if peak > trainer[0]:
            trainer = (peak, dict(list(parts.items())[:8]))
    gmu = plan.rollout.gpu_memory_utilization
    source = "the plan's gpu_memory_utilization"
    text = inputs.text(STANDALONE_GMU)
    if inputs.mode == "fully_async" and text is not None:
        try:
            gmu, source = float(text), inputs.source(STANDALONE_GMU)
        except ValueError:
            return Violation(
                field=inputs.source(STANDALONE_GMU),
                rule="rollout-pool-memory",
                message=f"{STANDALONE_GMU} {text!r} is not a number",
                suggestions=[f"set {STANDALONE_GMU} to a fraction such as 0.85"],
            )
    reserve = mem.rollout.parts_gib.get("cudaReserve", 0.0)
    budget = round(gmu * mem.gpu_memory_gib, 2)
    total = 0.0
    if spec.model.shape is not None:
        total = catalog.count_params(spec.model.shape)[0]
    elif (entry := catalog.lookup(spec.model.path)) is not None:
        total = entry.params_total
    weights = round(total * 2 / rollout.tensor_parallel_size / GIB, 2)  # bf16 / fp16 weights, TP-sharded
    if not 0 < gmu <= 1 or budget + reserve > mem.gpu_memory_gib:
        top = round((mem.gpu_memory_gib - reserve) / mem.gpu_memory_gib, 2)
        return Violation(
            field=source if source.startswith("spec.") else "spec.rollout",
            rule="rollout-pool-memory",
            message=(
                f"a rollout GPU's vLLM budget {gmu} x {mem.gpu_memory_gib} GiB = {budget} GiB plus the CUDA "
                f"reserve {reserve} GiB exceeds the GPU's {mem.gpu_memory_gib} GiB"
            ),
            suggestions=[f"use a memory utilization of at most {top}"],
        )
    if weights >= budget:
        return Violation(
            field=source if source.startswith("spec.") else "spec.rollout.tensorParallelSize",
            rule="rollout-pool-memory",
            message=(
                f"a rollout replica's weights, {weights} GiB per GPU at TP {rollout.tensor_parallel_size}, leave "
                f"no KV cache in vLLM's budget {gmu} x {mem.gpu_memory_gib} GiB = {budget} GiB"
            ),
            suggestions=["raise the rollout TP", f"or {STANDALONE_GMU} (fully_async)"],
        )
    rollout_parts = {
        "vllmBudget": budget,
        "modelWeights": weights,
        "kvCache": round(budget - weights, 2),
        "cudaReserve": reserve,
    }
    return trainer, (round(budget + reserve, 2), rollout_parts)


def _trainer_mesh(plan: Plan) -> str:
    t = plan.training
    if t is not None and t.engine == "megatron":
        return f"tp{t.tensor_parallel_size} pp{t.pipeline_parallel_size} cp{t.context_parallel_size} dp{t.data_parallel_size}"
    return f"dp{plan.data_parallel_size} sp{plan.sequence_parallel_size}"


def _single(plan: Plan, inputs: ModeInputs) -> Plan:
    """A one-pool mode's pools: the trainer's GPUs hold the rollout too."""
    pools = PoolsPlan(
        mode=inputs.mode,
        entrypoint=inputs.entrypoint,
        trainer=PoolPlan(
            gpus=plan.world_size,
            nnodes=plan.nnodes,
            gpus_per_node=plan.gpus_per_node,
            mesh=_trainer_mesh(plan),
        ),
        nodes=plan.nnodes,
        split="single",
    )
    return plan.model_copy(update={"pools": pools})


def _fraction(spec: VerlJobSpec, inputs: ModeInputs) -> float:
    """The throughput model's rollout share for the job's model and lengths."""
    prompt = _int(inputs, "data.max_prompt_length") or spec.data.max_prompt_length
    response = _int(inputs, "data.max_response_length") or spec.data.max_response_length
    prompt = spec.data.mean_prompt_length or prompt
    response = spec.data.mean_response_length or response
    total = active = 1.0
    if spec.model.shape is not None:
        total, active = catalog.count_params(spec.model.shape)
    elif (entry := catalog.lookup(spec.model.path)) is not None:
        total, active = entry.params_total, entry.params_active
    return round(split_model.rollout_fraction(inputs.mode, prompt, response, total, active), 4)


def _open_splits(spec: VerlJobSpec, fraction: float, node_gpus: int) -> list[Split]:
    """Splits in whole nodes (``spec.resources.gpusPerNode``, else the largest node's GPUs); a job of one node
    splits the node's GPUs (both pools on it)."""
    gpus = spec.resources.gpus
    unit = spec.resources.gpus_per_node or min(node_gpus, gpus)
    if gpus // unit >= 2 and gpus % unit == 0:
        return [
            Split(t // unit, unit, (gpus - t) // unit, unit)
            for t in split_model.candidates(gpus, unit, fraction)
        ]
    return [Split(1, t, 1, gpus - t) for t in split_model.candidates(gpus, 1, fraction)]


def _int(inputs: ModeInputs, key: str) -> int | None:
    return inputs.get(key)


def _keys(spec: VerlJobSpec) -> list[tuple[str, str]]:
    out = []
    for i, raw in enumerate(spec.overrides):
        try:
            ov = parse_override(raw, i)
        except _OverrideError:
            continue
        out.append((ov.key, ov.source))
    return out


def _replaced(override: str, values: Mapping[str, str]) -> str:
    key = override.split("=", 1)[0]
    return f"{key}={values[key]}" if key in values else override


def _with_removed(result: PlanResult, removed: list[Violation]) -> PlanResult:
    """A removed key's own message in place of the generic unknown-key one."""
    if not removed:
        return result
    fields = {v.field for v in removed}
    kept = [v for v in result.violations if not (v.field in fields and v.rule == "override-unknown-key")]
    return result.model_copy(update={"feasible": False, "plan": None, "violations": [*kept, *removed]})


def _warned(result: PlanResult, warnings: Sequence[str]) -> PlanResult:
    if not warnings:
        return result
    return result.model_copy(update={"warnings": [*warnings, *result.warnings]})
