"""Parse raw verl Hydra overrides (``key=value``, ``+key=value``, ``++key=value``) and read the planner's keys.

Values follow Hydra's override grammar closely enough for verl command lines: quoted strings (``'a b'``,
``"a"``), lists (``[a,b]``), ``true``/``True``/``false``/``False``, ``null``, integers, floats, and
unquoted strings (``$HOME/data/train.parquet`` stays a string). Interpolations (``${...}``) are kept verbatim.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from verl_operator.planner.result import Violation

Scalar = str | int | float | bool | None
Value = Scalar | list["Value"]

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z_0-9][A-Za-z0-9_\-]*)*$")
_INT_RE = re.compile(r"^[+-]?\d+$")
_FLOAT_RE = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")

#: Lists nested deeper than this are refused (verl's configs nest two levels at most).
MAX_DEPTH = 16
#: Integers with more digits are refused (a 64-bit integer has 19; Python refuses to parse past 4300).
MAX_DIGITS = 40


class OverrideError(ValueError):
    """An override that is not ``key=value`` Hydra syntax."""


@dataclass(frozen=True)
class Override:
    """One parsed override.

    Attributes:
        index: Position in ``spec.overrides``.
        raw: The override as written.
        prefix: ``""``, ``"+"`` (add), ``"++"`` (add or replace) or ``"~"`` (delete).
        key: The dotted config key.
        text: The value as written (after ``=``); empty for deletions.
        value: The parsed value.
    """

    index: int
    raw: str
    prefix: str
    key: str
    text: str
    value: Value

    @property
    def source(self) -> str:
        """How a violation names this override."""
        return f"spec.overrides[{self.index}] ({self.key})"


def _split_top(text: str) -> list[str]:
    """Split a list body at commas that are outside quotes and brackets."""
    parts: list[str] = []
    depth = 0
    quote = ""
    current: list[str] = []
    for ch in text:
        if quote:
            current.append(ch)
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    if quote or depth != 0:
        raise OverrideError(f"unbalanced quotes or brackets in {text!r}")
    tail = "".join(current).strip()
    if tail or parts:
        parts.append(tail)
    return parts


def shorten(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters for a message (a long value is not echoed whole)."""
    return text if len(text) <= limit else f"{text[: limit - 20]}...({len(text)} characters)"


def parse_value(text: str, depth: int = 0) -> Value:
    """Parse the right-hand side of an override.

    Args:
        text: The value as written, e.g. ``4``, ``0.6``, ``True``, ``'a b'``, ``[x,y]``, ``null``.
        depth: How deep inside lists ``text`` is (lists deeper than ``MAX_DEPTH`` are refused).

    Returns:
        The Python value: int, float, bool, None, str or a list of those.

    Raises:
        OverrideError: unbalanced quotes or brackets, lists nested too deep, an integer too long.
    """
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return t[1:-1]
    if t.startswith("[") or t.endswith("]"):
        if not (t.startswith("[") and t.endswith("]")):
            raise OverrideError(f"unbalanced brackets in {text!r}")
        if depth >= MAX_DEPTH:
            raise OverrideError(f"lists nested deeper than {MAX_DEPTH} levels")
        return [parse_value(p, depth + 1) for p in _split_top(t[1:-1])]
    if t[:1] in "'\"" or t[-1:] in "'\"":
        raise OverrideError(f"unbalanced quotes in {text!r}")
    low = t.lower()
    if low == "true":
        return True
    if low == "false":
        return False
    if low in ("null", "none", "~"):
        return None
    if _INT_RE.match(t):
        digits = len(t.lstrip("+-"))
        if digits > MAX_DIGITS:
            raise OverrideError(f"an integer of {digits} digits is too long (at most {MAX_DIGITS})")
        return int(t)
    if _FLOAT_RE.match(t):
        return float(t)
    return t


