"""Parse raw verl Hydra overrides (``key=value``, ``+key=value``, ``++key=value``, ``~key``) and read the
planner's keys as Hydra applies them.

Overrides are parsed by Hydra's own grammar (:mod:`~verl_operator.planner.hydra_grammar`): quoted strings,
lists, dicts, ``true``/``null`` in any case, integers (``1_000``), floats, the casts ``int(4)``, ``float(..)``,
``str(..)`` and ``bool(..)``, unquoted strings (``$HOME/data/train.parquet`` stays a string); interpolations
(``${...}``) are kept verbatim. What Hydra refuses is refused (a space before ``=``, a character its lexer has
no token for), and so is what a single run cannot take (a sweep: ``a,b``, ``range(...)``, ``glob(...)``).

Hydra merges a dict value into the node it names (``trainer={nnodes:5}`` sets ``trainer.nnodes``, leaving the
rest of ``trainer`` alone), with or without ``+``/``++``; any other value replaces the node, and ``~key``
deletes it with everything below. :func:`read_owned` reads every override that way, so a key the planner owns
is pinned (or its deletion refused) whether the override names the key or one of its parents.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from verl_operator.api.plan import Violation
from verl_operator.planner import hydra_grammar

Scalar = str | int | float | bool | None
Value = Scalar | list["Value"] | dict[str, "Value"]

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z_0-9][A-Za-z0-9_\-]*)*$")
_DICT_KEY_RE = re.compile(r"[A-Za-z0-9_\-]+(?:[ \t]+[A-Za-z0-9_\-]+)*")

#: Lists and dicts nested deeper than this are refused (verl's configs nest a few levels).
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
        raw: The override as written (for a dict value the planner took keys out of: as rewritten).
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

    @property
    def merges(self) -> bool:
        """Hydra merges the value into the node (a dict value) rather than replacing it."""
        return isinstance(self.value, dict) and self.prefix != "~"

    def leaves(self) -> list[tuple[str, Value]]:
        """The keys this override sets, as Hydra merges it: one ``(key, value)`` per leaf of a dict value (an
        empty dict is a leaf of its own), else ``(key, value)``."""
        return flatten(self.key, self.value)


def flatten(key: str, value: Value) -> list[tuple[str, Value]]:
    """``(dotted key, value)`` for every leaf of ``value`` set at ``key`` (dicts are merged, not replaced)."""
    if not isinstance(value, dict) or not value:
        return [(key, value)]
    out: list[tuple[str, Value]] = []
    for name, item in value.items():
        out += flatten(f"{key}.{name}", item)
    return out


def shorten(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters for a message (a long value is not echoed whole)."""
    return text if len(text) <= limit else f"{text[: limit - 20]}...({len(text)} characters)"


def parse_value(text: str, depth: int = 0) -> Value:
    """Parse the right-hand side of an override by Hydra's grammar (:mod:`~verl_operator.planner.hydra_grammar`).

    Args:
        text: The value as written, e.g. ``4``, ``0.6``, ``True``, ``'a b'``, ``[x,y]``, ``{n:64}``, ``null``,
            ``int(4)``.
        depth: How deep inside lists and dicts ``text`` is (deeper than ``MAX_DEPTH`` is refused).

    Returns:
        The Python value: int, float, bool, None, str, or a list or dict of those.

    Raises:
        OverrideError: what Hydra refuses (unbalanced quotes, brackets or braces, a character its lexer has
            no token for, a sweep, an unknown function), nesting too deep, an integer too long.
    """
    try:
        value = hydra_grammar.parse_value(text, max_depth=MAX_DEPTH - depth)
    except hydra_grammar.GrammarError as exc:
        raise OverrideError(f"{exc} in {shorten(text)!r}") from exc
    _check(value)
    return value


def _check(value: Value) -> None:
    """What the planner reads beyond Hydra's grammar: integers of at most :data:`MAX_DIGITS` digits (Python
    refuses to print past 4300), dict keys that are names or names parted by spaces and tabs (Hydra takes
    ``{a b:1}`` as the key ``a b``, inner whitespace kept, and ``{a.b:1}`` as one key ``a.b``, which the planner
    refuses)."""
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        digits = len(str(abs(value)))
        if digits > MAX_DIGITS:
            raise OverrideError(f"an integer of {digits} digits is too long (at most {MAX_DIGITS})")
    elif isinstance(value, list):
        for item in value:
            _check(item)
    elif isinstance(value, dict):
        for name, item in value.items():
            if not _DICT_KEY_RE.fullmatch(name):
                raise OverrideError(
                    f"the dict key {name!r} is not a name (letters, digits, '_', '-', inner spaces; nested keys as {{a:{{b:1}}}})"
                )
            _check(item)


