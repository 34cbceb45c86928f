"""The Python module commands of a launch script, with the arguments bash would pass them (nothing is run).

A script is walked command by command (:func:`verl_operator.scripts.shell.commands`): assignments and
``export``/``declare``/``local``/``readonly`` set variables, ``if``/``elif``/``else``/``fi`` branches are
followed on their ``[ ... ]`` tests, ``exit`` ends the walk, and every command whose expanded words hold
``python... -m MODULE`` (``python3 -m``, ``python -m``, after ``nohup``, ``VAR=x`` prefixes or
``ray job submit ... --``) is an :class:`Invocation`. :func:`hydra_args` splits its arguments into Hydra's
``--config-path``/``--config-name`` options and the overrides.
"""

from __future__ import annotations

import dataclasses

from verl_operator.scripts.shell import ASSIGNMENT, Command, Field, Shell, Unsupported, commands
from verl_operator.scripts.shell import is_unsupported_keyword as _unsupported_keyword

#: Hydra's command-line options that select the config, with the field of :class:`HydraArgs` they fill.
HYDRA_OPTIONS = (
    ("--config-name", "config_name"),
    ("-cn", "config_name"),
    ("--config-path", "config_path"),
    ("-cp", "config_path"),
)


@dataclasses.dataclass
class Invocation:
    """One ``python -m MODULE`` command after expansion: its line, the module, the words after it and the
    variables assigned for the command alone (``VAR=x python3 -m ...``)."""

    line: int
    module: str
    args: list[Field]
    env: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Frame:
    taken: bool
    active: bool
    parent: bool


def module_args(fields: list[Field]) -> tuple[str, list[Field]] | None:
    """``(module, the words after it)`` of the first ``python... -m MODULE`` in an expanded command, or None."""
    texts = [f.text for f in fields]
    for k in range(len(texts) - 2):
        if texts[k].rsplit("/", 1)[-1].startswith("python") and texts[k + 1] == "-m":
            return texts[k + 2], fields[k + 3 :]
    return None


class _Runner:
    """Walks a script's commands, tracking variables and ``if`` branches."""

    def __init__(self, shell: Shell) -> None:
        self.shell = shell
        self.stack: list[_Frame] = []
        self.found: list[Invocation] = []

    @property
    def active(self) -> bool:
        return all(frame.active for frame in self.stack)

    def _branch(self, words: tuple[str, ...]) -> tuple[str, ...]:
        """Handle ``if``/``elif``/``else``/``fi``/``then``; return the words left to run (maybe none)."""
        head = words[0]
        if head == "then":
            return words[1:]
        if head == "if":
            parent = self.active
            value = parent and self.shell.test(words[1:])
            self.stack.append(_Frame(taken=value, active=value, parent=parent))
            return ()
        if not self.stack and head in ("elif", "else", "fi"):
            raise Unsupported(f"{head} without if")
        if head == "elif":
            frame = self.stack[-1]
            value = frame.parent and not frame.taken and self.shell.test(words[1:])
            frame.active, frame.taken = value, frame.taken or value
            return ()
        if head == "else":
            frame = self.stack[-1]
            frame.active = frame.parent and not frame.taken
            return words[1:]
        if head == "fi":
            self.stack.pop()
            return ()
        return words

    def run(self, command: Command) -> bool:
        """Run one command; False when the script ends here (``exit``)."""
        words = self._branch(command.words)
        if not words or not self.active:
            return True
        if _unsupported_keyword(words[0]) or words[0] in ("source", "."):
            raise Unsupported(f"line {command.line}: {words[0]}")
        if words[0] == "exit":
            return False
        if words[0] in ("export", "declare", "local", "readonly"):
            for word in words[1:]:
                self.shell.assign(word)
                if words[0] == "export" and not word.startswith("-"):
                    match = ASSIGNMENT.match(word)
                    self.shell.exported.append(match.group(1) if match else word)
            return True
        if words[0] == "unset":
            for name in words[1:]:
                self.shell.vars.pop(name, None)
            return True
        rest = list(words)
        if all(ASSIGNMENT.match(w) for w in rest):
            for word in rest:
                self.shell.assign(word)
            return True
        env: dict[str, str] = {}
        while rest and ASSIGNMENT.match(rest[0]):  # VAR=x cmd: VAR is for cmd only
            assigned = self.shell.assignment(rest.pop(0))
            if assigned is not None:
                env[assigned[0]] = assigned[1]
        found = module_args(self.shell.expand_all(tuple(rest)))
        if found is not None:
            self.found.append(Invocation(command.line, found[0], found[1], env))
        return True


def invocations(text: str, shell: Shell) -> list[Invocation]:
    """Every ``python -m MODULE`` command of a script, expanded against ``shell`` (which keeps the variables).

    Raises:
        Unsupported: the script uses shell syntax the reader does not evaluate.
    """
    runner = _Runner(shell)
    for command in commands(text):
        if not runner.run(command):
            break
    if runner.stack:
        raise Unsupported("if without fi")
    return runner.found


@dataclasses.dataclass
class HydraArgs:
    """A verl command line as Hydra reads it.

    Attributes:
        config_name: ``--config-name``/``-cn``, or None.
        config_path: ``--config-path``/``-cp``, or None.
        options: Other words that start with ``-``.
        overrides: The overrides in order (``key=value``, ``+key=value``, ``~key``).
        dropped: Overrides whose value was an unset or empty variable (``key=``), with those variables: bash
            passes ``key=``, and the faithful reading drops them so verl's default applies.
        unset_in_kept: Kept overrides that referenced an unset variable, with those variables.
    """

    config_name: str | None = None
    config_path: str | None = None
    options: list[str] = dataclasses.field(default_factory=list)
    overrides: list[str] = dataclasses.field(default_factory=list)
    dropped: list[tuple[str, tuple[str, ...]]] = dataclasses.field(default_factory=list)
    unset_in_kept: list[tuple[str, tuple[str, ...]]] = dataclasses.field(default_factory=list)


def hydra_args(args: list[Field]) -> HydraArgs:
    """Split the words after ``-m MODULE`` into Hydra's config options and overrides."""
    out = HydraArgs()
    i = 0
    while i < len(args):
        text = args[i].text
        for flag, key in HYDRA_OPTIONS:
            if text == flag and i + 1 < len(args):
                setattr(out, key, args[i + 1].text)
                i += 1
                break
            if text.startswith(flag + "="):
                setattr(out, key, text.split("=", 1)[1])
                break
        else:
            if text.startswith("-"):
                out.options.append(text)
            elif "=" in text and text.split("=", 1)[1] == "" and args[i].unset:
                out.dropped.append((text, args[i].unset))
            else:
                out.overrides.append(text)
                if args[i].unset:
                    out.unset_in_kept.append((text, args[i].unset))
        i += 1
    return out
