"""A pytest plugin (``-p no_commands``) that refuses every subprocess: collecting must run no command.

Each refused command line is appended to the file named by ``VERL_OPERATOR_NO_COMMANDS_LOG`` before the refusal
is raised, so a caller sees what collection tried to run (an apt-get, a Go build) even where the error is caught.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

_LOG = os.environ["VERL_OPERATOR_NO_COMMANDS_LOG"]


class CommandRefused(RuntimeError):
    """A subprocess was started while only collecting."""


class _Refusing(subprocess.Popen):  # type: ignore[type-arg]
    def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
        with open(_LOG, "a", encoding="utf-8") as log:
            log.write(f"{args!r}\n")
        raise CommandRefused(f"a command ran at collection: {args!r}")


subprocess.Popen = _Refusing  # type: ignore[misc]
os.system = lambda command: _Refusing(command)  # type: ignore[assignment,func-returns-value]
