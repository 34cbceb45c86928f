"""The deterministic search over the settings the user left open.

Tie-break order (the first candidate that satisfies every rule and fits in memory wins):

1. smallest Ulysses SP (1 first; SP costs all-to-all traffic), a divisor of the GPUs per node;
2. FSDP shard group: on several nodes, one node (``fsdpSize = gpusPerNode``, HSDP: no inter-node all-gather)
   before the whole world (``-1``); on one node, ``-1``;
3. PPO mini-batch: the value closest to ``trainBatchSize / 4`` (four updates per step), larger on ties, that
   divides ``trainBatchSize`` (no padding) and gives an integer per-GPU mini-batch; when no divisor does, the
   closest value that gives an integer per-GPU mini-batch (the trainer pads the last one);
4. largest training micro-batch (or token budget with dynamic batch size) that fits;
5. largest log-prob micro-batch that fits;
6. smallest rollout TP that fits (divides the heads and the GPUs per node, or spans whole nodes);
7. largest ``gpuMemoryUtilization`` (multiple of 0.05, at most 0.9) that fits beside the resident state.

Pinned values are never changed: a pinned value that breaks a rule is reported, not replaced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from verl_operator.api.plan import Violation
from verl_operator.planner import arith, megatron, rules, rules_critic, rules_megatron, rules_rollout
from verl_operator.planner._settings_generated import KEPT
from verl_operator.planner.budget import spend
from verl_operator.planner.cluster import Layout
from verl_operator.planner.inputs import Fixed, Problem, Settings
from verl_operator.planner.memory import GIB, Estimate, estimate, max_gpu_memory_utilization
from verl_operator.planner.mesh import Mesh
from verl_operator.planner.search_candidates import (
    default_train_batch,
    fsdp_candidates,
    mini_candidates,
    sp_candidates,
    tp_candidates,
)
from verl_operator.planner.search_memory import memory_inputs as _memory_inputs
from verl_operator.planner.search_memory import memory_violations

#: Records a failed candidate: a function that builds its violations (called only for the one reported) and
#: how far the candidate got.
Recorder = Callable[[Callable[[], list[Violation]], int], None]

#: Token budgets tried with dynamic batch size (largest first), in multiples of 1024 tokens.
TOKEN_BUDGET_STEPS = tuple(range(64 * 1024, 0, -1024))

__all__ = ["Failed", "Found", "default_train_batch", "mini_candidates", "search"]


@dataclass(frozen=True)
class Found:
    """A valid layout and its memory estimate."""

    settings: Settings
    estimate: Estimate
    warnings: tuple[str, ...] = ()
    #: A pinned micro-batch or token budget whose estimate exceeds the GPU (a warning, not a violation).
    overrun: bool = False


@dataclass(frozen=True)
class Failed:
    """No candidate fit: the violations of the nearest miss (the last candidate that got furthest)."""

    violations: list[Violation]
    depth: int


#: Rules that depend only on the mesh and the batch sizes (checked before any memory estimate).
MESH_RULES: tuple[rules.Rule, ...] = (
    rules.batch_divisible_by_world,
    rules.mini_batch_le_train_batch,
    rules.sp_divides_world,
    rules.sp_heads,
    rules.fsdp_size_valid,
    rules_rollout.max_model_len,
    rules_rollout.batched_tokens_cover_model_len,
    rules.sp_remove_padding,
    rules_critic.critic_mesh,
    *rules_megatron.RULES,  # the Megatron engine
)


def global_micro_violations(p: Problem, fixed: Fixed, mesh: Mesh) -> list[Violation]:
    """A deprecated global micro-batch smaller than the data-parallel size leaves 0 sequences per GPU."""
    out = []
    for name, value, key, critic in (
        (
            "ppo_micro_batch_size_global",
            fixed.ppo_micro_batch_size_global,
            "ppo_micro_batch_size_per_gpu",
            False,
        ),
        (
            "log_prob_micro_batch_size_global",
            fixed.log_prob_micro_batch_size_global,
            "log_prob_micro_batch_size_per_gpu",
            False,
        ),
        (
            "critic_ppo_micro_batch_size_global",
            fixed.critic_ppo_micro_batch_size_global,
            "critic.ppo_micro_batch_size_per_gpu",
            True,
        ),
    ):
        ranks = mesh.critic_data_parallel_size if critic else mesh.data_parallel_size
        if value is not None and (mesh.per_gpu_of_global(value, critic) or 0) < 1:
            out.append(
                Violation(
                    field=p.source(name, name),
                    rule="micro-batch-global",
                    message=(
                        f"the global micro-batch {value} over {ranks} data-parallel ranks is {value} // {ranks} = 0 "
                        f"sequences per GPU"
                    ),
                    suggestions=[f"set {key} instead (per GPU), or a global value of at least {ranks}"],
                )
            )
    return out


def _const(vs: list[Violation]) -> Callable[[], list[Violation]]:
    return lambda: vs


def _memory(p: Problem, mesh: Mesh, est: Estimate, kinds: tuple[str, ...]) -> Callable[[], list[Violation]]:
    return lambda: [v for v in memory_violations(p, mesh, est) if v.rule in kinds]


def _micro_options(per_gpu: int, pinned: int | None) -> list[int]:
    if pinned is not None:
        return [pinned]
    return sorted(arith.divisors(max(per_gpu, 1)), reverse=True)


class _NearestMiss:
    """Keeps the failure to report when no candidate fits.

    Candidates are tried from most preferred to most memory-saving, so among failures that got equally far,
    the last one is the nearest miss (largest SP, whole-world sharding, smallest micro-batch).
    """

    def __init__(self) -> None:
        self._violations: Callable[[], list[Violation]] = list
        self._depth = -1

    def note(self, violations: Callable[[], list[Violation]], depth: int) -> None:
        """A :data:`Recorder`: keep this failure when it got at least as far as the kept one."""
        if depth >= self._depth:
            self._violations, self._depth = violations, depth

    def failed(self) -> Failed:
        """The kept failure."""
        return Failed(self._violations(), self._depth)


def search(p: Problem, layout: Layout, fixed: Fixed, default_rollout_n: int) -> Found | Failed:
    """Find the preferred valid settings for one layout (see the module docstring for the order).

    Args:
        p: The fixed facts of the job on this layout's pool.
        layout: GPUs per node and node count.
        fixed: The pinned values.
        default_rollout_n: ``rollout.n`` when unpinned.
    """
    rollout_n = fixed.rollout_n if fixed.rollout_n is not None else default_rollout_n
    tb = (
        fixed.train_batch_size
        if fixed.train_batch_size is not None
        else default_train_batch(layout.world, rollout_n)
    )
    miss = _NearestMiss()
    fallback: Found | None = None
    if p.training_engine == "megatron":  # the Megatron mesh instead of Ulysses SP and FSDP
        for c in megatron.candidates(
            p.shape,
            layout.world,
            layout.gpus_per_node,
            layout.nvlink_domain,
            fixed,
            seq_len=p.seq_len,
            options=p.megatron_options,
        ):
            base = megatron.settings_of(_base_settings(layout, fixed, tb, rollout_n, 1, -1), c)
            found = _search_mini(p, layout, fixed, base, miss.note)
            if found is not None and not found.overrun:
                return found
            if found is not None and (fallback is None or _overrun_peak(found) < _overrun_peak(fallback)):
                fallback = found
        return fallback or miss.failed()
    for sp in sp_candidates(p, layout, fixed):
        for fsdp in fsdp_candidates(layout, fixed):
            found = _search_mini(
                p, layout, fixed, _base_settings(layout, fixed, tb, rollout_n, sp, fsdp), miss.note
            )
            if found is not None and not found.overrun:
                return found
            # Over the GPU only by a pinned micro-batch: a later SP or FSDP candidate may still fit.
            if found is not None and (fallback is None or _overrun_peak(found) < _overrun_peak(fallback)):
                fallback = found
    return fallback or miss.failed()


def _overrun_peak(found: Found) -> float:
    return max(found.estimate.train.peak_bytes, found.estimate.log_prob.peak_bytes)


def _base_settings(layout: Layout, fixed: Fixed, tb: int, rollout_n: int, sp: int, fsdp: int) -> Settings:
    """The candidate of one SP and FSDP size before its batch sizes and rollout are chosen."""
    return Settings(
        world=layout.world,
        nnodes=layout.nnodes,
        gpus_per_node=layout.gpus_per_node,
        train_batch_size=tb,
        rollout_n=rollout_n,
        # The rollout TP is chosen last; the most lenient placeholder keeps early checks from rejecting
        # a candidate that a larger TP would make valid (the final check uses the real TP).
        rollout_tp=fixed.rollout_tp or layout.gpus_per_node,
        gpu_memory_utilization=fixed.gpu_memory_utilization or 0.5,
        sequence_parallel_size=sp,
        fsdp_size=fsdp,
        ppo_mini_batch_size=0,
        ppo_micro_batch_size_per_gpu=None,
        log_prob_micro_batch_size_per_gpu=None,
        dynamic_batch_size=bool(fixed.dynamic_batch_size),
        max_token_len_per_gpu=fixed.max_token_len_per_gpu,
        log_prob_max_token_len_per_gpu=fixed.log_prob_max_token_len_per_gpu,
        param_offload=bool(fixed.param_offload),
        optimizer_offload=bool(fixed.optimizer_offload),
        # The settings the search keeps as pinned (the rules check them; the emitter writes them back).
        **{name: getattr(fixed, name) for name in KEPT},
    )


def _mesh_violations(p: Problem, fixed: Fixed, mesh: Mesh) -> list[Violation]:
    """The violations of a candidate's mesh and mini-batch (checked before any memory estimate)."""
    vs = rules.check(p, mesh, MESH_RULES)
    if not mesh.settings.dynamic_batch_size:
        vs += global_micro_violations(p, fixed, mesh)
    if fixed.ppo_mini_batch_size is not None or not vs:
        # An unpinned mini-batch only fails because of another input; report that one.
        vs += rules.mini_batch_per_gpu(p, mesh)
    return vs


