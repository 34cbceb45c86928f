"""A small reader for the bash that verl's launch scripts are written in (parsed, never run).

It reads what ``bash script.sh`` would hand to ``python3 -m verl.trainer.main_ppo`` as ``sys.argv``: variable
assignments (``x=1``, ``export x=1``, ``x=${x:-1}``), parameter expansion (``$x``, ``${x}``, ``${x:-d}``,
``${x-d}``, ``${x:=d}``, ``${x//a/b}``, ``${x/a/b}``), integer arithmetic ``$((...))``, single and double
quotes, backslash escapes, line continuations, comments, arrays (``A=(...)``, ``A+=(...)``, ``"${A[@]}"``),
here-strings (``<<< word``, input only: skipped), word splitting of unquoted expansions, and
``if``/``elif``/``else``/``fi`` on ``[ a = b ]`` / ``[[ a == b ]]`` / ``-z`` / ``-n`` tests.

Two readings of what the script does not define (the environment, its arguments ``$1``/``$@``, a command
substitution ``$(...)``, which is never run):

- ``Shell(env)`` (verl's corpus, ``tests/fidelity``): as bash with no arguments: an unset variable expands to
  the empty string and is recorded, so the caller can drop the ``key=`` override it produced; ``$@`` and
  ``$*`` expand to nothing.
- ``Shell(env, placeholders=True)`` (``verl-operator import``): an unset variable stays a named placeholder
  ``${NAME}`` (``${1}`` for an argument, ``${@}`` for all of them, the text ``$(...)`` of a substitution, and
  ``$((...))`` when arithmetic uses one), so the reader of the result sees what the script left open;
  :func:`placeholders` lists them.

Anything else (loops, ``case``, functions, here-documents) raises ``Unsupported``: the caller reports the
script as not readable rather than guessing.
"""

from __future__ import annotations

import ast
import dataclasses
import operator
import re
from collections.abc import Callable, Iterator

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_POSITIONAL = re.compile(r"[0-9]+")
_ARRAY_ALL = re.compile(r'^("?)\$\{([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]\}\1$')
ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
_UNSUPPORTED = ("for", "while", "until", "case", "function", "select")
#: A placeholder left by ``Shell(placeholders=True)``: ``${NAME}``, ``${1}``, ``${@}``, ``$(...)``,
#: ``$((...))``. Hydra's own interpolations (``${data.x}``, ``${oc.env:X}``) hold a dot or colon: not matched.
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*])\}|\$\((\(.*?\)|[^()]*)\)")


#: Blanks inside a placeholder, hidden from field splitting (private-use characters) and restored after.
_KEEP = {" ": "\ue000", "\t": "\ue001", "\n": "\ue002"}
_RESTORE = str.maketrans({v: k for k, v in _KEEP.items()})


def placeholders(text: str) -> list[str]:
    """The placeholders in an expanded word, in order, each once (``${NAME}`` -> ``NAME``, ``$(cmd)`` whole)."""
    found: list[str] = []
    for match in _PLACEHOLDER.finditer(text):
        name = match.group(1) or match.group(0)
        if name not in found:
            found.append(name)
    return found


class Unsupported(ValueError):
    """The script uses shell syntax this reader does not evaluate."""


@dataclasses.dataclass
class Field:
    """One word after expansion: its text and the unset variables (or substitutions) it referenced."""

    text: str
    unset: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Command:
    """A simple command: its words as written (unexpanded) and the line it starts on."""

    words: tuple[str, ...]
    line: int


def _logical_lines(text: str) -> str:
    """Join line continuations (backslash-newline) outside single quotes and comments, as bash does."""
    out: list[str] = []
    quote = ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote == "'":
            out.append(ch)
            quote = "" if ch == "'" else quote
        elif ch == "\\" and text[i + 1 : i + 2] == "\n":
            i += 2
            continue
        elif ch == "\\" and i + 1 < len(text):
            out.append(text[i : i + 2])
            i += 2
            continue
        elif ch == "#" and not quote and (i == 0 or text[i - 1] in " \t\n;"):
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            out.append(text[i:end])  # a comment: quotes in it are text
            i = end
            continue
        elif ch in "'\"":
            if not quote:
                quote = ch
            elif quote == ch:
                quote = ""
            out.append(ch)
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def _skip_braced(text: str, i: int, open_: str, close: str) -> int:
    """The index after the ``close`` that balances the ``open_`` at ``text[i]``."""
    depth = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "'" and open_ != "'":
            i = text.index("'", i + 1) + 1 if "'" in text[i + 1 :] else len(text)
            continue
        if ch == open_:
            depth += 1
        elif ch == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise Unsupported(f"unbalanced {open_}{close}")


