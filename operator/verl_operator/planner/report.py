"""Assemble the plan (derived numbers, memory parts, override list) from the search's answer."""

from __future__ import annotations

import re
from collections.abc import Sequence

from verl_operator.api.plan import (
    CANDIDATE_SAMPLE,
    EXCLUDED_IN_PLAN,
    BatchingPlan,
    MemoryPhase,
    MemoryPlan,
    NodePoolPlan,
    PaddingPlan,
    Plan,
    PlanResult,
    RolloutPlan,
    TrainingPlan,
)
from verl_operator.api.settings_registry import SETTINGS
from verl_operator.planner import dialect, rules_megatron
from verl_operator.planner.cluster import Layout, Pool, name_key
from verl_operator.planner.inputs import Problem, Settings
from verl_operator.planner.memory import GIB, SAFETY_FACTOR, Estimate, Phase
from verl_operator.planner.mesh import Mesh
from verl_operator.planner.overrides import Override
from verl_operator.planner.search import Found

_SHELL_VAR = re.compile(r"\$(?!\{)[A-Za-z_][A-Za-z0-9_]*")


def shell_variable_warnings(passthrough: Sequence[Override], p: Problem) -> list[str]:
    """Overrides pasted from a shell script keep ``$HOME``-style variables verbatim: no shell expands them."""
    out = []
    values = [(ov.source, ov.raw) for ov in passthrough]
    values += [(pin.source, str(pin.value)) for pin in p.pins.values()]
    for source, text in values:
        match = _SHELL_VAR.search(text)
        if match:
            name = match.group(0)[1:]
            out.append(
                f"{source}: {match.group(0)} is passed to verl as written (no shell expands it); "
                f"use an absolute path or ${{oc.env:{name}}}"
            )
    return out


def build_result(
    p: Problem,
    layout: Layout,
    pool: Pool,
    excluded: dict[str, str],
    found: Found,
    passthrough: Sequence[Override],
) -> PlanResult:
    """The feasible result: the plan with derived numbers, warnings and the full override list.

    Args:
        p: The job's facts on the chosen pool.
        layout: The chosen layout.
        pool: The chosen pool.
        excluded: Nodes left out, with reasons.
        found: The search's settings and estimate.
        passthrough: User overrides the planner does not own.
    """
    s, est = found.settings, found.estimate
    mesh = Mesh.of(p, s, layout.cpu_per_node)
    warnings = [*found.warnings, *shell_variable_warnings(passthrough, p), *_batch_warnings(p, mesh, est)]
    warnings += rules_megatron.warnings(p, mesh)
    plan = Plan(
        verl_version=p.version,
        nodes=list(layout.candidates[: layout.nnodes]),
        nnodes=mesh.nnodes,
        gpus_per_node=mesh.gpus_per_node,
        cpu_per_node=mesh.cpu_per_node,
        candidate_node_count=len(layout.candidates),
        candidate_nodes_sample=list(layout.candidates[:CANDIDATE_SAMPLE]),
        nvlink_group_size=mesh.nvlink_group_size,
        nvlink_group_per_node=mesh.nvlink_group_per_node,
        world_size=mesh.world,
        data_parallel_size=mesh.data_parallel_size,
        sequence_parallel_size=mesh.sequence_parallel_size,
        fsdp_size=s.fsdp_size,
        rollout=_rollout_plan(p, mesh, est),
        batching=_batching_plan(mesh),
        memory=_memory_plan(p, est, p.tokens_per_sequence(s.sequence_parallel_size)),
        padding=PaddingPlan(padded_trajectories=mesh.waste, waste_fraction=mesh.waste_fraction),
        node_pool=NodePoolPlan(
            gpu_product=pool.product,
            gpu_memory_mib=pool.memory_mib,
            nvlink_domain_size=layout.nvlink_domain,
            eligible_nodes=len(pool.nodes),
            excluded=bounded_excluded(excluded),
            excluded_count=len(excluded),
            product_selector=dict(pool.selector),
        ),
        overrides=dialect.emit(s, p, passthrough),
        training=_training_plan(mesh),
    )
    return PlanResult(feasible=True, violations=[], warnings=warnings, plan=plan)


def bounded_excluded(excluded: dict[str, str]) -> dict[str, str]:
    """The first :data:`EXCLUDED_IN_PLAN` excluded nodes in natural name order (the planner's node order),
    with their reasons: the plan lists a sample, its ``excludedCount`` counts them all."""
    names = sorted(excluded, key=name_key)[:EXCLUDED_IN_PLAN]
    return {name: excluded[name] for name in names}