def _search_mini(p: Problem, layout: Layout, fixed: Fixed, base: Settings, record: Recorder) -> Found | None:
    """Try the mini-batch candidates of one SP and FSDP size, then the rest of the settings."""
    dp = Mesh.of(p, base).data_parallel_size
    for mini in mini_candidates(base.train_batch_size, base.rollout_n, dp, fixed):
        spend()
        mesh = Mesh.of(p, replace(base, ppo_mini_batch_size=mini))
        vs = _mesh_violations(p, fixed, mesh)
        if vs:
            record(_const(vs), 0)
            continue
        found = _search_rest(p, layout, fixed, mesh, record)
        if found is not None:
            return found
    return None


def critic_micro(mesh: Mesh, actor_micro: int) -> int:
    """The critic's micro-batch: the largest divisor of its per-GPU mini-batch whose tokens per GPU do not exceed
    the actor's (``micro x seq / SP``; the critic has its own SP, and no logits, so it then fits too)."""
    bound = mesh.critic_micro_bound(actor_micro)
    fitting = [d for d in arith.divisors(max(mesh.critic_mini_per_gpu, 1)) if d <= bound]
    return max(fitting, default=1)


def _budgets(p: Problem, mesh: Mesh) -> list[int]:
    """Token budgets to try, largest first, down to the smallest that holds one whole sequence per GPU."""
    floor = mesh.share(p.seq_len)
    return [b for b in TOKEN_BUDGET_STEPS if b >= floor]