def _skip_redirect(text: str, i: int) -> int:
    """The index after a redirection (``>f``, ``>>f``, ``2>&1``, ``&>f``, ``<f``) and its target."""
    while i < len(text) and text[i] in "<>&":
        i += 1
    while i < len(text) and text[i] in " \t":
        i += 1
    while i < len(text) and text[i] not in " \t\n;|&":
        i += 1
    return i


def commands(text: str) -> Iterator[Command]:
    """Split a script into simple commands (words unexpanded); ``;``, ``&&``, ``||``, ``|`` end a command."""
    text = _logical_lines(text)
    words: list[str] = []
    word: list[str] = []
    line = 1
    start = 1
    i = 0

    skip_word = False

    def flush_word() -> None:
        nonlocal skip_word
        if word:
            if not skip_word:
                words.append("".join(word))
            skip_word = False
            word.clear()

    while i < len(text):
        ch = text[i]
        if text[i : i + 3] == "<<<":  # a here-string: the command's input, not an argument
            flush_word()
            i += 3
            while i < len(text) and text[i] in " \t":
                i += 1
            skip_word = True
            continue
        if ch in "<>" or text[i : i + 2] == "&>":
            if ch == "<" and text[i : i + 2] == "<<":
                raise Unsupported(f"line {line}: here-document")
            if "".join(word).isdigit():
                word.clear()  # 2>file: the digit names the stream
            flush_word()
            i = _skip_redirect(text, i)
            continue
        if ch == "\n" or ch == ";" or ch in "&|":
            flush_word()
            if words:
                yield Command(tuple(words), start)
                words = []
            if ch == "\n":
                line += 1
            i += 2 if text[i : i + 2] in ("&&", "||", ";;") else 1
            start = line
            continue
        if ch in " \t":
            flush_word()
            i += 1
            continue
        if ch == "#" and not word:
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        if ch == "\\":
            word.append(text[i : i + 2])
            i += 2
            continue
        if ch == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise Unsupported(f"line {line}: unterminated single quote")
            word.append(text[i : end + 1])
            line += text.count("\n", i, end)
            i = end + 1
            continue
        if ch == '"':
            j = i + 1
            while j < len(text) and text[j] != '"':
                if text[j] == "\\":
                    j += 1
                elif text[j] == "$" and text[j + 1 : j + 2] == "(":
                    j = _skip_braced(text, j + 1, "(", ")") - 1
                j += 1
            if j >= len(text):
                raise Unsupported(f"line {line}: unterminated double quote")
            word.append(text[i : j + 1])
            line += text.count("\n", i, j)
            i = j + 1
            continue
        if ch == "(" and word and word[-1] == "=" and ASSIGNMENT.match("".join(word)):
            end = _skip_braced(text, i, "(", ")")  # NAME=( ... ): one word, newlines included
            line += text.count("\n", i, end)
            word.append(text[i:end])
            i = end
            continue
        if ch == "$" and text[i + 1 : i + 2] in ("(", "{"):
            open_ = text[i + 1]
            end = _skip_braced(text, i + 1, open_, ")" if open_ == "(" else "}")
            word.append(text[i:end])
            i = end
            continue
        word.append(ch)
        i += 1
    flush_word()
    if words:
        yield Command(tuple(words), start)


