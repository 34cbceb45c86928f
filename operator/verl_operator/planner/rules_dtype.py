"""A user override never undoes ``spec.model.dtype`` (pure).

The planner writes the dtype keys of :func:`~verl_operator.planner.dialect.dtype_keys` for ``float16`` and
leaves verl's ``bfloat16`` defaults for ``bfloat16``; the user's overrides come after the planner's on verl's
command line, so an override of one of those keys with another dtype would run, say, a bfloat16 rollout
under a float16 spec (on the GPUs float16 is chosen for, which cannot run bfloat16). Rule
``override-conflict``, as for the pinned settings (``planner/inputs.py`` ``merge_pins``): the spec field and
the override are named, and the fix is one or the other.
"""

from __future__ import annotations

from collections.abc import Sequence

from verl_operator.api.plan import Violation
from verl_operator.api.settings_registry import ARR
from verl_operator.api.spec import VerlJobSpec
from verl_operator.planner.overrides import Override, format_value

#: The keys that carry the compute dtype of the rollout, the actor, the reference and the critic.
DTYPE_KEYS = (
    f"{ARR}.rollout.dtype",
    f"{ARR}.actor.fsdp_config.dtype",
    f"{ARR}.ref.fsdp_config.dtype",
    "critic.fsdp.dtype",
    "critic.model.fsdp_config.dtype",
)
#: Other spellings of the two dtypes (vLLM's ``half``, the short forms).
_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16"}


def dtype_conflicts(spec: VerlJobSpec, overrides: Sequence[Override]) -> list[Violation]:
    """One violation per override that sets a dtype key to another dtype than ``spec.model.dtype`` (or, for
    ``float16``, deletes one the planner sets).

    Example: ``spec.model.dtype: float16`` with ``actor_rollout_ref.rollout.dtype=bfloat16`` ->
    ``spec.model.dtype = 'float16' but spec.overrides[0] (actor_rollout_ref.rollout.dtype) = 'bfloat16'``.
    """
    want = spec.model.dtype
    out: list[Violation] = []
    for ov in overrides:
        if ov.prefix == "~":
            gone = [k for k in DTYPE_KEYS if k == ov.key or k.startswith(f"{ov.key}.")]
            if want == "float16" and gone:
                out.append(_conflict(want, ov.source, f"deletes {gone[0]}", "float16"))
            continue
        for key, value in ov.leaves():
            if key not in DTYPE_KEYS:
                continue
            text = str(value).lower() if value is not None else "null"
            if _ALIASES.get(text, text) != want:
                source = (
                    ov.source if key == ov.key else f"spec.overrides[{ov.index}] ({key}, in {ov.key}={{...}})"
                )
                out.append(_conflict(want, source, f"= {format_value(value)!r}", text))
    return out


def _conflict(want: str, source: str, what: str, value: str) -> Violation:
    fix = f"or set spec.model.dtype to {value!r}" if value in ("bfloat16", "float16") else ""
    return Violation(
        field="spec.model.dtype",
        rule="override-conflict",
        message=(
            f"spec.model.dtype = {want!r} but {source} {what}: the override would come after the planner's "
            f"dtype on verl's command line and undo the spec"
        ),
        suggestions=[f"drop {source}" + (f", {fix}" if fix else "")],
    )
