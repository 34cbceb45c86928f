"""A user override never undoes ``spec.checkpoint`` (pure).

The launcher adds ``trainer.default_local_dir=<spec.checkpoint.dir>`` and ``trainer.resume_mode`` (``auto``
when resuming: a restart, or ``spec.checkpoint.resume``; ``disable`` otherwise) unless an override sets the
key, and keeps the user's value (``launcher/verl_launcher/verl.py`` ``build_argv``). With
``spec.checkpoint.dir`` set, an override that saves elsewhere, or a resume mode that contradicts the spec,
would undo it: a restart resumes from the directory the spec names, or starts over when ``disable`` is
pasted, and ``auto`` resumes old checkpoints on a first attempt that ``resume: false`` starts fresh. Rule
``override-conflict``, as for the dtype and the pinned settings: both sides are named, the fix is one or the
other.
"""

from __future__ import annotations

from collections.abc import Sequence

from verl_operator.api.plan import Violation
from verl_operator.api.spec import VerlJobSpec
from verl_operator.planner.overrides import Override, format_value

DIR_KEY = "trainer.default_local_dir"
RESUME_KEY = "trainer.resume_mode"


def checkpoint_conflicts(spec: VerlJobSpec, overrides: Sequence[Override]) -> list[Violation]:
    """One violation per override of :data:`DIR_KEY` or :data:`RESUME_KEY` that undoes ``spec.checkpoint``
    (only when ``spec.checkpoint.dir`` is set: without it the job keeps no checkpoints of the operator's).

    Example: ``checkpoint.dir: /ckpt`` with ``trainer.default_local_dir=/scratch`` -> ``spec.checkpoint.dir =
    '/ckpt' but spec.overrides[0] (trainer.default_local_dir) = '/scratch': verl would save there ...``.
    """
    ckpt = spec.checkpoint
    if not ckpt.dir:
        return []
    out: list[Violation] = []
    for ov in overrides:
        if ov.prefix == "~":
            if ov.key in (DIR_KEY, RESUME_KEY):
                out.append(
                    _conflict(
                        "spec.checkpoint.dir",
                        f"{ov.source} deletes {ov.key}, which the launcher sets from spec.checkpoint (it leaves a "
                        "key the user names to the user)",
                        [f"drop {ov.source}"],
                    )
                )
            continue
        for key, value in ov.leaves():
            source = (
                ov.source if key == ov.key else f"spec.overrides[{ov.index}] ({key}, in {ov.key}={{...}})"
            )
            text = format_value(value) if value is not None else "null"
            if key == DIR_KEY and str(text).rstrip("/") != ckpt.dir.rstrip("/"):
                out.append(
                    _conflict(
                        "spec.checkpoint.dir",
                        f"spec.checkpoint.dir = {ckpt.dir!r} but {source} = {text!r}: verl would save its "
                        "checkpoints there while the spec names another directory",
                        [f"drop {source}", f"or set spec.checkpoint.dir to {text!r}"],
                    )
                )
            if key == RESUME_KEY and text == "disable":
                out.append(
                    _conflict(
                        "spec.checkpoint.resume",
                        f"{source} = 'disable' with spec.checkpoint.dir {ckpt.dir!r}: every restart of the job "
                        "would start over instead of resuming from its checkpoints",
                        [f"drop {source} (set spec.checkpoint.resume: false for a fresh first attempt)"],
                    )
                )
            if key == RESUME_KEY and text == "auto" and not ckpt.resume:
                out.append(
                    _conflict(
                        "spec.checkpoint.resume",
                        f"spec.checkpoint.resume = false but {source} = 'auto': the first attempt would resume "
                        f"from old checkpoints in {ckpt.dir!r}",
                        [f"drop {source}", "or set spec.checkpoint.resume: true"],
                    )
                )
    return out


def _conflict(field: str, message: str, suggestions: list[str]) -> Violation:
    return Violation(
        field=field,
        rule="override-conflict",
        message=f"{message} (the override would undo the spec)",
        suggestions=[", ".join(suggestions)],
    )
