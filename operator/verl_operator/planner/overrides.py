"""Parse raw verl Hydra overrides (``key=value``, ``+key=value``, ``++key=value``, ``~key``) and read the
planner's keys as Hydra applies them.

Values follow Hydra's override grammar: quoted strings (``'a b'``, ``"a"``, ``\\'`` escapes the quote), lists
(``[a,b]``), dicts (``{n:64,engine_kwargs:{vllm:{}}}``, nested), ``true``/``True``/``false``/``False``,
``null``, integers, floats, and unquoted strings (``$HOME/data/train.parquet`` stays a string).
Interpolations (``${...}``) are kept verbatim.

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

Scalar = str | int | float | bool | None
Value = Scalar | list["Value"] | dict[str, "Value"]

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z_0-9][A-Za-z0-9_\-]*)*$")
_DICT_KEY_RE = re.compile(r"[A-Za-z0-9_\-]+")
_INT_RE = re.compile(r"^[+-]?\d+$")
_FLOAT_RE = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")

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


def _scalar(t: str) -> Value:
    """An unquoted primitive: bool, null, int, float or the text itself."""
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


class _Reader:
    """A recursive-descent reader of one value in Hydra's element grammar.

    ``element := quoted | '[' (element (',' element)*)? ']' | '{' (name ':' element (',' ...)*)? '}' |
    primitive``; a primitive runs to the next ``,``, ``]`` or ``}`` outside ``${...}``.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def _ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _fail(self, what: str) -> OverrideError:
        return OverrideError(f"{what} at character {self.pos + 1} of {shorten(self.text)!r}")

    def element(self, depth: int, top: bool = False) -> Value:
        self._ws()
        ch = self._peek()
        if ch == "[":
            return self._list(depth)
        if ch == "{":
            return self._dict(depth)
        if ch and ch in "'\"":
            return self._quoted()
        return self._primitive(top)

    def _list(self, depth: int) -> list[Value]:
        if depth >= MAX_DEPTH:
            raise OverrideError(f"lists nested deeper than {MAX_DEPTH} levels")
        self.pos += 1
        out: list[Value] = []
        self._ws()
        if self._peek() == "]":
            self.pos += 1
            return out
        while True:
            self._ws()
            out.append("" if self._peek() in (",", "]") else self.element(depth + 1))
            self._ws()
            ch = self._peek()
            self.pos += 1
            if ch == "]":
                return out
            if ch != ",":
                self.pos -= 1
                raise self._fail("unbalanced brackets: ',' or ']' expected" if ch else "unbalanced brackets")

    def _dict(self, depth: int) -> dict[str, Value]:
        if depth >= MAX_DEPTH:
            raise OverrideError(f"dicts nested deeper than {MAX_DEPTH} levels")
        self.pos += 1
        out: dict[str, Value] = {}
        self._ws()
        if self._peek() == "}":
            self.pos += 1
            return out
        while True:
            self._ws()
            match = _DICT_KEY_RE.match(self.text, self.pos)
            if match is None:
                raise self._fail("unbalanced braces" if not self._peek() else "a dict key (a name) expected")
            name = match.group()
            self.pos = match.end()
            self._ws()
            if self._peek() != ":":
                raise self._fail(f"':' expected after the dict key {name!r}")
            self.pos += 1
            self._ws()
            value = "" if self._peek() in (",", "}") else self.element(depth + 1)
            if name in out:
                raise self._fail(f"the dict key {name!r} appears twice")
            out[name] = value
            self._ws()
            ch = self._peek()
            self.pos += 1
            if ch == "}":
                return out
            if ch != ",":
                self.pos -= 1
                raise self._fail("unbalanced braces: ',' or '}' expected" if ch else "unbalanced braces")

    def _quoted(self) -> str:
        quote = self.text[self.pos]
        self.pos += 1
        out: list[str] = []
        while self.pos < len(self.text):
            ch = self.text[self.pos]
            if ch == "\\" and self.text[self.pos + 1 : self.pos + 2] == quote:
                out.append(quote)
                self.pos += 2
                continue
            self.pos += 1
            if ch == quote:
                return "".join(out)
            out.append(ch)
        raise OverrideError(f"unbalanced quotes in {shorten(self.text)!r}")

    def _primitive(self, top: bool) -> Value:
        start = self.pos
        n = len(self.text)
        while self.pos < n:
            ch = self.text[self.pos]
            if ch == "$" and self.text[self.pos + 1 : self.pos + 2] == "{":
                self._interpolation()
                continue
            if ch in "[]{}":
                if top or ch in "[{":
                    raise self._fail(f"unbalanced {'brackets' if ch in '[]' else 'braces'}: quote a {ch!r}")
                break
            if ch == "," and not top:
                break
            self.pos += 1
        t = self.text[start : self.pos].strip()
        if t and (t[0] in "'\"" or t[-1] in "'\""):
            raise OverrideError(f"unbalanced quotes in {shorten(self.text)!r}")
        return _scalar(t)

    def _interpolation(self) -> None:
        """Skip ``${...}`` (nested interpolations included)."""
        depth = 0
        while self.pos < len(self.text):
            ch = self.text[self.pos]
            self.pos += 1
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return
        raise OverrideError(f"unclosed interpolation '${{' in {shorten(self.text)!r}")


def parse_value(text: str, depth: int = 0) -> Value:
    """Parse the right-hand side of an override.

    Args:
        text: The value as written, e.g. ``4``, ``0.6``, ``True``, ``'a b'``, ``[x,y]``, ``{n:64}``, ``null``.
        depth: How deep inside lists and dicts ``text`` is (deeper than ``MAX_DEPTH`` is refused).

    Returns:
        The Python value: int, float, bool, None, str, or a list or dict of those.

    Raises:
        OverrideError: unbalanced quotes, brackets or braces, a dict entry that is not ``name:value``,
            nesting too deep, an integer too long.
    """
    reader = _Reader(text.strip())
    value = reader.element(depth, top=True)
    reader._ws()
    if reader.pos != len(reader.text):
        raise reader._fail(f"unexpected {reader._peek()!r} after the value")
    return value


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
