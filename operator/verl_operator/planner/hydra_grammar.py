"""Hydra's override grammar (hydra-core 1.3.2 ``hydra/grammar/OverrideLexer.g4`` and ``OverrideParser.g4``),
restated without ANTLR, and the values Hydra's visitor makes of it (``core/override_parser/
overrides_visitor.py``, ``_internal/grammar/grammar_functions.py``).

The lexer has two modes. Key mode (before ``=``) knows ``= ~ + @ : /``, identifiers and dotted paths and
no whitespace, so ``key =1`` is refused as Hydra refuses it; ``=`` takes the whitespace after it. Value
mode's tokens are matched longest first, the earlier rule winning a tie (ANTLR's rule), and the parser follows
``value: element | simpleChoiceSweep``, ``element: primitive | list | dict | function``. What verl's
single run does not take is refused: a sweep (``a,b``, ``choice``, ``range``, ``interval``, ``glob``,
``tag``) "requires --multirun"; ``shuffle`` has no fixed result; a function Hydra does not know is unknown.
The casts ``int``, ``float``, ``str`` and ``bool`` and ``sort`` of a list are evaluated as Hydra does
(``str(True)`` is ``true``; ``bool('yes')`` is refused). ``tests/fidelity/test_fidelity_hydra_grammar.py`` compares
this module with Hydra's own ``OverridesParser`` on a table of overrides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

Scalar = str | int | float | bool | None
Value = Scalar | list["Value"] | dict[str, "Value"]

_IU = r"(?:0|[1-9](?:_?[0-9])*)"
_PF = rf"(?:{_IU}?\.[0-9](?:_?[0-9])*|{_IU}\.)"
_EF = rf"(?:(?:{_PF}|{_IU})[eE][+-]?[0-9](?:_?[0-9])*)"
_WS = r"[ \t]+"
_ID = r"[A-Za-z_][A-Za-z0-9_\-]*"
_ESC = r"(?:\\\\|\\\(|\\\)|\\\[|\\\]|\\\{|\\\}|\\:|\\=|\\,|\\ |\\\t)+"

#: Value mode's tokens in the lexer's rule order (a tie in length goes to the earlier one).
_VALUE_TOKENS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern, re.DOTALL))
    for name, pattern in (
        ("POPEN", r"[ \t]*\([ \t]*"),
        ("COMMA", r"[ \t]*,[ \t]*"),
        ("PCLOSE", r"[ \t]*\)"),
        ("BRACKET_OPEN", r"\[[ \t]*"),
        ("BRACKET_CLOSE", r"[ \t]*\]"),
        ("BRACE_OPEN", r"\{[ \t]*"),
        ("BRACE_CLOSE", r"[ \t]*\}"),
        ("COLON", r"[ \t]*:[ \t]*"),
        ("EQUAL", r"[ \t]*=[ \t]*"),
        ("FLOAT", rf"[+-]?(?:{_EF}|{_PF}|[Ii][Nn][Ff]|[Nn][Aa][Nn])"),
        ("INT", rf"[+-]?{_IU}"),
        ("BOOL", r"[Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee]"),
        ("NULL", r"[Nn][Uu][Ll][Ll]"),
        ("UNQUOTED_CHAR", r"[/\-\\+.$%*@?|]"),
        ("ID", _ID),
        ("ESC", _ESC),
        ("WS", _WS),
        ("QUOTED_VALUE", r"\"(?:(?:\\\\)*|.*?[^\\](?:\\\\)*)\"|'(?:(?:\\\\)*|.*?[^\\](?:\\\\)*)'"),
        ("INTERPOLATION", r"\$\{[^}]+\}"),
    )
)
_KEY_TOKENS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("EQUAL", r"=[ \t]*"),
        ("TILDE", r"~"),
        ("PLUS", r"\+"),
        ("AT", r"@"),
        ("COLON", r":"),
        ("SLASH", r"/"),
        ("ID", r"[A-Za-z_][A-Za-z0-9_]*"),
        ("KEY_SPECIAL", r"[A-Za-z_$][A-Za-z0-9_\-$]*"),
        (
            "DOT_PATH",
            r"(?:[A-Za-z_$][A-Za-z0-9_\-$]*|0|[1-9](?:_?[0-9])*)(?:\.(?:[A-Za-z_$][A-Za-z0-9_\-$]*|0|[1-9](?:_?[0-9])*))+",
        ),
    )
)
_PRIMITIVE = frozenset(
    {"ID", "NULL", "INT", "FLOAT", "BOOL", "INTERPOLATION", "UNQUOTED_CHAR", "COLON", "ESC", "WS"}
)
_DICT_KEY = frozenset({"ID", "NULL", "INT", "FLOAT", "BOOL", "UNQUOTED_CHAR", "ESC", "WS"})

#: Hydra's functions (``OverridesParser.create_functions``) that make a sweep: one run takes none of them.
SWEEPS = frozenset({"choice", "range", "interval", "glob", "tag"})
#: Every function Hydra 1.3 registers.
FUNCTIONS = ("bool", "choice", "float", "glob", "int", "interval", "range", "shuffle", "sort", "str", "tag")


#: Integers with more digits are refused (a 64-bit integer has 19; Python refuses to read past 4300).
MAX_DIGITS = 40


class GrammarError(ValueError):
    """An override Hydra refuses (its lexer, its parser, or its functions)."""


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    pos: int


@dataclass(frozen=True)
class Quoted:
    """A quoted string (Hydra's ``QuotedString``): a string, never a number or a boolean."""

    text: str


#: A value as parsed, before the quoted strings become plain ones.
Parsed = Scalar | Quoted | list["Parsed"] | dict[str, "Parsed"]


def _lex(text: str, start: int, table: tuple[tuple[str, re.Pattern[str]], ...]) -> Token | None:
    best: Token | None = None
    for kind, pattern in table:
        m = pattern.match(text, start)
        if m is not None and m.end() > start and (best is None or m.end() - start > len(best.text)):
            best = Token(kind, m.group(), start)
    return best


def split_key(raw: str) -> tuple[str, str, str | None, int]:
    """``(prefix, key, value text or None, position of the value)`` of an override, by Hydra's key mode.

    Raises:
        GrammarError: a character key mode has no token for (a space before ``=``), or no ``=`` where one
            is needed.
    """
    pos, tokens = 0, []
    while pos < len(raw):
        tok = _lex(raw, pos, _KEY_TOKENS)
        if tok is None:
            what = "a space" if raw[pos] in " \t" else repr(raw[pos])
            hint = " (Hydra takes no space before '=')" if raw[pos] in " \t" and "=" in raw[pos:] else ""
            raise GrammarError(f"{what} at character {pos + 1} is not allowed in a key{hint}")
        tokens.append(tok)
        pos += len(tok.text)
        if tok.kind == "EQUAL":
            break
    kinds = [t.kind for t in tokens]
    prefix = ""
    if kinds[:2] == ["PLUS", "PLUS"]:
        prefix = "++"
    elif kinds[:1] in (["PLUS"], ["TILDE"]):
        prefix = "+" if kinds[0] == "PLUS" else "~"
    body = tokens[len(prefix) :]
    has_equal = bool(body) and body[-1].kind == "EQUAL"
    key_tokens = body[:-1] if has_equal else body
    if not has_equal and prefix != "~":
        raise GrammarError("no '=': an override is key=value, +key=value, ++key=value or ~key")
    if any(t.kind in ("PLUS", "TILDE", "EQUAL") for t in key_tokens):
        raise GrammarError(f"{''.join(t.text for t in key_tokens)!r} is not a key")
    key = "".join(t.text for t in key_tokens)
    return prefix, key, (raw[pos:] if has_equal else None), pos


_EXPECTED = {
    "PCLOSE": "unbalanced parentheses: ',' or ')'",
    "BRACKET_CLOSE": "unbalanced brackets: ',' or ']'",
    "BRACE_CLOSE": "unbalanced braces: ',' or '}'",
    "COLON": "':' after the dict key",
    "COMMA": "unbalanced braces: ',' or '}'",
}


class _Parser:
    """The value rules of ``OverrideParser.g4`` over value mode's tokens."""

    def __init__(self, text: str, offset: int = 0, max_depth: int = 16) -> None:
        self.text, self.offset, self.max_depth = text, offset, max_depth
        self.tokens: list[Token] = []
        pos = 0
        while pos < len(text):
            tok = _lex(text, pos, _VALUE_TOKENS)
            if tok is None:
                if text[pos] in "'\"":
                    raise GrammarError(f"unbalanced quotes at character {offset + pos + 1}")
                raise GrammarError(
                    f"{text[pos]!r} at character {offset + pos + 1} is not allowed unquoted (quote the value)"
                )
            self.tokens.append(tok)
            pos += len(tok.text)
        self.i = 0

    def _peek(self, ahead: int = 0) -> Token | None:
        j = self.i + ahead
        return self.tokens[j] if j < len(self.tokens) else None

    def _kind(self, ahead: int = 0) -> str:
        tok = self._peek(ahead)
        return tok.kind if tok is not None else "EOF"

    def _fail(self, expected: str) -> GrammarError:
        tok = self._peek()
        where = (
            "the end"
            if tok is None
            else f"{tok.text.strip() or tok.text!r} at character {self.offset + tok.pos + 1}"
        )
        return GrammarError(f"{expected} expected, found {where}")

    def _take(self, kind: str) -> Token:
        tok = self._peek()
        if tok is None or tok.kind != kind:
            raise self._fail(_EXPECTED.get(kind, kind))
        self.i += 1
        return tok

    def value(self) -> Value:
        first = self.element(0)
        if self._kind() == "COMMA":
            items = [first]
            while self._kind() == "COMMA":
                self.i += 1
                items.append(self.element(0))
            raise GrammarError(
                f"{self.text.strip()!r} is a sweep over {len(items)} values, which requires --multirun (a single "
                "run takes one value: a list is [a,b], a string with commas is quoted 'a,b')"
            )
        if self._peek() is not None:
            tok = self._peek()
            assert tok is not None
            what = {
                "BRACE_CLOSE": "unbalanced braces: ",
                "BRACKET_CLOSE": "unbalanced brackets: ",
                "PCLOSE": "unbalanced parentheses: ",
            }
            raise GrammarError(
                f"{what.get(tok.kind, '')}unexpected {shown(self.text[tok.pos :].strip())!r} at character "
                f"{self.offset + tok.pos + 1}"
            )
        return _plain(first)

    def element(self, depth: int) -> Parsed:
        kind = self._kind()
        if kind == "ID" and self._kind(1) == "POPEN":
            return self._function(depth)
        if kind == "BRACKET_OPEN":
            return self._list(depth)
        if kind == "BRACE_OPEN":
            return self._dict(depth)
        if kind == "QUOTED_VALUE":
            self.i += 1
            return Quoted(_unquote(self.tokens[self.i - 1].text))
        run = []
        while self._kind() in _PRIMITIVE:
            run.append(self.tokens[self.i])
            self.i += 1
        if not run:
            raise self._fail("a value")
        return _primitive(run)

    def _list(self, depth: int) -> list[Parsed]:
        if depth >= self.max_depth:
            raise GrammarError(f"lists nested deeper than {self.max_depth} levels")
        self._take("BRACKET_OPEN")
        out: list[Parsed] = []
        if self._kind() != "BRACKET_CLOSE":
            out.append(self.element(depth + 1))
            while self._kind() == "COMMA":
                self.i += 1
                out.append(self.element(depth + 1))
        self._take("BRACKET_CLOSE")
        return out

    def _dict(self, depth: int) -> dict[str, Parsed]:
        if depth >= self.max_depth:
            raise GrammarError(f"dicts nested deeper than {self.max_depth} levels")
        self._take("BRACE_OPEN")
        out: dict[str, Parsed] = {}
        while self._kind() != "BRACE_CLOSE":
            if out:
                self._take("COMMA")
            run = []
            while self._kind() in _DICT_KEY:
                run.append(self.tokens[self.i])
                self.i += 1
            if not run:
                raise self._fail("a dict key")
            key = _primitive(run)
            name = str(key).lower() if isinstance(key, bool) else str(key)
            self._take("COLON")
            if name in out:
                raise GrammarError(f"the dict key {name!r} appears twice")
            out[name] = self.element(depth + 1)
        self._take("BRACE_CLOSE")
        return out

    def _function(self, depth: int) -> Parsed:
        name = self._take("ID").text
        self._take("POPEN")
        args: list[Parsed] = []
        kwargs: dict[str, Parsed] = {}
        while self._kind() != "PCLOSE":
            if args or kwargs:
                self._take("COMMA")
            if self._kind() == "ID" and self._kind(1) == "EQUAL":
                arg = self._take("ID").text
                self.i += 1
                kwargs[arg] = self.element(depth + 1)
            elif kwargs:
                raise GrammarError("positional argument follows keyword argument")
            else:
                args.append(self.element(depth + 1))
        self._take("PCLOSE")
        return _call(name, args, kwargs)


def shown(text: str, limit: int = 20) -> str:
    """``text`` cut to ``limit`` characters for a message."""
    return text if len(text) <= limit else f"{text[:limit]}..."


def _unquote(text: str) -> str:
    """A quoted value's text: the quotes removed, ``\\`` before the quote character undone (Hydra's
    ``_unescape_quoted_string``: an escaped quote, and backslashes doubled before a quote)."""
    q, body = text[0], text[1:-1]
    return re.sub(
        r"(\\+)(" + re.escape(q) + r"|$)", lambda m: m.group(1)[: len(m.group(1)) // 2] + m.group(2), body
    )


def _primitive(run: list[Token]) -> Scalar:
    """Hydra's ``_createPrimitive``: outer whitespace dropped; one token typed; several joined as a string."""
    first, last = 0, len(run)
    if run[0].kind == "WS":
        if len(run) == 1:
            raise GrammarError("a value of whitespace only")
        first = 1
    if run[-1].kind == "WS":
        last -= 1
    part = run[first:last]
    if len(part) > 1:
        return "".join(t.text[1::2] if t.kind == "ESC" else t.text for t in part)
    tok = part[0]
    if tok.kind == "INT":
        digits = len(tok.text.lstrip("+-").replace("_", ""))
        if digits > MAX_DIGITS:
            raise GrammarError(f"an integer of {digits} digits is too long (at most {MAX_DIGITS})")
        return int(tok.text)
    if tok.kind == "FLOAT":
        return float(tok.text)
    if tok.kind == "NULL":
        return None
    if tok.kind == "BOOL":
        return tok.text.lower() == "true"
    if tok.kind == "ESC":
        return tok.text[1::2]
    return tok.text


def _plain(value: Parsed) -> Value:
    if isinstance(value, Quoted):
        return value.text
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _cast(kind: str, value: Parsed) -> Parsed:
    """Hydra's ``cast_int`` / ``cast_float`` / ``cast_str`` / ``cast_bool`` of one value (lists and dicts
    item by item)."""
    if isinstance(value, Quoted):
        return _cast(kind, value.text)
    if isinstance(value, list):
        items: list[Parsed] = [_cast(kind, v) for v in value]
        return items
    if isinstance(value, dict):
        entries: dict[str, Parsed] = {k: _cast(kind, v) for k, v in value.items()}
        return entries
    if value is None:
        raise GrammarError(f"{kind}() of null")
    try:
        if kind == "int":
            return int(value)
        if kind == "float":
            return float(value)
        if kind == "str":
            return str(value).lower() if isinstance(value, bool) else str(value)
    except (ValueError, OverflowError) as exc:
        raise GrammarError(f"{kind}({value!r}): {exc}") from exc
    if isinstance(value, str):
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise GrammarError(f"bool({value!r}): Cannot cast '{value}' to bool")
    return bool(value)


_CASTS = frozenset({"int", "float", "str", "bool"})


def _call(name: str, args: list[Parsed], kwargs: dict[str, Parsed]) -> Parsed:
    if name in SWEEPS:
        raise GrammarError(
            f"{name}(...) is a sweep, which requires --multirun (a single run takes one value)"
        )
    if name == "shuffle":
        raise GrammarError("shuffle(...) has no fixed result (the plan would not be reproducible)")
    if name in _CASTS:
        if args and kwargs:
            raise GrammarError(f"{name}(): cannot use both position and named arguments")
        if kwargs and set(kwargs) != {"value"}:
            raise GrammarError(f"{name}(): the only named argument is value")
        if not args and not kwargs:
            raise GrammarError(f"{name}(): No positional args or value specified")
        if len(args) > 1:
            # Hydra's ``_normalize_cast_value`` makes a simple choice sweep of several values.
            raise GrammarError(
                f"{name}() of {len(args)} values is a sweep, which requires --multirun (a single run takes "
                "one value; a list is written [a,b])"
            )
        value: Parsed = kwargs["value"] if kwargs else args[0]
        return _cast(name, value)
    if name == "sort":
        reverse = kwargs.pop("reverse", False)
        items = kwargs.pop("list", None)
        if kwargs or reverse not in (True, False):
            raise GrammarError("sort(): takes a list and reverse=true|false")
        if items is None and len(args) == 1 and isinstance(args[0], list):
            items = args[0]
        if not isinstance(items, list):
            raise GrammarError("sort() of several values is a sweep, which requires --multirun")
        plain = [_plain(v) for v in items]
        try:
            ordered: list[Parsed] = list(sorted(plain, reverse=bool(reverse)))  # type: ignore[type-var, arg-type]
            return ordered
        except TypeError as exc:
            raise GrammarError(f"sort(): {exc}") from exc
    raise GrammarError(f"unknown function {name!r} (Hydra's functions: {', '.join(FUNCTIONS)})")


def parse_value(text: str, offset: int = 0, max_depth: int = 16) -> Value:
    """The value of an override's right-hand side as Hydra reads it (``""`` for an empty one).

    Raises:
        GrammarError: text Hydra's lexer or parser refuses, a sweep, ``shuffle``, an unknown function, a cast
            Hydra's function refuses.
    """
    if text == "":
        return ""
    return _Parser(text, offset, max_depth).value()
