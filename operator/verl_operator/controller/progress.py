"""A running job's progress: status.progress, the ``Progressing`` and ``Stalled`` conditions, the stall action
(pure).

The shell reads the head pod's progress endpoint (:mod:`verl_operator.controller.progress_client`) into a
:class:`ProgressReading`; :func:`follow` turns it into what the status says. Before the first step the head is
in one of three launch phases, each with its own deadline (``spec.monitoring.stall``): the Ray cluster
forming (pods run, Ray not formed), Ray formed (verl not started), verl started (no step yet). After the
first step, no new step within ``stepFactor`` x the median of the recent step times (at least
``minStepSeconds``) is a stall. Ages come from the launcher's own clock, so the two clocks need not agree.

Writes are bounded: ``status.progress`` is rewritten only when the step changed and
``statusIntervalSeconds`` have passed since it was last written, or the launch phase changed (a new attempt
included); the conditions' messages are derived from what is written, so a pass in between changes nothing.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from verl_contract.progress import ProgressDocument
from verl_operator.api.spec import MonitoringSpec, StallSpec
from verl_operator.api.status import (
    MAX_PROGRESS_PHASES,
    Condition,
    ProgressAdvice,
    ProgressColumns,
    ProgressStatus,
)
from verl_operator.controller.status import condition, format_time, parse_time
from verl_operator.controller.transition import Event

StallAction = Literal["none", "restart", "fail"]
#: Who wrote the ``status.progress`` a pass read, as far as the reconciling process knows: ``own`` (it did, or
#: there is none), ``unknown`` (it has written none since it started: its predecessor's, or anyone's),
#: ``other`` (not what it last wrote: someone else's, a ``kubectl patch --subresource=status``).
ProgressWriter = Literal["own", "unknown", "other"]

#: Steps a run needs before the advisor's first change is put in status.progress.advice; it is computed again
#: every ADVICE_EVERY steps (each time re-planned: a few plans per job every so many steps).
ADVICE_MIN_STEPS = 5
ADVICE_EVERY = 50

#: The reason of each stall, by the launch phase it happened in.
STALL_REASONS = {
    "RayForming": "RayNotFormed",
    "RayFormed": "VerlNotStarted",
    "VerlStarted": "NoFirstStep",
    "Stepping": "NoNewStep",
}


@dataclass(frozen=True)
class ProgressReading:
    """What the shell read from the head pod: the document, or why there is none."""

    document: ProgressDocument | None
    error: str | None = None


@dataclass(frozen=True)
class Followed:
    """What the status says about the run's progress.

    Attributes:
        progress: ``status.progress`` to write (the old one while writes are rate-limited).
        conditions: ``Progressing``, and ``Stalled`` while the run is stalled.
        stalled: The stall's reason and message, None while the run progresses.
        event: A Warning event when a stall starts, a Normal one when steps resume.
        action: What the stall asks for (``spec.monitoring.stall.action``); ``none`` while not stalled.
    """

    progress: ProgressStatus | None
    conditions: tuple[Condition, ...]
    stalled: tuple[str, str] | None = None
    event: Event | None = None
    action: StallAction = "none"


def _duration(seconds: float) -> str:
    """``7h47m``, ``12m05s``, ``41s``."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def median_step(doc: ProgressDocument) -> float | None:
    """The median of the recent step times (the last step's alone when none are listed)."""
    times = [s.seconds for s in doc.recent if s.seconds > 0]
    if times:
        return float(statistics.median(times))
    return doc.step_seconds


def deadline(doc: ProgressDocument, stall: StallSpec) -> tuple[float, float, str] | None:
    """``(age, deadline, what)`` of the launch phase the head is in; None when it is finished.

    Algorithm:
        RayForming, RayFormed and VerlStarted: the seconds in that phase against its own deadline. Stepping:
        the seconds since the last step against ``max(stepFactor x median recent step, minStepSeconds)``.
        Example: steps of 93.5 s, factor 5, floor 900 s -> a stall after 900 s without a step; steps of
        400 s -> after 2000 s.
    """
    phase = doc.launch_phase
    if phase == "RayForming":
        return doc.phase_age_seconds, stall.ray_forming_seconds, "the Ray cluster has not formed"
    if phase == "RayFormed":
        return doc.phase_age_seconds, stall.verl_start_seconds, "verl has not started"
    if phase == "VerlStarted":
        return doc.phase_age_seconds, stall.first_step_seconds, "verl has logged no step"
    if phase == "Stepping":
        med = median_step(doc) or 0.0
        limit = max(stall.step_factor * med, float(stall.min_step_seconds))
        age = doc.last_step_age_seconds if doc.last_step_age_seconds is not None else doc.phase_age_seconds
        what = (
            f"no new step (deadline max({stall.step_factor:g} x median step {med:.1f} s, "
            f"{stall.min_step_seconds} s) = {limit:.0f} s)"
        )
        return age, limit, what
    return None


