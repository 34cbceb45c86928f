"""What ``kubectl verl status``, ``top`` and ``logs`` print, from VerlJob objects as the API server returns
them (pure: no client). Every status field is read defensively: a field an older operator does not write
shows as ``-``.

``status.progress`` (written by the operator from the launcher's step lines): ``step``, ``totalSteps``,
``stepSeconds``, ``phases`` (name -> seconds), ``generationShare`` (0..1), ``throughputPerGpu`` (tokens/s),
``mfu`` (0..1), ``etaSeconds``, ``lastStepTime``, ``updatedAt``; conditions ``Progressing`` and ``Stalled``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: What a missing value prints as (kubectl prints ``<none>`` in tables; ``-`` keeps columns narrow).
NONE = "-"
#: The launcher's prefix of the Ray head's own output lines (``verl_launcher.head``): not verl's.
RAY_HEAD_PREFIX = "[ray-head] "
TOP_COLUMNS = ("NAME", "PHASE", "STEP", "STEP TIME", "GEN SHARE", "TOKENS/S/GPU", "MFU", "ETA")


def dig(obj: Any, *path: str) -> Any:
    """``obj[path[0]][path[1]]...``, or None where a level is missing or not a mapping."""
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def duration(seconds: Any) -> str:
    """``42s``, ``3m05s``, ``2h01m``, ``1d02h``; ``-`` when not a number."""
    value = _number(seconds)
    if value is None or value < 0:
        return NONE
    if value < 60:
        return f"{value:.1f}s" if value < 10 and value != int(value) else f"{int(value)}s"
    total = int(value)
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    if total < 86400:
        return f"{total // 3600}h{total % 3600 // 60:02d}m"
    return f"{total // 86400}d{total % 86400 // 3600:02d}h"


def percent(value: Any) -> str:
    """A 0..1 share as ``61%``; ``-`` when not a number."""
    number = _number(value)
    return NONE if number is None else f"{number * 100:.0f}%"


def amount(value: Any) -> str:
    """A rate: ``1234``, ``12.3k``; ``-`` when not a number."""
    number = _number(value)
    if number is None:
        return NONE
    return f"{number / 1000:.1f}k" if abs(number) >= 10000 else f"{number:.0f}"


def step_text(progress: Any) -> str:
    """``12/100``, ``12`` (no total) or ``-``."""
    step, total = _number(dig(progress, "step")), _number(dig(progress, "totalSteps"))
    if step is None:
        return NONE
    return f"{int(step)}/{int(total)}" if total is not None else str(int(step))


def top_row(job: Mapping[str, Any], with_namespace: bool) -> list[str]:
    """One ``kubectl verl top`` row of a VerlJob."""
    progress = dig(job, "status", "progress")
    row = [
        str(dig(job, "metadata", "name") or NONE),
        str(dig(job, "status", "phase") or NONE),
        step_text(progress),
        duration(dig(progress, "stepSeconds")),
        percent(dig(progress, "generationShare")),
        amount(dig(progress, "throughputPerGpu")),
        percent(dig(progress, "mfu")),
        duration(dig(progress, "etaSeconds")),
    ]
    return [str(dig(job, "metadata", "namespace") or NONE), *row] if with_namespace else row


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Columns as kubectl prints them: upper-case header, left-aligned, three spaces apart."""
    rows = [list(header), *[list(r) for r in rows]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "".join(
        "   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in rows
    )


def top_table(jobs: Sequence[Mapping[str, Any]], with_namespace: bool) -> str:
    """``kubectl verl top``: every job's step, step time, generation share, throughput, MFU and ETA."""
    header = ("NAMESPACE", *TOP_COLUMNS) if with_namespace else TOP_COLUMNS
    return table(header, (top_row(job, with_namespace) for job in jobs))


def _plan_lines(plan: Any, status: Mapping[str, Any]) -> list[str]:
    if not isinstance(plan, Mapping):
        return [f"Plan:        {NONE}"]
    nodes, per_node = plan.get("nnodes"), plan.get("gpusPerNode")
    rollout = plan.get("rollout") if isinstance(plan.get("rollout"), Mapping) else {}
    batching = plan.get("batching") if isinstance(plan.get("batching"), Mapping) else {}
    lines = [
        f"Plan:        {nodes if nodes is not None else NONE} x {per_node if per_node is not None else NONE} GPUs,"
        f" verl {plan.get('verlVersion') or NONE}, mesh {status.get('mesh') or NONE}",
    ]
    if rollout:
        lines.append(
            f"  rollout:   {rollout.get('name') or NONE} TP {rollout.get('tensorParallelSize') or NONE}, "
            f"{rollout.get('replicas') or NONE} replicas"
        )
    if batching:
        lines.append(
            f"  batch:     {batching.get('trainBatchSize') or NONE} prompts x n {batching.get('rolloutN') or NONE}, "
            f"mini-batch {batching.get('ppoMiniBatchSize') or NONE}"
        )
    return lines


def _placement_lines(placement: Any, status: Mapping[str, Any]) -> list[str]:
    nodes = dig(placement, "nodes") or (status.get("nodes") or "").split(",")
    nodes = [n for n in nodes if n]
    where = ", ".join(
        f"{k} {v}"
        for k, v in (("domain", dig(placement, "domain")), ("clique", dig(placement, "clique")))
        if v
    )
    line = f"Placement:   {', '.join(nodes) if nodes else NONE}" + (f" ({where})" if where else "")
    lines = [line]
    message = dig(placement, "message")
    if message:
        lines.append(f"  {message}")
    return lines


def _progress_lines(progress: Any) -> list[str]:
    if not isinstance(progress, Mapping):
        return [f"Progress:    {NONE}"]
    lines = [
        f"Progress:    step {step_text(progress)}, step time {duration(progress.get('stepSeconds'))}, "
        f"generation {percent(progress.get('generationShare'))}, "
        f"{amount(progress.get('throughputPerGpu'))} tokens/s per GPU, MFU {percent(progress.get('mfu'))}, "
        f"ETA {duration(progress.get('etaSeconds'))}",
    ]
    phases = progress.get("phases")
    if isinstance(phases, Mapping) and phases:
        lines.append("  phases:    " + ", ".join(f"{k} {duration(v)}" for k, v in phases.items()))
    last = progress.get("lastStepTime") or progress.get("updatedAt")
    if last:
        lines.append(f"  last step: {last}")
    return lines


def _advice_lines(status: Mapping[str, Any]) -> list[str]:
    """The advice the status carries: ``status.advice`` (strings, or objects with a message) and the
    ``Stalled`` / ``Progressing`` conditions' messages."""
    lines: list[str] = []
    advice = status.get("advice")
    items = advice if isinstance(advice, list) else [advice] if advice else []
    for item in items:
        text = item.get("message") or item.get("summary") if isinstance(item, Mapping) else item
        if text:
            lines.append(f"  - {text}")
    for condition in status.get("conditions") or []:
        if (
            isinstance(condition, Mapping)
            and condition.get("type") in ("Stalled", "Progressing")
            and condition.get("message")
            and (condition.get("type") == "Progressing" or condition.get("status") == "True")
        ):
            lines.append(f"  - {condition.get('type')}: {condition['message']}")
    return ["Advice:", *lines] if lines else [f"Advice:      {NONE}"]


def status_text(job: Mapping[str, Any]) -> str:
    """``kubectl verl status JOB``: phase, plan, placement, progress, advice, conditions and violations."""
    status: Mapping[str, Any] = job["status"] if isinstance(job.get("status"), Mapping) else {}
    meta = job.get("metadata") or {}
    phase = status.get("phase") or NONE
    reason = f" ({status['reason']})" if status.get("reason") else ""
    lines = [
        f"Name:        {meta.get('name')}",
        f"Namespace:   {meta.get('namespace')}",
        f"Entrypoint:  {dig(job, 'spec', 'verl', 'entrypoint') or 'verl.trainer.main_ppo'}",
        f"Phase:       {phase}{reason}",
    ]
    if status.get("message"):
        lines.append(f"  {status['message']}")
    lines += [f"Attempt:     {status.get('attempt', 0)} (restarts {status.get('restarts', 0)})"]
    lines += _plan_lines(status.get("plan"), status)
    lines += _placement_lines(status.get("placement"), status)
    lines += _progress_lines(status.get("progress"))
    lines += _advice_lines(status)
    violations = [v for v in status.get("violations") or [] if isinstance(v, Mapping)]
    if violations:
        lines.append("Violations:")
        for v in violations:
            lines.append(f"  x {v.get('field')} [{v.get('rule')}]: {v.get('message')}")
            lines += [f"      -> {s}" for s in v.get("suggestions") or []]
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    if conditions:
        lines.append("Conditions:")
        rows = [
            [str(c.get(k) or NONE) for k in ("type", "status", "reason", "lastTransitionTime", "message")]
            for c in conditions
        ]
        lines += [
            "  " + row for row in table(("TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"), rows).splitlines()
        ]
    return "\n".join(lines) + "\n"


def verl_lines(lines: Iterable[str], everything: bool = False) -> Iterable[str]:
    """The head pod's lines that are verl's output: the Ray head's own (``[ray-head] ``) left out unless
    ``everything``."""
    for line in lines:
        if everything or not line.startswith(RAY_HEAD_PREFIX):
            yield line


def lines_of(chunks: Iterable[bytes | str]) -> Iterable[str]:
    """Whole lines (without the newline) of a log stream that arrives in chunks cut anywhere."""
    pending = ""
    for chunk in chunks:
        pending += chunk.decode("utf-8", "replace") if isinstance(chunk, bytes) else chunk
        *done, pending = pending.split("\n")
        yield from done
    if pending:
        yield pending
