"""The critic's rules (algorithm ppo): its own Ulysses SP and data-parallel mesh, its micro-batch."""

from __future__ import annotations

from verl_operator.api.plan import Violation
from verl_operator.planner.arith import nearest_divisor, nearest_multiple
from verl_operator.planner.arith import or_text as _or
from verl_operator.planner.inputs import SPEC_PATHS, Problem
from verl_operator.planner.mesh import Mesh, heads_allow_sp


def _field(p: Problem, name: str) -> str:
    return p.source(name, SPEC_PATHS.get(name, name))


def critic_mesh(p: Problem, mesh: Mesh) -> list[Violation]:
    """Rules 10, 11 and 21 for the critic (ppo), whose Ulysses SP is its own setting."""
    if not p.needs_critic:
        return []
    s = mesh.settings
    csp = mesh.critic_sequence_parallel_size
    heads, kv = p.shape.attention_heads, p.shape.kv_heads
    field = p.source(
        "critic_sequence_parallel_size", "spec.overrides (critic.ulysses_sequence_parallel_size)"
    )
    if not mesh.divides_world(csp) or not heads_allow_sp(p.shape, csp):
        return [
            Violation(
                field=field,
                rule="critic-sp",
                message=(
                    f"critic ulysses_sequence_parallel_size {csp} must divide the {mesh.world} GPUs and the model's "
                    f"{heads} attention heads, and KV heads {kv} % SP or SP % KV heads must be 0"
                ),
                suggestions=["use the actor's sequenceParallelSize for the critic, or 1"],
            )
        ]
    dp = mesh.critic_data_parallel_size  # world / the critic's own Ulysses SP (verl's default 1)
    total = mesh.mini_sequences
    if mesh.mini_divides_critic_dp:
        return []
    return [
        Violation(
            field=_field(p, "ppo_mini_batch_size"),
            rule="mini-batch-per-gpu",
            message=(
                f"the critic's mini-batch {s.ppo_mini_batch_size} x {s.rollout_n} = {total} does not divide over its "
                f"{dp} data-parallel ranks ({mesh.world} GPUs / critic SP {csp})"
            ),
            suggestions=[
                f"use ppoMiniBatchSize {_or(nearest_multiple(s.ppo_mini_batch_size, mesh.batch_step(dp)))}"
            ],
        )
    ]


def critic_micro_divides_mini(p: Problem, mesh: Mesh) -> list[Violation]:
    """Rule 22 for the critic (ppo): its per-GPU mini-batch uses its own data-parallel size."""
    micro = mesh.settings.critic_ppo_micro_batch_size_per_gpu
    if not p.needs_critic or mesh.settings.dynamic_batch_size or micro is None:
        return []
    per_gpu = mesh.critic_mini_per_gpu
    if per_gpu > 0 and per_gpu % micro == 0:
        return []
    return [
        Violation(
            field=_field(p, "critic_ppo_micro_batch_size_per_gpu"),
            rule="micro-divides-mini",
            message=f"critic per-GPU mini-batch {per_gpu} is not a multiple of critic micro-batch {micro}",
            suggestions=[f"use critic.ppo_micro_batch_size_per_gpu {_or(nearest_divisor(micro, per_gpu))}"],
        )
    ]
