"""Field errors of the API models as :class:`~verl_operator.api.plan.Violation` values (one form for all).

Pydantic's errors carry a location tuple and a message; every caller (the webhook, the reconciler, ``plan``,
``render``, the devcluster profiles) turns them into the same ``field: message`` lines through
:func:`validation_violations` and :meth:`Violation.one_line`.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError

from verl_operator.api.plan import Violation

#: The rule name of a violation found by the API models themselves (types, bounds, unknown fields).
SCHEMA_RULE = "schema"


def field_path(loc: Sequence[int | str], root: str = "spec") -> str:
    """A pydantic error location as a field path under ``root``.

    ``("overrides", 3)`` -> ``spec.overrides[3]``; with ``root=""`` ``("spec", "env", 0, "name")`` ->
    ``spec.env[0].name``; an empty path is ``(root)``.
    """
    out = root
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(root)"


def validation_violations(exc: ValidationError, root: str = "spec") -> list[Violation]:
    """One :class:`Violation` per pydantic error, its field the path under ``root`` (:func:`field_path`).

    Args:
        exc: The error of ``Model.model_validate``.
        root: The path of the validated object (``spec`` for a ``VerlJobSpec``; "" for a whole object).

    Returns:
        The violations, in pydantic's order; a field of ``(root)`` when the error is about the object itself.

    Example:
        ``VerlJobSpec.model_validate({"resources": {"gpus": 0}, ...})`` gives
        ``spec.resources.gpus: Input should be greater than or equal to 1``.
    """
    out: list[Violation] = []
    for err in exc.errors():
        out.append(Violation(field=field_path(err["loc"], root), rule=SCHEMA_RULE, message=str(err["msg"])))
    return out


def validation_lines(exc: ValidationError, root: str = "spec") -> list[str]:
    """``field: message`` per error (see :func:`validation_violations`)."""
    return [v.one_line() for v in validation_violations(exc, root)]
