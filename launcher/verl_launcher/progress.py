"""Parse the step metrics verl prints and keep a small progress record.

verl's console logger (``verl/utils/logger/aggregate_logger.py``) prints one line per step::

    step:3 - timing_s/gen:1.52 - perf/throughput:812.4 - critic/score/mean:0.25

built as ``" - ".join(["step:<n>", *(f"{key}:{pprint.pformat(value)}")])`` for numeric values. Run inside a
Ray actor, the line reaches the driver's stdout behind a prefix such as ``(TaskRunner pid=123)``, possibly
with ANSI colours; with numpy 2 a value may read ``np.float64(0.5)``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from threading import Lock
from typing import Any

from verl_contract.progress import MAX_PHASES, MAX_RECENT, LaunchPhase, ProgressDocument, StepSample
from verl_contract.verl_metrics import parse_step_line, parse_total_steps

#: verl's step-body timers that are not phases of their own (parts of gen, or outside the step): the
#: advisor's list (verl_operator.advisor.phases), kept here for the launcher, which imports no operator code.
_NOT_PHASES = frozenset({"step", "testing", "start_profile", "stop_profile", "generate_sequences", "reshard"})


def step_phases(metrics: dict[str, float | int]) -> dict[str, float]:
    """The phases of one step: ``timing_s/<name>`` without the rollout's sub-timings (at most 32)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if not key.startswith("timing_s/") or not isinstance(value, int | float) or value != value:
            continue
        name = key[len("timing_s/") :]
        if name in _NOT_PHASES or "/" in name or value < 0 or len(out) >= MAX_PHASES:
            continue
        out[name] = float(value)
    return out


__all__ = ["HEADLINE_METRICS", "ProgressTracker", "parse_step_line", "parse_total_steps"]

#: The metrics copied into the concise progress record, with their short names.
HEADLINE_METRICS: dict[str, str] = {
    "perf/throughput": "throughput",
    "timing_s/step": "stepSeconds",
    "training/epoch": "epoch",
    "critic/score/mean": "scoreMean",
    "response_length/mean": "responseLengthMean",
    "actor/pg_loss": "pgLoss",
}


def _finite(value: float | int) -> float | int | None:
    return value if not isinstance(value, float) or math.isfinite(value) else None


@dataclass
class ProgressTracker:
    """Keeps the latest step's metrics and writes them to a JSON file (atomically).

    Attributes:
        path: The progress file (``/tmp/verl-progress.json`` by default), or None to keep it in memory.
        step: The latest step seen (0 before the first).
        total_steps: From verl's ``Total training steps`` line, when seen.
        metrics: The latest step's numeric metrics.
    """

    path: Path | None = None
    step: int = 0
    total_steps: int | None = None
    metrics: dict[str, float | int] = field(default_factory=dict)
    updated_at: float = 0.0
    launch_phase: LaunchPhase = "RayForming"
    phase_since: float = field(default_factory=time.monotonic)
    last_output: float | None = None
    last_step: float | None = None
    recent: deque[StepSample] = field(default_factory=lambda: deque(maxlen=MAX_RECENT))
    lock: Lock = field(default_factory=Lock, repr=False, compare=False)

    def enter(self, phase: LaunchPhase) -> None:
        """The head entered ``phase`` (the Ray cluster formed, verl started, verl finished)."""
        with self.lock:
            if phase != self.launch_phase:
                self.launch_phase, self.phase_since = phase, time.monotonic()

    def progress(self, now: float | None = None) -> ProgressDocument:
        """The progress document served to the operator (ages measured on this clock)."""
        now = time.monotonic() if now is None else now
        with self.lock:
            step_seconds = self.metrics.get("timing_s/step")
            mfu = self.metrics.get("perf/mfu/actor")
            throughput = self.metrics.get("perf/throughput")
            return ProgressDocument(
                launch_phase=self.launch_phase,
                phase_age_seconds=max(0.0, now - self.phase_since),
                step=self.step,
                total_steps=self.total_steps,
                step_seconds=_finite(step_seconds) if step_seconds is not None else None,
                phases=step_phases(self.metrics),
                throughput_per_gpu=_finite(throughput) if throughput is not None else None,
                mfu=mfu if mfu is not None and 0 < mfu <= 1 else None,
                last_step_age_seconds=None if self.last_step is None else max(0.0, now - self.last_step),
                last_output_age_seconds=None
                if self.last_output is None
                else max(0.0, now - self.last_output),
                recent=list(self.recent),
            )

    def feed(self, line: str) -> dict[str, Any] | None:
        """Consume one line of verl output.

        Args:
            line: The line.

        Returns:
            The concise record when the line was a step line (print it as ``VERL_PROGRESS <json>``), else None.
        """
        self.last_output = time.monotonic()
        total = parse_total_steps(line)
        if total is not None:
            self.total_steps = total
            self._write()
            return None
        parsed = parse_step_line(line)
        if parsed is None:
            return None
        with self.lock:
            self.step, self.metrics = parsed
            self.updated_at = time.time()
            self.last_step = self.last_output
            seconds = self.metrics.get("timing_s/step")
            if seconds is not None and _finite(seconds) is not None and seconds >= 0:
                self.recent.append(
                    StepSample(step=self.step, seconds=float(seconds), phases=step_phases(self.metrics))
                )
            if self.launch_phase in ("RayForming", "RayFormed", "VerlStarted"):
                self.launch_phase, self.phase_since = "Stepping", self.last_output
        self._write()
        return self.summary()

    def summary(self) -> dict[str, Any]:
        """The concise record: step, totalSteps and the headline metrics (non-finite values as null)."""
        record: dict[str, Any] = {"step": self.step, "totalSteps": self.total_steps}
        for key, short in HEADLINE_METRICS.items():
            if key in self.metrics:
                record[short] = _finite(self.metrics[key])
        return record

    def document(self) -> dict[str, Any]:
        """The progress file's content: the summary plus every metric of the latest step."""
        return {
            **self.summary(),
            "updatedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.updated_at or time.time())),
            "metrics": {k: _finite(v) for k, v in sorted(self.metrics.items())},
        }

    def _write(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".verl-progress-")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(self.document(), handle, allow_nan=False)
        os.replace(tmp, self.path)