def parse_override(raw: str, index: int = 0) -> Override:
    """Parse one override string.

    Args:
        raw: ``key=value``, ``+key=value``, ``++key=value`` or ``~key``.
        index: Its position in the list (for error messages).

    Raises:
        OverrideError: not valid override syntax.
    """
    text = raw.strip()
    prefix = ""
    for p in ("++", "+", "~"):
        if text.startswith(p):
            prefix, text = p, text[len(p) :]
            break
    if prefix == "~" and "=" not in text:
        key, value_text = text.strip(), ""
    else:
        if "=" not in text:
            raise OverrideError(f"{raw!r} is not key=value")
        key, value_text = text.split("=", 1)
        key = key.strip()
    if not _KEY_RE.match(key):
        raise OverrideError(f"{key!r} is not a dotted config key")
    value = parse_value(value_text) if value_text.strip() else ("" if prefix != "~" else None)
    return Override(index=index, raw=raw, prefix=prefix, key=key, text=value_text.strip(), value=value)


def parse_overrides(raws: Sequence[str]) -> tuple[list[Override], list[Violation], list[str]]:
    """Parse ``spec.overrides``; a bad entry is a violation, a repeated key a warning.

    Hydra applies overrides in order, so the last value of a repeated key wins (verl scripts often repeat a
    key: a base block, then a per-run block). Only that last override is kept.

    Returns:
        The parsed overrides (bad ones and overridden repeats left out), the violations and the warnings.
    """
    parsed: list[Override] = []
    violations: list[Violation] = []
    for i, raw in enumerate(raws):
        try:
            parsed.append(parse_override(raw, i))
        except OverrideError as exc:
            violations.append(
                Violation(
                    field=f"spec.overrides[{i}]",
                    rule="override-syntax",
                    message=f"{shorten(raw)!r}: {exc}",
                    suggestions=["write key=value, +key=value or ++key=value"],
                )
            )
    last = {ov.key: ov.index for ov in parsed}
    warnings = [
        f"{ov.source} is set again by spec.overrides[{last[ov.key]}]; the last value wins "
        f"({ov.text!r} is ignored)"
        for ov in parsed
        if last[ov.key] != ov.index
    ]
    return [ov for ov in parsed if last[ov.key] == ov.index], violations, warnings


@dataclass(frozen=True)
class Pinned:
    """A value the user fixed, with where it came from."""

    value: Value
    source: str


def read_owned(
    overrides: Sequence[Override], input_keys: Mapping[str, str]
) -> tuple[dict[str, Pinned], list[Override], list[Violation]]:
    """Split overrides into the planner's inputs (by logical name) and pass-through overrides.

    Several keys can map to one logical input (verl's old and new spellings, or settings verl requires to be
    equal, such as the actor's and the rollout's ``use_dynamic_bsz``); different values for one input are a
    violation that names both overrides.

    Args:
        overrides: Parsed overrides.
        input_keys: Config key -> logical input name (see ``dialect.INPUT_KEYS``).

    Returns:
        ``(pinned, passthrough, violations)``.
    """
    pinned: dict[str, Pinned] = {}
    passthrough: list[Override] = []
    violations: list[Violation] = []
    for ov in overrides:
        name = input_keys.get(ov.key)
        if name is None:
            passthrough.append(ov)
            continue
        if ov.prefix == "~":
            violations.append(
                Violation(
                    field=ov.source,
                    rule="override-delete-owned",
                    message=f"{ov.key} is set by the planner and cannot be deleted",
                    suggestions=[f"remove {ov.raw!r}"],
                )
            )
            continue
        prev = pinned.get(name)
        if prev is not None and prev.value != ov.value:
            violations.append(
                Violation(
                    field=ov.source,
                    rule="override-conflict",
                    message=f"{prev.source} = {prev.value!r} and {ov.source} = {ov.value!r} must be equal",
                    suggestions=[f"set both to {prev.value!r}, or drop one of them"],
                )
            )
            continue
        if prev is None:
            pinned[name] = Pinned(ov.value, ov.source)
    return pinned, passthrough, violations