def format_value(value: Value) -> str:
    """Render a value the way Hydra parses it back (``True``, ``null``, ``[a,b]``, ``{a:1}``, quoted when
    needed)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{format_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if text == "" or (any(c in text for c in " ,[]{}'\"=:") and not text.startswith("${")):
        return "'" + text.replace("'", "\\'") + "'"
    return text


def parse_override(raw: str, index: int = 0) -> Override:
    """Parse one override string by Hydra's grammar (key mode, then the value).

    Args:
        raw: ``key=value``, ``+key=value``, ``++key=value`` or ``~key``.
        index: Its position in the list (for error messages).

    Raises:
        OverrideError: not valid override syntax (a space before ``=`` included), a sweep, an unknown function.
    """
    try:
        prefix, key, value_text, _ = hydra_grammar.split_key(raw)
    except hydra_grammar.GrammarError as exc:
        raise OverrideError(f"{exc} in {shorten(raw)!r}") from exc
    if not _KEY_RE.match(key):
        raise OverrideError(f"{key!r} is not a dotted config key")
    if value_text is None:
        value: Value = None
    else:
        value = parse_value(value_text) if value_text else ("" if prefix != "~" else None)
    text = (value_text or "").strip()
    return Override(index=index, raw=raw, prefix=prefix, key=key, text=text, value=value)


def parse_overrides(raws: Sequence[str]) -> tuple[list[Override], list[Violation], list[str]]:
    """Parse ``spec.overrides``; a bad entry is a violation, a repeated key a warning.

    Hydra applies overrides in order, so the last value of a repeated key wins (verl scripts often repeat a
    key: a base block, then a per-run block). An override set again by a later one of the same key is left
    out, unless the later one merges a dict into it (Hydra then keeps what the dict does not name).

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
                    suggestions=[
                        "write key=value, +key=value, ++key=value or ~key (a dict as {name:value,...})"
                    ],
                )
            )
    last: dict[str, int] = {}
    for ov in parsed:
        if not ov.merges:
            last[ov.key] = ov.index
    kept = [ov for ov in parsed if last.get(ov.key, ov.index) <= ov.index]
    warnings = [
        f"{ov.source} is set again by spec.overrides[{last[ov.key]}]; the last value wins "
        f"({ov.text!r} is ignored)"
        for ov in parsed
        if last.get(ov.key, ov.index) > ov.index
    ]
    return kept, violations, warnings


@dataclass(frozen=True)
class Pinned:
    """A value the user fixed, with where it came from."""

    value: Value
    source: str


def _holders(keys: Mapping[str, str]) -> dict[str, list[str]]:
    """Every proper parent of ``keys`` -> the keys below it (``trainer`` -> ``[trainer.n_gpus_per_node, ...]``)."""
    out: dict[str, list[str]] = {}
    for key in sorted(keys):
        parts = key.split(".")
        for i in range(1, len(parts)):
            out.setdefault(".".join(parts[:i]), []).append(key)
    return out


def _owner_above(key: str, keys: Mapping[str, str]) -> str | None:
    """The key of ``keys`` that ``key`` lies strictly inside (``trainer.nnodes.x`` -> ``trainer.nnodes``)."""
    parts = key.split(".")
    return next((p for i in range(1, len(parts)) if (p := ".".join(parts[:i])) in keys), None)


def _leaf_source(ov: Override, key: str) -> str:
    return ov.source if key == ov.key else f"spec.overrides[{ov.index}] ({key}, in {ov.key}={{...}})"


def _listed(keys: Sequence[str], most: int = 4) -> str:
    more = f" and {len(keys) - most} more" if len(keys) > most else ""
    return ", ".join(keys[:most]) + more


def _unflatten(base: str, leaves: Sequence[tuple[str, Value]]) -> dict[str, Value]:
    """The dict value at ``base`` that sets exactly ``leaves`` (the inverse of :func:`flatten`)."""
    out: dict[str, Value] = {}
    for key, value in leaves:
        node = out
        *parents, name = key[len(base) + 1 :].split(".")
        for part in parents:
            child = node.setdefault(part, {})
            assert isinstance(child, dict)
            node = child
        node[name] = value
    return out


