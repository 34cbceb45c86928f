"""A previous run's measured rollout:trainer balance, for the split of a two-pool job (pure).

The pools run at once, so neither waits when the rollout pool's GPUs are ``f = rho / (1 + rho)`` of the job's,
with ``rho`` the step's rollout work over its training work in GPU-seconds (``planner/split_model.py``). A run
measures ``rho`` in one of two ways:

- **Colocated** (verl's ``main_ppo``, one pool): every phase ran on the same GPUs, so ``rho`` is the median
  ``gen`` seconds over the median seconds of the trainer's phases (``old_log_prob``, ``ref``, ``values``,
  ``update_critic``, ``update_actor``). The driver's CPU phases (``reward``, ``adv``), the weight sync
  (``update_weights``) and checkpoints are neither pool's work.
- **Two pools** of ``R0`` rollout and ``T0`` trainer GPUs (the measured run's split, given by the caller):
  with both pools' idle ratios (fully_async's ``trainer/idle_ratio`` and ``rollouter/idle_ratio``) ``rho =
  (1 - idle_r) R0 / ((1 - idle_t) T0)``; else from the trainer's wait for rollout (``wait_for_enough_samples``,
  ``wait_prev_gen``; in the v1 async modes ``gen`` is that wait, verl ``docs/advance/v1_async_trainer.md``): a
  trainer that waits ``w`` of a step of ``s`` seconds had a rollout pool busy all the time, ``rho = R0 / ((1 -
  w / s) T0)``; a trainer that never waits bounds the rollout's work from above only (``rho <= R0 / T0``), so
  the measured run's split is kept as the balance (``basis`` says so).

Checked against verl's published runs in ``tests/unit/test_balance.py`` (``docs/planner.md`` lists them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from verl_contract.verl_metrics import StepRecord
from verl_operator.advisor.phases import STEP_KEY, TIMING, RunPhases, analyse
from verl_operator.api.status import ProgressStatus
from verl_operator.planner.split_model import Measured, measured_fraction

#: The trainer's phases of a colocated step (the actor's, the reference's and the critic's GPU work).
TRAIN_PHASES = ("old_log_prob", "ref", "values", "update_critic", "update_actor")
#: The rollout's phase of a colocated step.
ROLLOUT_PHASES = ("gen",)
#: Timers of a two-pool trainer waiting for the rollout (fully_async, one_step_off).
WAIT_TIMERS = ("wait_for_enough_samples", "wait_prev_gen")
#: The pools' idle ratios fully_async logs (0.6.1 ``recipe/fully_async_policy/detach_utils.py`` line 511,
#: ``fully_async_rollouter.py`` line 213).
IDLE_KEYS = ("trainer/idle_ratio", "rollouter/idle_ratio")
#: A trainer that waits less than this share of its step counts as never waiting.
WAIT_FLOOR = 0.02


class BalanceError(ValueError):
    """The run's metrics do not measure the balance (no generation or no training phase, pools unknown)."""


@dataclass(frozen=True)
class Pools:
    """The measured run's pools: rollout GPUs and trainer GPUs."""

    rollout_gpus: int
    trainer_gpus: int

    @classmethod
    def parse(cls, text: str) -> Pools:
        """``8:24`` -> 8 rollout GPUs, 24 trainer GPUs.

        Raises:
            BalanceError: not two positive integers ``ROLLOUT:TRAINER``.
        """
        parts = text.split(":")
        if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
            raise BalanceError(f"pools {text!r}: want ROLLOUT:TRAINER GPUs of the measured run, e.g. 16:16")
        return cls(int(parts[0]), int(parts[1]))