def _train_options(p: Problem, mesh: Mesh, fixed: Fixed) -> Iterator[Mesh]:
    s = mesh.settings
    if s.dynamic_batch_size:
        if fixed.max_token_len_per_gpu is not None:
            yield mesh
            return
        for budget in _budgets(p, mesh):
            yield mesh.changed(max_token_len_per_gpu=budget)
        return
    pinned = fixed.ppo_micro_batch_size_per_gpu
    if pinned is None and fixed.ppo_micro_batch_size_global is not None:
        pinned = mesh.per_gpu_of_global(fixed.ppo_micro_batch_size_global)
    for micro in _micro_options(mesh.mini_per_gpu, pinned):
        critic = fixed.critic_ppo_micro_batch_size_per_gpu
        if critic is None and fixed.critic_ppo_micro_batch_size_global is not None:
            critic = mesh.per_gpu_of_global(fixed.critic_ppo_micro_batch_size_global, critic=True)
        if critic is None and p.needs_critic:
            critic = critic_micro(mesh, micro)
        yield mesh.changed(
            ppo_micro_batch_size_per_gpu=micro,
            critic_ppo_micro_batch_size_per_gpu=critic if p.needs_critic else None,
        )


def _log_prob_options(p: Problem, mesh: Mesh, fixed: Fixed) -> Iterator[Mesh]:
    s = mesh.settings
    if s.dynamic_batch_size:
        pinned = fixed.log_prob_max_token_len_per_gpu
        top = pinned or s.max_token_len_per_gpu
        yield mesh.changed(log_prob_max_token_len_per_gpu=top)
        if pinned is None and top is not None:
            # The forward pass keeps fewer bytes per token than the update but more per logit: when the
            # actor's budget does not fit it, smaller log-prob budgets are tried.
            for budget in _budgets(p, mesh):
                if budget < top:
                    yield mesh.changed(log_prob_max_token_len_per_gpu=budget)
        return
    pinned = fixed.log_prob_micro_batch_size_per_gpu
    if pinned is None and fixed.log_prob_micro_batch_size_global is not None:
        pinned = mesh.per_gpu_of_global(fixed.log_prob_micro_batch_size_global)
    # The per-GPU log-prob batch verl forms: padded on verl >= 0.7, the plain share on 0.6.
    for micro in _micro_options(mesh.log_prob_per_gpu, pinned):
        yield mesh.changed(log_prob_micro_batch_size_per_gpu=micro)