def progress_of(doc: ProgressDocument, now: float) -> ProgressStatus:
    """``status.progress`` from the document read at ``now`` (seconds since the epoch)."""
    phases = dict(list(doc.phases.items())[:MAX_PROGRESS_PHASES])
    gen = phases.get("gen")
    share = gen / doc.step_seconds if gen is not None and doc.step_seconds else None
    med = median_step(doc)
    eta = None
    if doc.total_steps is not None and med is not None and doc.step:
        eta = round(max(0, doc.total_steps - doc.step) * med)
    last = None if doc.last_step_age_seconds is None else format_time(now - doc.last_step_age_seconds)
    return ProgressStatus(
        step=doc.step,
        total_steps=doc.total_steps,
        step_seconds=None if doc.step_seconds is None else round(doc.step_seconds, 3),
        phases={k: round(v, 3) for k, v in phases.items()},
        generation_share=None if share is None else round(share, 4),
        throughput_per_gpu=None if doc.throughput_per_gpu is None else round(doc.throughput_per_gpu, 3),
        mfu=None if doc.mfu is None else round(doc.mfu, 4),
        eta_seconds=eta,
        last_step_time=last,
        updated_at=format_time(now),
        launch_phase=doc.launch_phase,
        columns=ProgressColumns(
            step=f"{doc.step}/{doc.total_steps}" if doc.total_steps else str(doc.step),
            step_time="" if doc.step_seconds is None else f"{doc.step_seconds:.1f}s",
            generation="" if share is None else f"{share * 100:.0f}%",
            eta="" if eta is None else _duration(eta),
        ),
    )


def _advice(
    old: ProgressStatus | None,
    doc: ProgressDocument,
    advise: Callable[[ProgressDocument], ProgressAdvice | None] | None,
) -> ProgressAdvice | None:
    """The advice to write with a new progress: the old one until ADVICE_EVERY more steps are in."""
    kept = old.advice if old is not None and old.step // ADVICE_EVERY == doc.step // ADVICE_EVERY else None
    if kept is not None or advise is None or len(doc.recent) < ADVICE_MIN_STEPS:
        return kept
    return advise(doc)


def _due(old: ProgressStatus | None, new: ProgressStatus, interval: int, now: float) -> bool:
    """Write ``new`` now? First progress, a new launch phase or an earlier step (a new attempt) at once; a
    new step when ``interval`` seconds passed since the last write."""
    if old is None or old.launch_phase != new.launch_phase or new.step < old.step:
        return True
    if new.step == old.step:
        return False
    written = parse_time(old.updated_at)
    return written is None or now - written >= interval


def follow(
    old: ProgressStatus | None,
    reading: ProgressReading,
    monitoring: MonitoringSpec,
    *,
    stalled_before: Condition | None,
    now: float,
    generation: int,
    advise: Callable[[ProgressDocument], ProgressAdvice | None] | None = None,
) -> Followed:
    """The progress status and conditions of a Running job from one reading.

    Args:
        old: ``status.progress`` as read.
        reading: The head pod's progress document, or why none was read.
        monitoring: ``spec.monitoring``.
        stalled_before: The job's ``Stalled`` condition when it is True for a stall of this module (a reason
            of :data:`STALL_REASONS`), else None.
        now: Seconds since the epoch.
        generation: ``metadata.generation``.
        advise: The advisor for the run's recent steps (the advice is computed only when the progress is
            written, once ADVICE_MIN_STEPS steps are in, again every ADVICE_EVERY steps; kept in between).

    Returns:
        What to write; see :class:`Followed`.
    """
    stamp = format_time(now)
    was_stalled = stalled_before is not None
    doc = reading.document
    if doc is None:
        why = reading.error or "no answer"
        text = f"the head pod's progress endpoint cannot be read: {why}"
        return Followed(
            progress=old,
            conditions=(condition("Progressing", "Unknown", "ProgressUnavailable", text, generation, stamp),),
        )
    fresh = progress_of(doc, now)
    due = _due(old, fresh, monitoring.status_interval_seconds, now)
    if due:
        fresh = fresh.changed(advice=_advice(old, doc, advise))
    progress = fresh if due else old
    shown = progress or fresh
    limit = deadline(doc, monitoring.stall)
    if limit is not None and limit[0] > limit[1]:
        age, bound, what = limit
        reason = STALL_REASONS[doc.launch_phase]
        where = f"step {doc.step}" + (f" of {doc.total_steps}" if doc.total_steps else "")
        output = (
            "no output line yet"
            if doc.last_output_age_seconds is None
            else f"last output line {doc.last_output_age_seconds:.0f} s ago"
        )
        message = (
            f"{what} after {age:.0f} s (deadline {bound:.0f} s): last {where}, {output}, "
            f"launch phase {doc.launch_phase}"
        )
        # The message is fixed at the stall's start, so a stalled job's later passes write nothing.
        if stalled_before is not None and stalled_before.reason == reason:
            message = stalled_before.message
        return Followed(
            progress=progress,
            conditions=(
                condition("Progressing", False, reason, message, generation, stamp),
                condition("Stalled", True, reason, message, generation, stamp),
            ),
            stalled=(reason, message),
            event=None if was_stalled else Event("Warning", "Stalled", message),
            action=monitoring.stall.action,
        )
    if doc.launch_phase == "Stepping" or shown.step:
        text = f"step {shown.columns.step}" + (
            f", {shown.columns.step_time} per step" if shown.columns.step_time else ""
        )
        reason = "Stepping"
    else:
        bound = limit[1] if limit is not None else 0
        text = {
            "RayForming": f"the Ray cluster is forming (deadline {bound:.0f} s)",
            "RayFormed": f"the Ray cluster formed; verl is starting (deadline {bound:.0f} s)",
            "VerlStarted": f"verl started; waiting for its first step (deadline {bound:.0f} s)",
        }.get(doc.launch_phase, f"launch phase {doc.launch_phase}")
        reason = doc.launch_phase
    conds = [condition("Progressing", True, reason, text, generation, stamp)]
    if was_stalled:
        conds.append(condition("Stalled", False, "Progressing", text, generation, stamp))
    return Followed(
        progress=progress,
        conditions=tuple(conds),
        event=Event("Normal", "Progressing", f"steps resumed: {text}") if was_stalled else None,
    )


def advice_value(value: object) -> str:
    """An advice value as JSON text (status carries every value as a string)."""
    return json.dumps(value)