def measured_balance(
    run: RunPhases, mode: str, pools: Pools | None = None, name: str = "the run"
) -> Measured:
    """The balance ``run`` measured, as the rollout share of the GPUs for a job of ``mode``.

    Args:
        run: The analysed run (``advisor.phases.analyse``).
        mode: The trainer mode of the job being planned (one_step_off scales a colocated measurement:
            ``split_model.measured_fraction``).
        pools: The measured run's pools; None: the run was colocated.
        name: What the basis calls the run (the metrics file).

    Raises:
        BalanceError: see the module's docstring.
    """
    if pools is None:
        if run.asynchronous:
            raise BalanceError(
                f"{name} is a two-pool run (it logs {', '.join(sorted(set(run.phases) & set(WAIT_TIMERS)))} "
                "or param_sync): give its pools, ROLLOUT:TRAINER GPUs"
            )
        gen, train = run.seconds(*ROLLOUT_PHASES), run.seconds(*TRAIN_PHASES)
        if gen <= 0 or train <= 0:
            missing = "timing_s/gen" if gen <= 0 else "timing_s/update_actor or old_log_prob"
            raise BalanceError(f"{name} logs no {missing}: its phases do not measure the balance")
        rho = gen / train
        basis = (
            f"{name}: colocated, gen {gen:.1f} s vs training {train:.1f} s per step "
            f"({' + '.join(p for p in TRAIN_PHASES if p in run.phases)}), rho {rho:.3f}"
        )
        return Measured(round(measured_fraction(rho, mode, "colocated"), 4), basis, "colocated")
    r0, t0 = pools.rollout_gpus, pools.trainer_gpus
    idle_t, idle_r = (run.metric(k) for k in IDLE_KEYS)
    if idle_t is not None and idle_r is not None and idle_t < 1 and idle_r < 1:
        rho = (1 - idle_r) * r0 / ((1 - idle_t) * t0)
        basis = (
            f"{name}: {r0} rollout : {t0} trainer GPUs, idle rollouter {idle_r:.0%}, trainer {idle_t:.0%}, "
            f"rho {rho:.3f}"
        )
        return Measured(round(measured_fraction(rho, mode, "pools"), 4), basis, "pools")
    timers = [t for t in WAIT_TIMERS if t in run.phases] or (["gen"] if "gen" in run.phases else [])
    wait = run.seconds(*timers)
    share = wait / run.step_seconds if run.step_seconds > 0 else 0.0
    if share >= WAIT_FLOOR and share < 1:
        rho = r0 / ((1 - share) * t0)
        basis = (
            f"{name}: {r0} rollout : {t0} trainer GPUs, the trainer waited {wait:.1f} s of {run.step_seconds:.1f} "
            f"s per step ({'+'.join(timers)}): the rollout pool is the bottleneck, rho {rho:.3f}"
        )
    else:
        rho = r0 / t0
        basis = (
            f"{name}: {r0} rollout : {t0} trainer GPUs, the trainer never waited for rollout: the rollout pool "
            "keeps up, its share is at most the run's (kept)"
        )
    return Measured(round(measured_fraction(rho, mode, "pools"), 4), basis, "pools")


def balance_from_status(status: Mapping[str, Any] | None, mode: str) -> Measured:
    """The balance a job's own last run measured: ``status.progress`` (the last step's phase seconds, as the
    operator read them from the head pod) on the pools of ``status.plan.pools`` (two pools when the plan had
    a rollout pool; else the run was colocated). One step, not a median: the basis says so.

    Raises:
        BalanceError: no status, no progress with a step time and phases, or phases that do not measure it.
    """
    progress_doc = (status or {}).get("progress")
    try:
        progress = ProgressStatus.model_validate(progress_doc) if isinstance(progress_doc, Mapping) else None
    except ValidationError as exc:
        raise BalanceError(f"status.progress is not a progress status: {exc.errors()[0]['msg']}") from exc
    if progress is None or not progress.step_seconds or not progress.phases:
        raise BalanceError("status.progress has no step time and phases: the job has not logged a step yet")
    metrics: dict[str, float] = {STEP_KEY: progress.step_seconds}
    metrics.update({f"{TIMING}{name}": seconds for name, seconds in progress.phases.items()})
    run = analyse([StepRecord(max(progress.step, 1), metrics)])
    pools_doc = ((status or {}).get("plan") or {}).get("pools") or {}
    rollout, trainer = pools_doc.get("rollout"), pools_doc.get("trainer") or {}
    pools = None
    if isinstance(rollout, Mapping) and rollout.get("gpus") and trainer.get("gpus"):
        pools = Pools(int(rollout["gpus"]), int(trainer["gpus"]))
    return measured_balance(run, mode, pools, name=f"status.progress (step {progress.step})")