def _pinned_overrun(p: Problem, mesh: Mesh, phase: str, pinned: bool, est: Estimate) -> str | None:
    """A warning for a user-pinned micro-batch or token budget whose estimate exceeds the GPU.

    Activations and logits scale with the tokens actually in a micro-batch; the estimate takes every
    sequence at ``Problem.tokens_per_sequence`` (the maxima, or the data's mean lengths when the spec gives
    them and padding is removed). The planner never chooses such a value itself, but a pinned one is the
    user's measured choice (verl's tuning scripts probe the largest that fits), so it is reported, not rejected.
    """
    peak = est.train.peak_bytes if phase == "train" else est.log_prob.peak_bytes
    if not pinned or peak <= p.gpu_memory_bytes:
        return None
    tokens = p.tokens_per_sequence(mesh.sequence_parallel_size)
    return (
        f"{phase} peak estimated at {peak / GIB:.1f} GiB of {p.gpu_memory_bytes / GIB:.1f} GiB with every sequence at "
        f"{tokens} tokens; the pinned {phase} micro-batch fits only if sequences are shorter"
        + (_recompute_hint(p, mesh) if phase == "train" else "")
    )


#: The megatron-core settings of full recompute, every layer with one layer per chunk (what verl's large-MoE
#: scripts pin when the update does not fit), and where verl 0.6 and 0.9 take them.
RECOMPUTE_KEYS = ("recompute_granularity", "recompute_method", "recompute_num_layers")
RECOMPUTE_PREFIX = "actor_rollout_ref.actor.megatron.override_transformer_config."


