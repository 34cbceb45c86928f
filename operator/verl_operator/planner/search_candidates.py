"""The search's candidate values per layout: SP, FSDP and rollout TP sizes, mini-batches, the default batch."""

from __future__ import annotations

from verl_operator.planner import arith
from verl_operator.planner.cluster import Layout
from verl_operator.planner.inputs import Fixed, Problem
from verl_operator.planner.mesh import (
    batch_step,
    divides_over,
    fewest_batch,
    fits_nvlink_domain,
    heads_allow_sp,
    heads_allow_tp,
    rollout_tp_sizes,
)

#: verl's default data.train_batch_size, the target when the batch is not pinned.
DEFAULT_TRAIN_BATCH = 1024


def default_train_batch(world: int, n: int) -> int:
    """The multiple of ``world / gcd(world, n)`` nearest to 1024 (``train_batch_size x n`` divides the world)."""
    unit = batch_step(world, n)
    k = max(1, round(DEFAULT_TRAIN_BATCH / unit))
    return k * unit


def sp_candidates(p: Problem, layout: Layout, fixed: Fixed) -> list[int]:
    """Ulysses SP sizes to try, preferred first."""
    if fixed.sequence_parallel_size is not None:
        return [fixed.sequence_parallel_size]
    return [
        d
        for d in arith.divisors(layout.gpus_per_node)
        if heads_allow_sp(p.shape, d)
        and (not p.nvlink_required or fits_nvlink_domain(d, layout.nvlink_domain))
    ] or [1]


def fsdp_candidates(layout: Layout, fixed: Fixed) -> list[int]:
    """FSDP shard group sizes to try, preferred first."""
    if fixed.fsdp_size is not None:
        return [fixed.fsdp_size]
    return [layout.gpus_per_node, -1] if layout.nnodes > 1 else [-1]


def tp_candidates(p: Problem, layout: Layout, fixed: Fixed) -> list[int]:
    """Rollout TP sizes to try, smallest first."""
    if fixed.rollout_tp is not None:
        return [fixed.rollout_tp]
    if p.rollout_ep is not None and p.rollout_ep > 1:
        return [p.rollout_ep]  # verl: EP == TP x DP with rollout DP 1
    return [
        tp
        for tp in rollout_tp_sizes(layout.gpus_per_node, layout.nnodes)
        if heads_allow_tp(p.shape, tp)
        and (not p.nvlink_required or fits_nvlink_domain(tp, layout.nvlink_domain))
    ]


def mini_candidates(tb: int, n: int, dp: int, fixed: Fixed) -> list[int]:
    """PPO mini-batch sizes to try, preferred first (closest to ``tb / 4``, dividing ``tb``)."""
    if fixed.ppo_mini_batch_size is not None:
        return [fixed.ppo_mini_batch_size]
    target = max(1, tb // 4)

    def key(m: int) -> tuple[int, int]:
        return (abs(m - target), -m)

    valid = [m for m in arith.divisors(tb) if divides_over(m * n, dp)]
    if valid:
        return [min(valid, key=key)]
    # No divisor of the batch works: a mini-batch that leaves a partial last one (verl >= 0.7 pads it). The
    # values with m x n % dp == 0 are the multiples of u = dp / gcd(dp, n); the closest to the target among
    # those with m x n >= dp and m <= tb is one of the two multiples around it, clipped to that range.
    unit = batch_step(dp, n)
    fewest = fewest_batch(dp, n)  # m x n >= dp
    low = unit * max(1, -(-fewest // unit))
    high = tb // unit * unit
    if low > high:
        return [target]
    below = target // unit * unit
    return [min({min(max(m, low), high) for m in (below, below + unit)}, key=key)]