_ARITH_OPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def _arith(expr: str) -> int:
    """Evaluate bash integer arithmetic (``+ - * / %`` and parentheses) on already expanded numbers."""
    try:
        tree = ast.parse(expr.replace("/", "//").strip() or "0", mode="eval")
    except SyntaxError as exc:
        raise Unsupported(f"arithmetic {expr!r}") from exc

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = ev(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
            left, right = ev(node.left), ev(node.right)
            if right == 0 and isinstance(node.op, ast.FloorDiv | ast.Mod):
                raise Unsupported(f"division by zero in {expr!r} (an unset variable?)")
            if isinstance(node.op, ast.FloorDiv | ast.Mod):
                quotient = int(left / right)  # bash truncates toward zero
                return quotient if isinstance(node.op, ast.FloorDiv) else left - quotient * right
            return _ARITH_OPS[type(node.op)](left, right)
        raise Unsupported(f"arithmetic {expr!r}")

    return ev(tree)


class Shell:
    """Variables and the expansion of words against them."""

    def __init__(self, environment: dict[str, str], placeholders: bool = False) -> None:
        self.vars: dict[str, str] = dict(environment)
        self.arrays: dict[str, list[str]] = {}
        #: Leave what the script does not define as a named placeholder instead of the empty string.
        self.placeholders = placeholders
        #: ``${NAME:-default}`` (and ``-``, ``:=``, ``=``) that took their default, by name.
        self.defaulted: dict[str, str] = {}
        #: The names the script exports (``export NAME[=value]``), in order.
        self.exported: list[str] = []

    def exported_values(self) -> dict[str, str]:
        """The exported variables that are set, with their values."""
        return {name: self.vars[name] for name in self.exported if name in self.vars}

    # -- expansion --------------------------------------------------------------------------------
    def _param(self, body: str, unset: list[str]) -> str:
        """``${body}``: a name with an optional ``:-``, ``-``, ``:=``, ``=``, ``//``, ``/`` operation."""
        if body in ("@", "*", "#"):
            if self.placeholders and body != "#":
                unset.append(body)
                return f"${{{body}}}"
            return "0" if body == "#" else ""
        match = _NAME.match(body) or _POSITIONAL.match(body)
        if not match:
            raise Unsupported(f"parameter expansion ${{{body}}}")
        name, rest = match.group(), body[match.end() :]
        value = self.vars.get(name)  # the script's arguments: none, unless given (``--set 1=vllm``)
        if not rest:
            if not value:  # unset, or set from an unset variable (NNODES=${SLURM_JOB_NUM_NODES})
                unset.append(name)
                if self.placeholders and value is None:
                    return f"${{{name}}}"
            return value or ""
        for op in (":-", ":=", "-", "="):
            if rest.startswith(op):
                default = rest[len(op) :]
                empty = value is None or (op.startswith(":") and value == "")
                if not empty:
                    return value or ""
                text = "".join(f.text for f in self._expand_chunks(default, unset, quoted=False))
                self.defaulted.setdefault(name, text)
                if "=" in op:
                    self.vars[name] = text
                return text
        if rest.startswith("/"):
            every = rest.startswith("//")
            pattern, _, replacement = rest[2 if every else 1 :].partition("/")
            if any(c in pattern for c in "*?["):
                raise Unsupported(f"pattern substitution ${{{body}}}")
            if value is None:
                unset.append(name)
                return f"${{{name}}}" if self.placeholders else ""
            return value.replace(pattern, replacement) if every else value.replace(pattern, replacement, 1)
        raise Unsupported(f"parameter expansion ${{{body}}}")

    def _dollar(self, text: str, i: int, unset: list[str]) -> tuple[str, int]:
        """Expand the ``$...`` at ``text[i]``; return the value and the index after it."""
        nxt = text[i + 1 : i + 2]
        if text.startswith("$((", i):
            end = _skip_braced(text, i + 1, "(", ")")
            inner = text[i + 3 : end - 2]
            before = len(unset)
            expanded = "".join(f.text for f in self._expand_chunks(inner, unset, quoted=True))
            bare = [n for n in _NAME.findall(expanded) if n not in self.vars]
            if self.placeholders and (len(unset) > before or bare):
                unset.extend(bare)
                return text[i:end], end  # arithmetic on a placeholder: left as written
            expanded = _NAME.sub(lambda m: self.vars.get(m.group(), "0") or "0", expanded)
            return str(_arith(expanded)), end
        if nxt == "(":
            end = _skip_braced(text, i + 1, "(", ")")
            unset.append(f"$({text[i + 2 : end - 1]})")
            return (text[i:end] if self.placeholders else ""), end
        if nxt == "{":
            end = _skip_braced(text, i + 1, "{", "}")
            return self._param(text[i + 2 : end - 1], unset), end
        match = _NAME.match(text, i + 1)
        if match:
            return self._param(match.group(), unset), match.end()
        if nxt in ("@", "*", "#") or nxt.isdigit():
            return self._param(nxt, unset), i + 2
        return "$", i + 1

    def _expand_chunks(self, text: str, unset: list[str], quoted: bool) -> list[Field]:
        """Expand ``text`` into chunks: a ``Field`` whose ``unset`` is ``("split",)`` holds the value of an
        unquoted expansion (field splitting may cut it); every other chunk is literal or quoted text.
        """
        chunks: list[Field] = []
        i = 0
        while i < len(text):
            ch = text[i]
            if ch == "\\":
                nxt = text[i + 1 : i + 2]
                if quoted and nxt not in ('"', "\\", "$", "`"):
                    chunks.append(Field("\\" + nxt))
                else:
                    chunks.append(Field(nxt))
                i += 2
            elif ch == "'" and not quoted:
                end = text.index("'", i + 1)
                chunks.append(Field(text[i + 1 : end]))
                i = end + 1
            elif ch == '"' and not quoted:
                end = i + 1
                while text[end] != '"':
                    if text[end] == "\\":
                        end += 1
                    elif text[end] == "$" and text[end + 1 : end + 2] == "(":
                        end = _skip_braced(text, end + 1, "(", ")") - 1
                    end += 1
                inner = self._expand_chunks(text[i + 1 : end], unset, quoted=True)
                chunks.extend(inner or [Field("")])
                i = end + 1
            elif ch == "$":
                start = i
                value, i = self._dollar(text, i, unset)
                as_written = self.placeholders and value == text[start:i]  # a placeholder: never split
                chunks.append(Field(value, () if quoted or as_written else ("split",)))
            elif ch == "`":
                raise Unsupported("backquote command substitution")
            else:
                chunks.append(Field(ch))
                i += 1
        return chunks

    def _split(self, text: str) -> list[str]:
        """Field splitting on blanks; with placeholders, a placeholder's own blanks (``$(basename $M)``) stay."""
        if not self.placeholders:
            return re.split(r"[ \t\n]+", text)
        kept = _PLACEHOLDER.sub(lambda m: re.sub(r"[ \t\n]", lambda b: _KEEP[b.group()], m.group()), text)
        parts = re.split(r"[ \t\n]+", kept)
        return [p.translate(_RESTORE) for p in parts]

    def expand(self, word: str) -> list[Field]:
        """Expand one word into fields (unquoted expansions are split on whitespace; an empty one vanishes)."""
        if word in ('"$@"', '"${@}"', '"$*"'):  # the script's own arguments: none, or their placeholder
            return [Field("${@}", ("@",))] if self.placeholders else []
        array = _ARRAY_ALL.match(word)
        if array:
            if array.group(2) not in self.arrays:
                return []
            elements = self.arrays[array.group(2)]
            return (
                [Field(e) for e in elements]
                if array.group(1)
                else [Field(p) for e in elements for p in e.split()]
            )
        unset: list[str] = []
        chunks = self._expand_chunks(word, unset, quoted=False)
        fields: list[str] = []
        current: list[str] = []
        has_literal = False  # the current field holds quoted or literal text, so it exists even if empty
        for chunk in chunks:
            if chunk.unset != ("split",):
                current.append(chunk.text)
                has_literal = True
                continue
            parts = self._split(chunk.text)
            for index, part in enumerate(parts):
                if index > 0 and ("".join(current) or has_literal):
                    fields.append("".join(current))
                    current, has_literal = [], False
                current.append(part)
        if "".join(current) or has_literal:
            fields.append("".join(current))
        return [Field(text, tuple(unset)) for text in fields]

    def expand_all(self, words: tuple[str, ...]) -> list[Field]:
        """Expand every word of a command."""
        return [field for word in words for field in self.expand(word)]

    def assignment(self, word: str) -> tuple[str, str] | None:
        """``(NAME, value)`` of a scalar assignment word, expanded but not applied (``VAR=x cmd``), or None."""
        match = ASSIGNMENT.match(word)
        if not match or word[match.end() :].startswith("("):
            return None
        value = "".join(f.text for f in self._expand_chunks(word[match.end() :], [], quoted=False))
        return match.group(1), value

    def assign(self, word: str) -> bool:
        """Apply ``NAME=value`` (or ``NAME+=value``); False when ``word`` is not an assignment."""
        match = ASSIGNMENT.match(word)
        if not match:
            return False
        name, raw = match.group(1), word[match.end() :]
        if raw.startswith("(") and raw.endswith(")"):  # NAME=(a b c): an array
            elements = [f.text for c in commands(raw[1:-1]) for f in self.expand_all(c.words)]
            if match.group(2):  # NAME+=(d e): appended
                elements = self.arrays.get(name, []) + elements
            self.arrays[name] = elements
            self.vars[name] = elements[0] if elements else ""
            return True
        unset: list[str] = []
        value = "".join(f.text for f in self._expand_chunks(raw, unset, quoted=False))
        self.vars[name] = (self.vars.get(name, "") + value) if match.group(2) else value
        return True

    # -- tests ---------------------------------------------------------------------------------------
    def test(self, words: tuple[str, ...]) -> bool:
        """Evaluate ``[ ... ]`` / ``[[ ... ]]`` with ``=``, ``==``, ``!=``, ``-z``, ``-n`` (and ``!``)."""
        inner = list(words)
        if inner and inner[0] in ("[", "[[") and inner[-1] in ("]", "]]"):
            inner = inner[1:-1]
        else:
            raise Unsupported(f"condition {' '.join(words)!r}")
        negate = bool(inner) and inner[0] == "!"
        inner = inner[1:] if negate else inner
        values = [
            " ".join(f.text for f in self.expand(w)) if w not in ("=", "==", "!=") else w for w in inner
        ]
        if len(values) == 3 and values[1] in ("=", "==", "!="):
            result = (values[0] == values[2]) == (values[1] != "!=")
        elif len(values) == 2 and values[0] in ("-z", "-n"):
            result = (values[1] == "") == (values[0] == "-z")
        else:
            raise Unsupported(f"condition {' '.join(words)!r}")
        return result != negate


def is_unsupported_keyword(word: str) -> bool:
    """Whether a command starts with a construct this reader does not evaluate."""
    return word in _UNSUPPORTED or word.endswith("()") or word == "{"
