"""The rules a verl FSDP + vLLM launch must satisfy (``docs/planner.md`` lists them with verl's code references).

Each rule is a function ``(problem, mesh) -> list[Violation]``; an empty list means it holds. The mesh
(:class:`~verl_operator.planner.mesh.Mesh`, built once per candidate) owns every derived number and the
candidate's settings; the problem gives the job's other facts. Messages show every factor of the arithmetic
and, where they exist, the nearest valid values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from verl_operator.api.plan import Violation
from verl_operator.planner import rules_megatron
from verl_operator.planner.arith import (
    nearest,
    nearest_divisor,
    nearest_multiple,
)
from verl_operator.planner.arith import or_text as _or
from verl_operator.planner.inputs import SPEC_PATHS, Problem
from verl_operator.planner.mesh import Mesh, heads_allow_sp
from verl_operator.planner.rules_critic import critic_mesh, critic_micro_divides_mini
from verl_operator.planner.rules_engines import rollout_data_parallel, sglang_spmd_model_len, trtllm_moe_split
from verl_operator.planner.rules_rollout import (
    batched_tokens_cover_model_len,
    max_model_len,
    nvlink_groups,
    rollout_expert_parallel,
    rollout_prompt_length,
    rollout_replica_node,
    rollout_response_length,
    rollout_tp_divides_world,
    rollout_tp_heads,
)

Rule = Callable[[Problem, Mesh], list[Violation]]


def _field(p: Problem, name: str) -> str:
    return p.source(name, SPEC_PATHS.get(name, name))


def batch_divisible_by_world(p: Problem, mesh: Mesh) -> list[Violation]:
    """Rule 1: without dynamic batch size, ``train_batch_size x n`` must divide evenly over the GPUs.

    With dynamic batch size, verl 0.6 still chunks the batch evenly over the training and rollout data-parallel
    ranks (``DataProto.chunk`` without padding); verl >= 0.7 pads instead.
    """
    s = mesh.settings
    if s.dynamic_batch_size:
        # verl 0.6 splits the batch evenly over the actor's DP ranks and the rollout's (world / TP) ranks.
        unit = mesh.chunk_ranks
        if p.version == "0.6" and mesh.trajectories % unit:
            return [
                Violation(
                    field=_field(p, "train_batch_size"),
                    rule="batch-divisible-by-dp",
                    message=(
                        f"{s.train_batch_size} x {s.rollout_n} = {mesh.trajectories} trajectories per step is not "
                        f"divisible by {unit} (verl 0.6 splits the batch evenly over {mesh.data_parallel_size} "
                        f"training and {mesh.rollout_replicas} rollout data-parallel ranks)"
                    ),
                    suggestions=[
                        f"use trainBatchSize {_or(nearest_multiple(s.train_batch_size, mesh.batch_step(unit)))}"
                    ],
                )
            ]
        return []
    if mesh.world_divides_trajectories or p.training_engine == "megatron":
        # Megatron: verl checks t x n against Megatron's DP x micro-batch instead (megatron-minimal-batch).
        return []
    # t x n divides by the world exactly when t is a multiple of world / gcd(world, n).
    near = nearest_multiple(s.train_batch_size, mesh.batch_step(mesh.world))
    return [
        Violation(
            field=_field(p, "train_batch_size"),
            rule="batch-divisible-by-world",
            message=(
                f"{s.train_batch_size} x {s.rollout_n} = {mesh.trajectories} trajectories per step is not "
                f"divisible by {mesh.world} GPUs"
            ),
            suggestions=[f"use trainBatchSize {_or(near)}"] if near else [],
        )
    ]


def mini_batch_le_train_batch(p: Problem, mesh: Mesh) -> list[Violation]:
    """Rule 3: ``train_batch_size >= ppo_mini_batch_size`` without dynamic batch size (verl skips the check with
    it: one padded mini-batch per step, reported as a warning)."""
    s = mesh.settings
    if s.dynamic_batch_size or s.train_batch_size >= s.ppo_mini_batch_size:
        return []
    return [
        Violation(
            field=_field(p, "ppo_mini_batch_size"),
            rule="mini-batch-le-train-batch",
            message=f"ppoMiniBatchSize {s.ppo_mini_batch_size} is larger than trainBatchSize {s.train_batch_size}",
            suggestions=[f"use ppoMiniBatchSize {s.train_batch_size} or less"],
        )
    ]


def sp_divides_world(p: Problem, mesh: Mesh) -> list[Violation]:
    """Rule 11 (verl never checks): the world size must be a multiple of the Ulysses SP size."""
    sp = mesh.sequence_parallel_size
    if mesh.divides_world(sp):
        return []
    return [
        Violation(
            field=_field(p, "sequence_parallel_size"),
            rule="sp-divides-world",
            message=(
                f"{mesh.world} GPUs are not divisible by sequenceParallelSize {sp}: ranks fall "
                f"outside the ({mesh.ulysses_rows}, {sp}) mesh"
            ),
            suggestions=[f"use sequenceParallelSize {_or(nearest_divisor(sp, mesh.world))}"],
        )
    ]


def sp_heads(p: Problem, mesh: Mesh) -> list[Violation]:
    """Rule 10: attention heads divisible by SP; KV heads divisible by SP or SP divisible by KV heads."""
    sp = mesh.sequence_parallel_size
    heads, kv = p.shape.attention_heads, p.shape.kv_heads
    if heads_allow_sp(p.shape, sp):
        return []

    def ok(v: int) -> bool:
        return heads_allow_sp(p.shape, v) and mesh.divides_world(v)

    return [
        Violation(
            field=_field(p, "sequence_parallel_size"),
            rule="sp-heads",
            message=(
                f"sequenceParallelSize {sp} does not fit the model's {heads} attention heads and {kv} KV heads "
                f"(needs heads % SP == 0 and KV heads % SP == 0 or SP % KV heads == 0)"
            ),
            suggestions=[f"use sequenceParallelSize {_or(nearest(sp, ok, 1024))}"],
        )
    ]


def fsdp_size_valid(p: Problem, mesh: Mesh) -> list[Violation]:
    """Rule 12 (verl never checks): ``fsdp_size`` is -1, at least the world size, or divides it."""
    f = mesh.settings.fsdp_size
    if mesh.fsdp_size_valid:
        return []
    return [
        Violation(
            field=_field(p, "fsdp_size"),
            rule="fsdp-size",
            message=f"fsdpSize {f} is neither -1 nor a divisor of the {mesh.world} GPUs",
            suggestions=[f"use fsdpSize -1 or {_or(nearest_divisor(max(f, 1), mesh.world))}"],
        )
    ]


def mini_batch_per_gpu(p: Problem, mesh: Mesh) -> list[Violation]:
    """Rule 21: ``ppo_mini_batch_size x n`` divides over the data-parallel ranks, at least one per rank."""
    s, dp, total = mesh.settings, mesh.data_parallel_size, mesh.mini_sequences
    if mesh.mini_divides_dp:
        return []
    near = nearest_multiple(s.ppo_mini_batch_size, mesh.batch_step(dp), s.train_batch_size)
    return [
        Violation(
            field=_field(p, "ppo_mini_batch_size"),
            rule="mini-batch-per-gpu",
            message=(
                f"ppoMiniBatchSize {s.ppo_mini_batch_size} x {s.rollout_n} = {total} sequences do not divide over "
                f"{dp} data-parallel ranks ({mesh.world} GPUs / SP {mesh.sequence_parallel_size})"
            ),
            suggestions=[f"use ppoMiniBatchSize {_or(near)}"] if near else [],
        )
    ]


def micro_divides_mini(p: Problem, mesh: Mesh) -> list[Violation]:
    """Rule 22: without dynamic batch size, the per-GPU mini-batch is a multiple of the micro-batch."""
    s = mesh.settings
    if s.dynamic_batch_size:
        return []
    micro = s.ppo_micro_batch_size_per_gpu
    if micro is None:
        return [
            Violation(
                field="spec.batching.ppoMicroBatchSizePerGpu",
                rule="micro-batch-required",
                message="ppoMicroBatchSizePerGpu must be set when dynamicBatchSize is off",
                suggestions=["set ppoMicroBatchSizePerGpu, or dynamicBatchSize: true"],
            )
        ]
    per_gpu = mesh.mini_per_gpu
    if per_gpu > 0 and per_gpu % micro == 0:
        return []
    return [
        Violation(
            field=_field(p, "ppo_micro_batch_size_per_gpu"),
            rule="micro-divides-mini",
            message=(
                f"per-GPU mini-batch {s.ppo_mini_batch_size} x {s.rollout_n} / {mesh.data_parallel_size} = {per_gpu} "
                f"is not a multiple of ppoMicroBatchSizePerGpu {micro}"
            ),
            suggestions=[f"use ppoMicroBatchSizePerGpu {_or(nearest_divisor(micro, per_gpu))}"]
            if per_gpu > 0
            else [],
        )
    ]


def log_prob_micro_divides(p: Problem, mesh: Mesh) -> list[Violation]:
    """Rule 22 (verl >= 0.7): the per-GPU log-prob batch is a multiple of the log-prob micro-batch."""
    s = mesh.settings
    if s.dynamic_batch_size or p.version == "0.6":
        return []
    micro = s.log_prob_micro_batch_size_per_gpu
    if micro is None:
        return [
            Violation(
                field="spec.batching.logProbMicroBatchSizePerGpu",
                rule="micro-batch-required",
                message="logProbMicroBatchSizePerGpu must be set when dynamicBatchSize is off",
                suggestions=["set logProbMicroBatchSizePerGpu, or dynamicBatchSize: true"],
            )
        ]
    per_gpu = mesh.log_prob_per_gpu  # padded (the rule applies to verl >= 0.7 only)
    if per_gpu % micro == 0:
        return []
    return [
        Violation(
            field=_field(p, "log_prob_micro_batch_size_per_gpu"),
            rule="log-prob-micro-divides",
            message=(
                f"per-GPU log-prob batch {per_gpu} (trajectories / {mesh.data_parallel_size} data-parallel ranks) is "
                f"not a multiple of logProbMicroBatchSizePerGpu {micro}"
            ),
            suggestions=[f"use logProbMicroBatchSizePerGpu {_or(nearest_divisor(micro, per_gpu))}"],
        )
    ]


def dynamic_token_budget(p: Problem, mesh: Mesh) -> list[Violation]:
    """Rule 24: with dynamic batch size, ``max_token_len_per_gpu x SP >= prompt + response``."""
    s = mesh.settings
    if not s.dynamic_batch_size:
        return []
    out: list[Violation] = []
    need = p.seq_len
    sp = mesh.sequence_parallel_size
    # An unset log-prob budget follows the actor's (verl's oc.select default).
    budgets = [
        ("max_token_len_per_gpu", s.max_token_len_per_gpu),
        ("log_prob_max_token_len_per_gpu", s.log_prob_max_token_len_per_gpu or s.max_token_len_per_gpu),
    ]
    if p.needs_critic:
        # verl's default critic.ppo_max_token_len_per_gpu is 32768.
        budgets.append(("critic_max_token_len_per_gpu", p.critic_max_token_len_per_gpu or 32768))
    for name, budget in budgets:
        if name.startswith("critic"):
            sp = mesh.critic_sequence_parallel_size
        if (
            name == "log_prob_max_token_len_per_gpu"
            and not p.pinned(name)
            and budget == s.max_token_len_per_gpu
        ):
            continue  # follows the actor's budget: the actor's violation says it
        field = _budget_field(p, name)
        if budget is None:
            out.append(
                Violation(
                    field=field,
                    rule="dynamic-token-budget",
                    message="dynamicBatchSize needs a token budget per GPU",
                    suggestions=[f"set maxTokenLenPerGpu >= {mesh.share(2 * need, sp)}"],
                )
            )
        elif budget * sp < need:
            out.append(
                Violation(
                    field=field,
                    rule="dynamic-token-budget",
                    message=(
                        f"token budget {budget} x SP {sp} = {budget * sp} is below one sequence of "
                        f"{p.max_prompt_length} + {p.max_response_length} = {need} tokens"
                    ),
                    suggestions=[
                        f"use {_setting_name(field)} >= {mesh.share(need, sp)} "
                        f"(verl's docs advise >= {mesh.share(2 * need, sp)})"
                    ],
                )
            )
    return out


#: verl's keys of the token budgets that have no spec field of their own.
_BUDGET_KEYS = {
    "log_prob_max_token_len_per_gpu": "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
    "critic_max_token_len_per_gpu": "critic.ppo_max_token_len_per_gpu",
}


def _budget_field(p: Problem, name: str) -> str:
    """Where a token budget comes from: the pin's field, the spec's, or the override that would set it."""
    if p.pinned(name) or name in SPEC_PATHS:
        return _field(p, name)
    return f"spec.overrides ({_BUDGET_KEYS.get(name, name)})"


def _setting_name(field: str) -> str:
    """The name a suggestion uses for a field: the verl key of an override, else the spec field's last part."""
    if field.startswith("spec.overrides"):
        return field.rsplit("(", 1)[-1].split(",")[0].rstrip(")")
    return field.rsplit(".", 1)[-1]