def read_owned(
    overrides: Sequence[Override], input_keys: Mapping[str, str], owned: bool = True
) -> tuple[dict[str, Pinned], list[Override], list[Violation]]:
    """Split overrides into the planner's inputs (by logical name) and pass-through overrides.

    Every override is read as Hydra applies it: a dict value sets each of its leaves (``trainer={nnodes:5}``
    pins ``trainer.nnodes`` exactly as ``trainer.nnodes=5`` does), and a later write of a key wins. With
    ``owned`` (the keys the planner emits), the planner's leaves are taken out of the pass-through overrides
    (a dict keeps its other entries), and an override that would undo them is a violation: deleting a key
    or a parent that holds keys (``~trainer``), replacing a parent with a value that is not a dict
    (``actor_rollout_ref.rollout=null``), setting something inside a key (``trainer.nnodes.x=1``).

    Several keys can map to one logical input (verl's old and new spellings, or settings verl requires to be
    equal, such as the actor's and the rollout's ``use_dynamic_bsz``); different values for one input are a
    violation that names both overrides.

    Args:
        overrides: Parsed overrides.
        input_keys: Config key -> logical input name (``dialect.INPUT_KEYS``, or ``READ_KEYS`` with
            ``owned=False``: read, passed through unchanged, never refused).
        owned: The planner sets ``input_keys`` on the command line itself.

    Returns:
        ``(pinned, passthrough, violations)``.
    """
    holders = _holders(input_keys)
    writes: dict[str, tuple[Value, str]] = {}
    passthrough: list[Override] = []
    violations: list[Violation] = []
    for ov in overrides:
        if not owned:
            if ov.prefix == "~":  # a read key deleted after it was set is not set
                writes = {k: w for k, w in writes.items() if k != ov.key and not k.startswith(ov.key + ".")}
            else:
                writes.update({k: (v, _leaf_source(ov, k)) for k, v in ov.leaves() if k in input_keys})
            passthrough.append(ov)
            continue
        refused = _undoes(ov, input_keys, holders)
        if refused is not None:
            violations.append(refused)
            continue
        if ov.prefix == "~":
            passthrough.append(ov)
            continue
        leaves = ov.leaves()
        mine = [(k, v) for k, v in leaves if k in input_keys]
        writes.update({k: (v, _leaf_source(ov, k)) for k, v in mine})
        if not mine:
            passthrough.append(ov)
        elif len(mine) < len(leaves):
            rest = _unflatten(ov.key, [(k, v) for k, v in leaves if k not in input_keys])
            text = format_value(rest)
            passthrough.append(replace(ov, raw=f"{ov.prefix}{ov.key}={text}", text=text, value=rest))
    return _pins(writes, input_keys, violations), passthrough, violations


def _undoes(ov: Override, keys: Mapping[str, str], holders: Mapping[str, list[str]]) -> Violation | None:
    """The violation when ``ov`` deletes, replaces or reaches inside a key of ``keys``; else None."""
    if ov.prefix == "~":
        hit = [ov.key] if ov.key in keys else holders.get(ov.key, [])
        if hit:
            return Violation(
                field=ov.source,
                rule="override-delete-owned",
                message=f"{shorten(ov.raw)!r} deletes {_listed(hit)}, set by the planner; it cannot be deleted",
                suggestions=[f"remove {shorten(ov.raw)!r}"],
            )
    for key, value in ov.leaves():
        above = _owner_above(key, keys)
        if above is not None:
            return Violation(
                field=_leaf_source(ov, key),
                rule="override-inside-owned",
                message=f"{shorten(ov.raw)!r} sets {key} inside {above}, which the planner sets to a value",
                suggestions=[f"set {above}=<value>, or remove the override"],
            )
        hit = holders.get(key, [])
        if hit and ov.prefix != "~" and value != {}:
            return Violation(
                field=_leaf_source(ov, key),
                rule="override-replace-owned",
                message=(
                    f"{shorten(ov.raw)!r} replaces {key}, which holds {_listed(hit)} set by the planner "
                    "(only a dict value is merged into it)"
                ),
                suggestions=[f"set the keys one by one ({hit[0]}=...), or write {key}={{name:value,...}}"],
            )
    return None


def _pins(
    writes: Mapping[str, tuple[Value, str]], input_keys: Mapping[str, str], violations: list[Violation]
) -> dict[str, Pinned]:
    """The last write of every key, by logical name; keys of one name that disagree are a violation."""
    pinned: dict[str, Pinned] = {}
    for key, (value, source) in writes.items():
        name = input_keys[key]
        prev = pinned.get(name)
        if prev is None:
            pinned[name] = Pinned(value, source)
        elif prev.value != value:
            violations.append(
                Violation(
                    field=source,
                    rule="override-conflict",
                    message=f"{prev.source} = {prev.value!r} and {source} = {value!r} must be equal",
                    suggestions=[f"set both to {prev.value!r}, or drop one of them"],
                )
            )
    return pinned