def _recompute_hint(p: Problem, mesh: Mesh) -> str:
    """For a Megatron update without recompute: the estimate with full recompute, when that fits the GPU."""
    o = p.megatron_options
    if p.training_engine != "megatron" or o.recompute_granularity is not None:
        return ""
    full = replace(o, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    peak = estimate(_memory_inputs(replace(p, megatron_options=full), mesh)).train.peak_bytes
    if peak > p.gpu_memory_bytes:
        return ""
    keys = " ".join(f"{RECOMPUTE_PREFIX}{key}={getattr(full, key)}" for key in RECOMPUTE_KEYS)
    return f"; with full recompute ({keys}) the estimate is {peak / GIB:.1f} GiB"


def _search_rest(p: Problem, layout: Layout, fixed: Fixed, m0: Mesh, record: Recorder) -> Found | None:
    train_rules = (
        rules.micro_divides_mini,
        rules_critic.critic_micro_divides_mini,
        rules.dynamic_token_budget,
    )
    dynamic = m0.settings.dynamic_batch_size
    train_pinned = (
        fixed.max_token_len_per_gpu is not None
        if dynamic
        else fixed.ppo_micro_batch_size_per_gpu is not None or fixed.ppo_micro_batch_size_global is not None
    )
    lp_pinned = (
        (fixed.log_prob_max_token_len_per_gpu or fixed.max_token_len_per_gpu) is not None
        if dynamic
        else fixed.log_prob_micro_batch_size_per_gpu is not None
        or fixed.log_prob_micro_batch_size_global is not None
    )
    for m1 in _train_options(p, m0, fixed):
        spend()
        vs = rules.check(p, m1, train_rules)
        if vs:
            record(_const(vs), 1)
            continue
        est = estimate(_memory_inputs(p, m1))
        train_warning = _pinned_overrun(p, m1, "train", train_pinned, est)
        if est.train.peak_bytes > p.gpu_memory_bytes and train_warning is None:
            record(_memory(p, m1, est, ("memory-train",)), 2)
            continue
        for m2 in _log_prob_options(p, m1, fixed):
            spend()
            vs = rules.check(p, m2, (rules.log_prob_micro_divides, rules.dynamic_token_budget))
            if vs:
                record(_const(vs), 3)
                continue
            est = estimate(_memory_inputs(p, m2))
            lp_warning = _pinned_overrun(p, m2, "log-prob", lp_pinned, est)
            if est.log_prob.peak_bytes > p.gpu_memory_bytes and lp_warning is None:
                record(_memory(p, m2, est, ("memory-log-prob",)), 4)
                continue
            found = _search_rollout(p, layout, fixed, m2, record)
            if found is None:
                return None
            extra = tuple(w for w in (train_warning, lp_warning) if w is not None)
            return replace(found, warnings=found.warnings + extra, overrun=bool(extra))
        return None
    return None


def _search_rollout(p: Problem, layout: Layout, fixed: Fixed, m2: Mesh, record: Recorder) -> Found | None:
    for tp in tp_candidates(p, layout, fixed):
        m3 = m2.changed(rollout_tp=tp)
        vs = rules.check(
            p,
            m3,
            (
                rules_rollout.rollout_tp_divides_world,
                rules_rollout.rollout_tp_heads,
                rules_rollout.rollout_replica_node,
                rules_rollout.rollout_expert_parallel,
                rules_rollout.nvlink_groups,
            ),
        )
        if vs:
            record(_const(vs), 5)
            continue
        gmu = fixed.gpu_memory_utilization
        if gmu is None:
            gmu = max_gpu_memory_utilization(_memory_inputs(p, m3))
            if gmu <= 0:
                gmu = 0.05
        m4 = m3.changed(gpu_memory_utilization=gmu)
        est = estimate(_memory_inputs(p, m4))
        rollout_here = not p.standalone_rollout  # a standalone rollout pool's memory: planner/job_pools.py
        if rollout_here and (
            est.rollout.peak_bytes > p.gpu_memory_bytes or est.kv_cache_tokens < p.model_len
        ):
            record(_memory(p, m4, est, ("memory-rollout", "kv-cache-max-model-len")), 6)
            continue
        final = rules.check(p, m4)
        if final:
            record(_const(final), 7)
            continue
        return Found(m4.settings, est)
    if not tp_candidates(p, layout, fixed):
        no_tp = [
            Violation(
                field="spec.rollout.tensorParallelSize",
                rule="rollout-tp-heads",
                message=(
                    f"no rollout TP size divides both the model's {p.shape.attention_heads} attention heads "
                    f"and {layout.world} GPUs within {layout.gpus_per_node} GPUs per node"
                ),
                suggestions=["use a GPU count whose divisors include a divisor of the head count"],
            )
        ]
        record(_const(no_tp), 5)
    return None