def sp_remove_padding(p: Problem, mesh: Mesh) -> list[Violation]:
    """Rule 9: Ulysses SP > 1 needs ``model.use_remove_padding=True``."""
    if mesh.sequence_parallel_size == 1 or p.use_remove_padding is not False:
        return []
    return [
        Violation(
            field=_field(p, "use_remove_padding"),
            rule="sp-remove-padding",
            message=f"sequenceParallelSize {mesh.sequence_parallel_size} needs use_remove_padding=True",
            suggestions=["drop the use_remove_padding=False override", "or use sequenceParallelSize 1"],
        )
    ]


#: Every arithmetic rule, in the order they are checked (memory is checked by the search with the estimate).
RULES: tuple[Rule, ...] = (
    batch_divisible_by_world,
    mini_batch_le_train_batch,
    sp_divides_world,
    sp_heads,
    fsdp_size_valid,
    rollout_tp_divides_world,
    rollout_tp_heads,
    rollout_replica_node,
    rollout_expert_parallel,
    rollout_data_parallel,
    trtllm_moe_split,
    nvlink_groups,
    max_model_len,
    rollout_response_length,
    rollout_prompt_length,
    sglang_spmd_model_len,
    batched_tokens_cover_model_len,
    mini_batch_per_gpu,
    critic_mesh,
    micro_divides_mini,
    log_prob_micro_divides,
    critic_micro_divides_mini,
    dynamic_token_budget,
    sp_remove_padding,
    *rules_megatron.RULES,  # the Megatron engine
)


def check(p: Problem, mesh: Mesh, rules: Iterable[Rule] = RULES) -> list[Violation]:
    """All violations of ``rules`` for one candidate (its mesh)."""
    out: list[Violation] = []
    for rule in rules:
        out.extend(rule(p, mesh))
    return out
