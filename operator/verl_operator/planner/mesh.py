"""One owner of a candidate's mesh and batch arithmetic (the idea of torchtitan's ``ParallelDims``).

``Mesh.of(problem, settings)`` computes, once, every derived number verl's workers compute from the same
settings: the world, the data-parallel sizes (actor and critic), the FSDP shard group, the rollout replicas,
the trajectories and their padding, the per-GPU mini-batch and log-prob batch, the accumulation steps and the
NVLink group. The rules, the memory inputs and the report read them from here, so the numbers a violation
shows, the numbers the plan reports and the numbers the checks use cannot drift apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from verl_operator.planner.inputs import Problem, Settings


@dataclass(frozen=True)
class Mesh:
    """The derived numbers of one candidate layout (see the module docstring)."""

    world: int
    data_parallel_size: int
    critic_data_parallel_size: int
    fsdp_shard: int
    rollout_replicas: int
    trajectories: int
    padded_trajectories: int
    mini_per_gpu: int
    critic_mini_per_gpu: int
    log_prob_per_gpu: int
    nvlink_group_size: int
    pads: bool

    @classmethod
    def of(cls, p: Problem, s: Settings) -> Mesh:
        """The mesh of settings ``s`` for job ``p``."""
        dp = max(1, s.world // s.sequence_parallel_size)
        critic_dp = max(1, s.world // p.critic_sequence_parallel_size)
        mini = s.ppo_mini_batch_size * s.rollout_n
        # verl >= 0.7 pads the step's trajectories to lcm(DP, mini x n[, critic mini x n]); 0.6 does not.
        pads = p.version != "0.6"
        unit = math.lcm(dp, mini)
        padded = -(-s.trajectories // unit) * unit if pads else s.trajectories
        return cls(
            world=s.world,
            data_parallel_size=dp,
            critic_data_parallel_size=critic_dp,
            fsdp_shard=s.world if s.fsdp_size == -1 or s.fsdp_size >= s.world else s.fsdp_size,
            rollout_replicas=max(1, s.world // s.rollout_tp),
            trajectories=s.trajectories,
            padded_trajectories=padded,
            mini_per_gpu=mini // dp,
            critic_mini_per_gpu=mini // critic_dp,
            log_prob_per_gpu=padded // dp,
            nvlink_group_size=max(s.rollout_tp, s.sequence_parallel_size) if p.nvlink_required else 1,
            pads=pads,
        )

    @property
    def waste(self) -> int:
        """Zero-weight samples the trainer adds per step."""
        return self.padded_trajectories - self.trajectories

    def accumulation_steps(self, micro: int | None) -> int | None:
        """Gradient-accumulation steps of the actor's per-GPU mini-batch at ``micro`` (None: dynamic)."""
        return self.mini_per_gpu // micro if micro else None

    def log_prob_passes(self, micro: int | None) -> int | None:
        """Forward passes of the per-GPU log-prob batch at ``micro`` (None: dynamic)."""
        return math.ceil(self.log_prob_per_gpu / micro) if micro else None