def _batch_warnings(p: Problem, mesh: Mesh, est: Estimate) -> list[str]:
    s = mesh.settings
    out: list[str] = []
    if mesh.waste:
        out.append(
            f"verl pads {mesh.trajectories} trajectories to {mesh.padded_trajectories} per step "
            f"({mesh.waste} zero-weight samples)"
        )
    seqs_per_replica = mesh.sequences_per_replica
    if seqs_per_replica * p.seq_len > est.kv_cache_tokens:
        out.append(
            f"each vLLM replica gets {seqs_per_replica:.0f} sequences of up to {p.seq_len} tokens but its KV cache "
            f"holds {est.kv_cache_tokens} tokens: vLLM will run them in waves"
        )
    if mesh.partial_mini_batch:
        out.append(
            f"trainBatchSize {s.train_batch_size} is not a multiple of ppoMiniBatchSize {s.ppo_mini_batch_size}"
        )
    return out


def _rollout_plan(p: Problem, mesh: Mesh, est: Estimate) -> RolloutPlan:
    return RolloutPlan(
        mode=p.mode,
        name=p.rollout_name,
        tensor_parallel_size=mesh.rollout_tp,
        replicas=mesh.rollout_replicas,
        prompts_per_replica=round(mesh.prompts_per_replica, 2),
        sequences_per_replica=round(mesh.sequences_per_replica, 2),
        gpu_memory_utilization=mesh.settings.gpu_memory_utilization,
        max_model_len=p.model_len,
        kv_cache_tokens_per_replica=est.kv_cache_tokens,
    )


def settings_fields(settings: Settings, section: str) -> dict[str, object]:
    """The plan fields of ``section`` that are settings as chosen, from the settings registry's rows (a new
    setting with a plan field in the section lands there without an edit here)."""
    return {field: getattr(settings, name) for name, field in SETTINGS.plan_fields(section).items()}


def _batching_plan(mesh: Mesh) -> BatchingPlan:
    s = mesh.settings
    micro, lp_micro = s.ppo_micro_batch_size_per_gpu, s.log_prob_micro_batch_size_per_gpu
    return BatchingPlan.model_validate(
        {
            **settings_fields(s, "batching"),
            # What the mesh derives from them.
            "trajectories_per_step": mesh.trajectories,
            "mini_batch_per_gpu": mesh.mini_per_gpu,
            "gradient_accumulation_steps": mesh.accumulation_steps(micro),
            "log_prob_passes_per_gpu": mesh.log_prob_passes(lp_micro),
            "mini_batches_per_step": mesh.mini_batches_per_step,
        }
    )


def _memory_plan(p: Problem, est: Estimate, tokens_per_sequence: int) -> MemoryPlan:
    def phase(ph: Phase) -> MemoryPhase:
        return MemoryPhase(peak_gib=round(ph.peak_bytes / GIB, 2), parts_gib=ph.parts_gib())

    return MemoryPlan(
        gpu_memory_gib=round(p.gpu_memory_bytes / GIB, 2),
        rollout_peak_gib=round(est.rollout.peak_bytes / GIB, 2),
        train_peak_gib=round(est.train.peak_bytes / GIB, 2),
        log_prob_peak_gib=round(est.log_prob.peak_bytes / GIB, 2),
        safety_factor=SAFETY_FACTOR,
        tokens_per_sequence=tokens_per_sequence,
        rollout=phase(est.rollout),
        train=phase(est.train),
        log_prob=phase(est.log_prob),
    )


def _training_plan(mesh: Mesh) -> TrainingPlan | None:
    """The Megatron engine's mesh; None for FSDP (its mesh is the plan's SP and FSDP fields)."""
    s = mesh.settings
    if mesh.problem.training_engine != "megatron":
        return None
    return TrainingPlan(
        engine="megatron",
        tensor_parallel_size=s.megatron_tp,
        pipeline_parallel_size=s.megatron_pp,
        virtual_pipeline_parallel_size=s.megatron_vpp,
        context_parallel_size=s.megatron_cp,
        expert_parallel_size=s.megatron_ep,
        expert_tensor_parallel_size=s.megatron_etp,
        data_parallel_size=mesh.data_parallel_size,
    )
