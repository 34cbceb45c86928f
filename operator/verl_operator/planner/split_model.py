"""The throughput model that splits a two-pool job's GPUs between its rollout pool and its trainer pool.

Model: the pools run at the same time, so a step takes ``max(R / rollout_gpus, T / trainer_gpus)`` for the
step's rollout work R and training work T; the balance is ``rollout share f = rho / (1 + rho)`` with
``rho = R / T``. The work ratio grows with the share of generated tokens ``s = response / (prompt +
response)`` (training reads every token, rollout decodes the responses) and with a mixture-of-experts model's
sparsity ``m = params_total / params_active`` (decoding reads the experts' weights for few tokens each)::

    rho = kappa[mode] * s * m ** gamma

Calibration: ``kappa`` and ``gamma`` are fitted (least squares on ``log rho``) to the splits verl's authors
published with their measurements (``PUBLISHED``; verl ``docs/advance/fully_async.md``, ``one_step_off.md``,
``v1_async_trainer.md``). one_step_off's published split is its own family (rollout of step k+1 overlaps
training of step k with no partial rollout: its authors ran a quarter of the GPUs on rollout where fully_async
ran half). ``docs/planner.md`` lists the model's error against each row; ``tests/unit/test_split_model.py``
recomputes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

#: kappa per mode family, fitted to PUBLISHED (dense rows: log kappa = mean of log(rho / s)).
KAPPA = {"streaming": 1.0716, "one_step_off": 0.3908}
#: gamma, fitted to the streaming mixture-of-experts rows with kappa held.
GAMMA = 0.252


@dataclass(frozen=True)
class Published:
    """One published run: its split and the numbers the model reads."""

    source: str
    mode: str
    rollout_gpus: int
    trainer_gpus: int
    prompt: int
    response: int
    params_total_b: float
    params_active_b: float


#: verl's published runs (their docs; the scripts' lengths: recipe/fully_async_policy/shell/*.sh and
#: recipe/one_step_off_policy/*.sh at v0.6.1; the v1 doc states 32k responses, prompts taken as 2k).
PUBLISHED = (
    Published("fully_async.md Qwen2.5-Math-7B 32 H20", "fully_async", 16, 16, 2048, 28672, 7.616, 7.616),
    Published("fully_async.md Qwen2.5-Math-7B 64 H20", "fully_async", 32, 32, 2048, 28672, 7.616, 7.616),
    Published("fully_async.md Qwen2.5-Math-7B 128 H20", "fully_async", 64, 64, 2048, 28672, 7.616, 7.616),
    Published("fully_async.md Qwen3-30B-A3B 128 H20", "fully_async", 96, 32, 2048, 8192, 30.532, 3.353),
    Published(
        "one_step_off.md Qwen2.5-Math-7B FSDP2 16 H20", "one_step_off", 4, 12, 2048, 20480, 7.616, 7.616
    ),
    Published(
        "one_step_off.md Qwen2.5-Math-7B Megatron 16 H20", "one_step_off", 4, 12, 2048, 8192, 7.616, 7.616
    ),
    Published(
        "v1_async_trainer.md Qwen3.5-35B-A3B 32 H100", "separate_async", 16, 16, 2048, 32768, 35.0, 3.0
    ),
)


def family(mode: str) -> str:
    """The calibration family of a mode."""
    return "one_step_off" if mode == "one_step_off" else "streaming"


def rollout_fraction(
    mode: str, prompt: int, response: int, params_total: float, params_active: float
) -> float:
    """The balanced share of the job's GPUs for the rollout pool.

    Example: fully_async, Qwen2.5-Math-7B, 2k prompts, 28k responses: rho = 1.0716 x 0.933 = 1.00, f = 0.50
    (verl's 16:16 on 32 H20).
    """
    s = response / max(1, prompt + response)
    m = params_total / params_active if params_active > 0 else 1.0
    rho = KAPPA[family(mode)] * s * float(m**GAMMA)
    return rho / (1.0 + rho)


def split_error(row: Published) -> float:
    """The model's rollout share minus the published one."""
    f = rollout_fraction(
        row.mode, row.prompt, row.response, row.params_total_b * 1e9, row.params_active_b * 1e9
    )
    return f - row.rollout_gpus / (row.rollout_gpus + row.trainer_gpus)


def candidates(gpus: int, unit: int, fraction: float) -> list[int]:
    """Trainer pool sizes (multiples of ``unit``, both pools non-empty), nearest the model's balance first;
    ties go to the larger trainer pool (a trainer pool that is too small fails the mini-batch split first).

    Example: 16 GPUs in units of 8, f = 0.5 -> [8]; 32 in units of 8, f = 0.6 -> [16, 8, 24].
    """
    target = gpus * (1.0 - fraction)
    sizes = [k * unit for k in range(1, gpus // unit) if gpus - k * unit >= 1]
    return sorted(sizes, key=lambda t: (round(abs(t - target), 9), -t))


def log_fit_residual(row: Published) -> float:
    """The fit's residual on ``log rho`` for one row (what the constants minimise)."""
    f = row.rollout_gpus / (row.rollout_gpus + row.trainer_gpus)
    model = rollout_fraction(
        row.mode, row.prompt, row.response, row.params_total_b * 1e9, row.params_active_b * 1e9
    )
    return math.log(model / (1 - model)) - math.log(f / (1 - f))


@dataclass(frozen=True)
class Measured:
    """A previous run's measured balance (``advisor.balance`` reads it from the run's phase times).

    Attributes:
        rollout_fraction: The share of the job's GPUs the rollout pool needs so that neither pool waits.
        basis: How it was measured, for the plan and ``verl-operator plan`` (bounded text).
        kind: ``colocated``: the phase times of a run on one pool; ``pools``: a two-pool run's waits.
    """

    rollout_fraction: float
    basis: str
    kind: Literal["colocated", "pools"] = "colocated"


def measured_fraction(rho: float, mode: str, kind: str) -> float:
    """The rollout share of a measured work ratio ``rho`` (rollout GPU-seconds over training GPU-seconds).

    A colocated run's ratio is the streaming modes' balance as measured; one_step_off generates each batch
    whole, without partial rollout, behind one training step, and its authors' split gives rollout the
    share the calibration's family ratio says (``KAPPA['one_step_off'] / KAPPA['streaming']`` = 0.365), so a
    colocated measurement is scaled by it. A two-pool run's ratio is its own mode's already.

    Example: verl's colocated Qwen2.5-Math-7B on 32 H20 (gen 357.41 s; old_log_prob 107.71 + update_actor
    269.8 s): rho 0.947, fully_async share 0.486 -> 16 : 16, verl's own split.
    """
    if kind == "colocated" and family(mode) == "one_step_off":
        rho *= KAPPA["one_step_off"] / KAPPA["streaming"]
    return rho / (1.0 + rho)
