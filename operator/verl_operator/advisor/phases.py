"""A run's step phases from verl's metrics: each phase's seconds and share of the step, the bottleneck (pure).

verl times each phase of a step with ``marked_timer(name, timing_raw)`` and logs ``timing_s/<name>``
(``verl/trainer/ppo/metric_utils.py`` ``compute_timing_metrics``); ``timing_s/step`` is the wall time of the
step body. The phases are the timers inside the step (``gen``, ``reward``, ``old_log_prob``, ``ref``,
``values``, ``adv``, ``update_critic``, ``update_actor``, ``update_weights`` since 0.9, ``save_checkpoint``),
not the rollout's own sub-timings merged into the same dict (``agent_loop/*``, ``generate_sequences``,
``generation_timing/*``, ``reshard``: they are parts of ``gen``) and not the timers outside the step
(``testing``, ``start_profile``, ``stop_profile``). A phase's share is its seconds over ``timing_s/step``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from verl_contract.verl_metrics import Metrics, StepRecord

TIMING = "timing_s/"
STEP_KEY = "timing_s/step"
#: Timers outside the step body (``testing`` and the profiler's), and the step itself.
OUTSIDE_STEP = frozenset({"step", "testing", "start_profile", "stop_profile"})
#: Rollout sub-timings merged into the step's timing dict: parts of ``gen``, not phases of their own.
NESTED_PREFIXES = ("agent_loop/", "generation_timing/")
NESTED = frozenset({"generate_sequences", "reshard"})
#: Timers of verl's asynchronous trainers (one-step-off: ``wait_prev_gen``; fully async:
#: ``wait_for_enough_samples``, ``param_sync``): a run with any of them is not colocated.
ASYNC_TIMERS = frozenset({"wait_prev_gen", "wait_for_enough_samples", "param_sync"})
#: The generation share the method aims under (the rest of the step is the trainer's).
GENERATION_TARGET = 0.40


def phase_name(key: str) -> str | None:
    """``timing_s/gen`` -> ``gen``; None for a key that is not a phase of the step."""
    if not key.startswith(TIMING):
        return None
    name = key[len(TIMING) :]
    if name in OUTSIDE_STEP or name in NESTED or name.startswith(NESTED_PREFIXES) or not name:
        return None
    return name


@dataclass(frozen=True)
class StepPhases:
    """One step: its seconds and each phase's seconds."""

    step: int
    seconds: float
    phases: dict[str, float]
    metrics: Metrics


@dataclass(frozen=True)
class Phase:
    """A phase's median seconds over the steps after warm-up and its share of the median step."""

    seconds: float
    share: float


@dataclass(frozen=True)
class RunPhases:
    """The analysed run.

    Attributes:
        steps: Every step with a step time, in order (the last record of a step number wins).
        warmup: Leading steps left out of the medians.
        step_seconds: The median step time after warm-up.
        phases: Phase -> median seconds and share, largest first.
        bottleneck: The phase with the most median seconds.
        generation_share: ``gen``'s share (0 when the run logs no ``gen``).
        medians: The median of every other numeric metric after warm-up.
    """

    steps: tuple[StepPhases, ...]
    warmup: int
    step_seconds: float
    phases: dict[str, Phase]
    bottleneck: str
    generation_share: float
    medians: dict[str, float] = field(default_factory=dict)

    @property
    def measured(self) -> tuple[StepPhases, ...]:
        """The steps the medians are taken over."""
        return self.steps[self.warmup :]

    def seconds(self, *names: str) -> float:
        """The median seconds of the named phases together (0 for a phase the run does not have)."""
        return sum(self.phases[n].seconds for n in names if n in self.phases)

    def share(self, *names: str) -> float:
        return self.seconds(*names) / self.step_seconds

    def metric(self, key: str) -> float | None:
        return self.medians.get(key)

    @property
    def asynchronous(self) -> bool:
        return any(name in ASYNC_TIMERS for name in self.phases)


class NoStepsError(ValueError):
    """The input holds no step record with ``timing_s/step``."""


def warmup_steps(count: int) -> int:
    """Leading steps left out of the medians: a third of the steps, at most 2 (none with fewer than 3).

    The first step compiles kernels and captures the rollout engine's CUDA graphs, and the second may still
    warm caches. Example: 1 or 2 steps -> 0, 3 to 5 -> 1, 6 or more -> 2.
    """
    return min(2, count // 3)


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def analyse(records: Iterable[StepRecord], warmup: int | None = None) -> RunPhases:
    """Phases, shares and the bottleneck of a run's step records.

    Algorithm:
        Keep the records with ``timing_s/step > 0`` (the ``step:0`` validation record has none), the last
        record of each step number; leave the warm-up steps out (:func:`warmup_steps`); a phase's seconds are
        the median of its seconds over the remaining steps (0 in a step that does not have it), its share
        those seconds over the median step time. Example: steps of 10 s with ``gen`` 6, 5, 5 s and
        ``update_actor`` 3 s (3 steps, 1 warm-up): ``gen`` 5 s, share 0.5, the bottleneck.

    Raises:
        NoStepsError: no record has a step time.
    """
    by_step: dict[int, StepRecord] = {}
    for record in records:
        seconds = record.metrics.get(STEP_KEY)
        if isinstance(seconds, int | float) and seconds > 0:
            by_step.pop(record.step, None)
            by_step[record.step] = record
    steps = tuple(
        StepPhases(
            step=r.step,
            seconds=float(r.metrics[STEP_KEY]),
            phases={
                name: float(v)
                for key, v in r.metrics.items()
                if (name := phase_name(key)) is not None and v == v and v >= 0
            },
            metrics=r.metrics,
        )
        for r in sorted(by_step.values(), key=lambda r: r.step)
    )
    if not steps:
        raise NoStepsError(
            "no step record with timing_s/step: verl prints one per step as 'step:N - ... - "
            'timing_s/step:S\' (console) or writes {"step": N, "data": {"timing_s/step": S}} (file logger)'
        )
    skip = warmup_steps(len(steps)) if warmup is None else max(0, min(warmup, len(steps) - 1))
    measured = steps[skip:]
    step_seconds = _median([s.seconds for s in measured])
    names = sorted({n for s in measured for n in s.phases})
    medians = {n: _median([s.phases.get(n, 0.0) for s in measured]) for n in names}
    phases = {
        n: Phase(seconds=sec, share=sec / step_seconds)
        for n, sec in sorted(medians.items(), key=lambda kv: (-kv[1], kv[0]))
    }
    bottleneck = next(iter(phases), "step")
    keys = sorted({k for s in measured for k in s.metrics if k != STEP_KEY and phase_name(k) is None})
    other = {
        k: _median(vals)
        for k in keys
        if (vals := [float(v) for s in measured if (v := s.metrics.get(k)) is not None and v == v])
    }
    return RunPhases(
        steps=steps,
        warmup=skip,
        step_seconds=step_seconds,
        phases=phases,
        bottleneck=bottleneck,
        generation_share=phases["gen"].share if "gen" in phases else 0.0,
        medians=other,
    )


def first(medians: Mapping[str, float], *keys: str) -> float | None:
    """The first of ``keys`` the run logged (verl renamed some metrics between releases)."""
    for key in keys:
        if key in medians:
            return medians[key]
    return None
