"""The search's memory side: the estimate's inputs for a candidate, the memory violations with their hints."""

from __future__ import annotations

from verl_operator.api.plan import Violation
from verl_operator.planner import megatron_memory
from verl_operator.planner.budget import spend
from verl_operator.planner.inputs import Problem
from verl_operator.planner.memory import (
    GIB,
    Estimate,
    MemoryInputs,
    Phase,
    estimate,
    max_gpu_memory_utilization,
)
from verl_operator.planner.mesh import Mesh
from verl_operator.planner.rules_rollout import (
    nvlink_groups,
    rollout_replica_node,
    rollout_tp_divides_world,
    rollout_tp_heads,
)

#: The rules a suggested rollout TP must pass (the ones the search's TP step checks besides memory).
_TP_RULES = (rollout_tp_divides_world, rollout_tp_heads, rollout_replica_node, nvlink_groups)


def memory_inputs(p: Problem, mesh: Mesh) -> MemoryInputs:
    """The memory model's inputs for the candidate of ``mesh``: its shard group, SP and tokens per GPU."""
    spend()  # every memory-model evaluation is one step of the plan's budget
    s = mesh.settings
    sp = mesh.sequence_parallel_size
    per_sequence = p.tokens_per_sequence(sp)
    if s.dynamic_batch_size:
        # A packed micro-batch holds at most the budget, and at most the rank's whole (mini-)batch.
        t_train = min(s.max_token_len_per_gpu or p.seq_len, mesh.share(mesh.mini_per_gpu * per_sequence))
        t_lp = min(
            s.log_prob_max_token_len_per_gpu or s.max_token_len_per_gpu or p.seq_len,
            mesh.share(mesh.log_prob_per_gpu * per_sequence),
        )
    else:
        t_train = mesh.share((s.ppo_micro_batch_size_per_gpu or 1) * per_sequence)
        t_lp = mesh.share((s.log_prob_micro_batch_size_per_gpu or 1) * per_sequence)
    return MemoryInputs(
        shape=p.shape,
        params=p.params,
        gpu_memory_bytes=p.gpu_memory_bytes,
        world=mesh.world,
        fsdp_shard=mesh.fsdp_shard,
        sequence_parallel_size=sp,
        rollout_tp=mesh.rollout_tp,
        gpu_memory_utilization=s.gpu_memory_utilization,
        seq_len=p.model_len,
        train_tokens_per_gpu=t_train,
        log_prob_tokens_per_gpu=t_lp,
        param_offload=s.param_offload,
        optimizer_offload=s.optimizer_offload,
        ref_resident=p.uses_ref and not p.ref_param_offload,
        ref_bytes_per_param=2 if p.version == "0.6" else 4,
        critic=p.needs_critic,
        critic_offload=p.critic_offload,
        lora=p.lora,
        gradient_checkpointing=p.gradient_checkpointing,
        max_num_batched_tokens=p.max_num_batched_tokens,
        max_num_seqs=p.max_num_seqs,
        critic_params=p.critic_params,
        entropy=p.entropy,
        rollout_name=p.rollout_name,
        megatron=megatron_memory.of_candidate(p, s, mesh.mini_per_gpu * per_sequence, t_train),
    )


def gpus_needed(p: Problem, mesh: Mesh, max_factor: int = 64) -> int | None:
    """The smallest multiple of the current GPU count whose sharded state fits every phase, or None.

    Only the state shrinks with more GPUs; the per-GPU batch settings stay as they are.
    """
    for k in range(2, max_factor + 1):
        world = mesh.world * k
        bigger = mesh.changed(world=world, fsdp_size=-1)
        if estimate(memory_inputs(p, bigger)).fits(p.gpu_memory_bytes):
            return world
    return None


def memory_violations(p: Problem, mesh: Mesh, est: Estimate) -> list[Violation]:
    """Phases predicted not to fit, with the parts and what would make them fit."""
    out = [
        _phase_violation(p, mesh, label, phase, name)
        for label, phase, name in _phases(mesh, est)
        if phase.peak_bytes > p.gpu_memory_bytes and not (p.standalone_rollout and label == "rollout")
    ]
    if est.kv_cache_tokens < p.model_len and not p.standalone_rollout:
        out.append(_kv_cache_violation(p, mesh, est))
    return out


def _phases(mesh: Mesh, est: Estimate) -> tuple[tuple[str, Phase, str], ...]:
    """``(label, estimate, the input to change)`` of the rollout, train and log-prob phases."""
    s = mesh.settings
    return (
        # A pinned gpuMemoryUtilization is the field to change; otherwise the resident state is too large.
        ("rollout", est.rollout, "gpu_memory_utilization"),
        (
            "train",
            est.train,
            "ppo_micro_batch_size_per_gpu" if not s.dynamic_batch_size else "max_token_len_per_gpu",
        ),
        (
            "log-prob",
            est.log_prob,
            "log_prob_micro_batch_size_per_gpu"
            if not s.dynamic_batch_size
            else "log_prob_max_token_len_per_gpu",
        ),
    )


