"""verl's per-step metrics as it prints them: one reader for the launcher (live lines) and the advisor (logs).

verl's console logger (``verl/utils/logger/aggregate_logger.py`` ``concat_dict_to_str``) prints one line per
step::

    step:3 - timing_s/gen:1.52 - perf/throughput:812.4 - critic/score/mean:0.25

built as ``" - ".join(["step:<n>", *(f"{key}:{pprint.pformat(value)}")])`` for numeric values (releases up to
0.4.1 format every value with 3 decimals). Run inside a Ray actor, the line reaches the driver's stdout behind
a prefix such as ``(TaskRunner pid=123)`` (``(main_task pid=..)`` in early releases), possibly with ANSI
colours; with numpy 2 a value may read ``np.float64(0.5)``. verl's file logger (``trainer.logger=['file']``,
``verl/utils/tracking.py`` ``FileLogger``) writes one JSON object per step: ``{"step": N, "data": {...}}``.
The releases before 0.3 named the timers ``timing/<name>``; they are read as ``timing_s/<name>``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RAY_PREFIX = re.compile(r"^\s*\([^()]*\)\s*")
_STEP = re.compile(r"^step:(\d+)(?:\s+-\s+|\s*$)")
_WRAPPED = re.compile(r"^[A-Za-z_][\w.]*\((.*)\)$")
_TOTAL = re.compile(r"Total training steps:\s*(\d+)")
#: A line longer than this is not read (a console line of verl 0.9 with every metric is about 6 KB).
MAX_LINE_CHARS = 262_144

Metrics = dict[str, float | int]


@dataclass(frozen=True)
class StepRecord:
    """One step's numeric metrics as verl logged them (non-numeric values left out)."""

    step: int
    metrics: Metrics


def _number(text: str) -> float | int | None:
    text = text.strip()
    wrapped = _WRAPPED.match(text)
    if wrapped:
        text = wrapped.group(1).strip()
    if text in ("True", "False"):
        return int(text == "True")
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


def _key(key: str) -> str:
    """``timing/gen`` (releases before 0.3) -> ``timing_s/gen``; other keys unchanged."""
    return "timing_s/" + key[len("timing/") :] if key.startswith("timing/") else key


def parse_step_line(line: str) -> tuple[int, Metrics] | None:
    """Parse one line of verl's console output.

    Args:
        line: A line as printed (ANSI colours and a Ray ``(Actor pid=..)`` prefix are tolerated).

    Returns:
        ``(step, metrics)`` for a metric line, None for any other line. Values that are not numbers are
        left out.
    """
    if len(line) > MAX_LINE_CHARS:
        return None
    text = _RAY_PREFIX.sub("", _ANSI.sub("", line).strip(), count=1)
    match = _STEP.match(text)
    if not match:
        return None
    metrics: Metrics = {}
    for part in text[match.end() :].split(" - "):
        key, sep, value = part.rpartition(":")
        if not sep or not key.strip():
            continue
        number = _number(value)
        if number is not None:
            metrics[_key(key.strip())] = number
    return int(match.group(1)), metrics


def parse_json_line(line: str) -> tuple[int, Metrics] | None:
    """Parse one line of verl's file logger (``{"step": N, "data": {...}}``); None for any other line."""
    text = line.strip()
    if not text.startswith("{") or len(text) > MAX_LINE_CHARS:
        return None
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    step, data = record.get("step"), record.get("data")
    if isinstance(step, bool) or not isinstance(step, int) or not isinstance(data, dict):
        return None
    metrics: Metrics = {}
    for key, value in data.items():
        if isinstance(value, bool):
            metrics[_key(str(key))] = int(value)
        elif isinstance(value, int | float):
            metrics[_key(str(key))] = value
    return step, metrics


def parse_total_steps(line: str) -> int | None:
    """The total from verl's ``Total training steps: N`` line, None for other lines."""
    match = _TOTAL.search(_ANSI.sub("", line[:MAX_LINE_CHARS]))
    return int(match.group(1)) if match else None


def read_steps(lines: Iterable[str]) -> Iterator[StepRecord]:
    """Every step record of console or file-logger lines, in order (other lines are skipped).

    A console line hard-wrapped at its separators (lines that start with ``- `` after a ``step:N`` line, as
    terminals and documentation show long lines) is joined back before it is read.
    """
    pending: str | None = None
    for line in lines:
        stripped = _ANSI.sub("", line).strip()
        if pending is not None and stripped.startswith("- ") and len(pending) < MAX_LINE_CHARS:
            pending += " " + stripped
            continue
        if pending is not None:
            parsed = parse_step_line(pending)
            if parsed is not None:
                yield StepRecord(*parsed)
            pending = None
        record = parse_json_line(line)
        if record is not None:
            yield StepRecord(*record)
        elif parse_step_line(line) is not None:
            pending = line.rstrip("\n")
    if pending is not None:
        parsed = parse_step_line(pending)
        if parsed is not None:
            yield StepRecord(*parsed)


def finite(value: float | int | None) -> float | int | None:
    """The value, or None for NaN and infinities (JSON has no spelling for them)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return value