def _phase_violation(p: Problem, mesh: Mesh, label: str, phase: Phase, name: str) -> Violation:
    """The violation of one phase whose peak exceeds the GPU, with its parts and hints."""
    parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(phase.parts_gib().items(), key=lambda kv: -kv[1]))
    return Violation(
        field=p.source(name, "spec.resources.gpus"),
        rule=f"memory-{label}",
        message=(
            f"{label} peak {phase.peak_bytes / GIB:.1f} GiB (parts in GiB: {parts}; estimated parts x1.1) "
            f"exceeds the GPU's {p.gpu_memory_bytes / GIB:.1f} GiB"
        ),
        suggestions=_phase_hints(p, mesh, label),
    )


def _phase_hints(p: Problem, mesh: Mesh, label: str) -> list[str]:
    """What would make phase ``label`` fit: its own settings, then more GPUs."""
    hints: list[str] = []
    if label == "rollout":
        hints += _rollout_hints(p, mesh)
    elif label == "train":
        hints.append(
            "use a larger spec.parallelism.sequenceParallelSize or a smaller micro-batch / token budget"
        )
        hints.append("shorten spec.data.maxResponseLength")
    else:
        hints.append("use a smaller logProbMicroBatchSizePerGpu (or log-prob token budget)")
    more = gpus_needed(p, mesh)
    if more is not None:
        hints.append(f"use at least {more} GPUs (the training state is sharded over them)")
    return hints


def _kv_cache_violation(p: Problem, mesh: Mesh, est: Estimate) -> Violation:
    """vLLM's KV cache cannot hold one ``max_model_len`` sequence."""
    s = mesh.settings
    return Violation(
        field=p.source("rollout_tp", "spec.rollout.tensorParallelSize"),
        rule="kv-cache-max-model-len",
        message=(
            f"vLLM's KV cache holds {est.kv_cache_tokens} tokens per replica at TP {s.rollout_tp} and "
            f"gpuMemoryUtilization {s.gpu_memory_utilization}, fewer than one {p.model_len}-token sequence"
        ),
        suggestions=_kv_hints(p, mesh),
    )


def _max_gmu(p: Problem, mesh: Mesh) -> float:
    return max_gpu_memory_utilization(memory_inputs(p, mesh))


def _rollout_hints(p: Problem, mesh: Mesh) -> list[str]:
    """Changes that make the rollout peak fit, with the gpuMemoryUtilization each allows."""
    hints: list[str] = []
    s = mesh.settings
    current = _max_gmu(p, mesh)
    if current > 0:
        hints.append(f"use gpuMemoryUtilization {current} or less")
    options = []
    if not s.optimizer_offload:
        options.append(("set spec.offload.optimizer: true", mesh.changed(optimizer_offload=True)))
    if not s.param_offload:
        options.append(("set spec.offload.params: true", mesh.changed(param_offload=True)))
    if not s.param_offload and not s.optimizer_offload:
        options.append(
            (
                "set spec.offload.params and optimizer: true",
                mesh.changed(param_offload=True, optimizer_offload=True),
            )
        )
    for text, changed in options:
        gmu = _max_gmu(p, changed)
        if gmu > current:
            hints.append(f"{text} (then gpuMemoryUtilization up to {gmu} fits)")
    return hints


def _kv_hints(p: Problem, mesh: Mesh) -> list[str]:
    """Changes that give vLLM room for one ``max_model_len`` sequence."""
    hints: list[str] = []
    s = mesh.settings
    for k in (2, 4, 8):
        tp = mesh.rollout_tp * k
        larger = mesh.changed(rollout_tp=tp)
        if not any(rule(p, larger) for rule in _TP_RULES):
            kv = estimate(memory_inputs(p, larger)).kv_cache_tokens
            if kv >= p.model_len:
                hints.append(f"use rollout tensorParallelSize {tp} ({kv} KV-cache tokens per replica)")
                break
    limit = _max_gmu(p, mesh)
    step = 0.05
    gmu = round(s.gpu_memory_utilization + step, 2)
    while gmu <= limit + 1e-9:
        kv = estimate(memory_inputs(p, mesh.changed(gpu_memory_utilization=gmu))).kv_cache_tokens
        if kv >= p.model_len:
            hints.append(f"use gpuMemoryUtilization {gmu} ({kv} KV-cache tokens per replica)")
            break
        gmu = round(gmu + step, 2)
    have = estimate(memory_inputs(p, mesh)).kv_cache_tokens
    if have > 0:
        hints.append(f"or shorten maxPromptLength + maxResponseLength to {have} tokens or fewer")
    return hints
