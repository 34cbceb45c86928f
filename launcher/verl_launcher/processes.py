"""Child processes of the launcher: started with argv lists in their own session, output streamed, stopped
as a group (so that ``ray start --block`` and verl take their own children with them)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

#: Called with each output line; may return an extra line to print right after it.
LineHandler = Callable[[str], str | None]


class Child:
    """A child process whose combined stdout/stderr is forwarded line by line.

    Args:
        argv: The command (never run through a shell).
        env: Its full environment.
        prefix: Put before every forwarded line (empty for verl, whose lines pass through unchanged).
        on_line: Called with every line (without the newline); a returned string is printed after the line.
        out: Where lines are forwarded (default ``sys.stdout``).
    """

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        prefix: str = "",
        on_line: LineHandler | None = None,
        out: TextIO | None = None,
    ) -> None:
        self.argv = list(argv)
        self._prefix = prefix
        self._on_line = on_line
        self._out = out or sys.stdout
        self.last_lines: list[str] = []
        self.proc = subprocess.Popen(
            self.argv,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            errors="replace",
            start_new_session=True,
        )
        self._pump = threading.Thread(target=self._forward, name=f"pump-{self.proc.pid}", daemon=True)
        self._pump.start()

    def _forward(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.rstrip("\n")
            self.last_lines = [*self.last_lines[-19:], line]
            extra = None
            if self._on_line is not None:
                try:
                    extra = self._on_line(line)
                except Exception as exc:  # a parser bug must never stop the output
                    print(f"verl-launcher: line handler failed: {exc!r}", file=sys.stderr, flush=True)
            self._out.write(f"{self._prefix}{line}\n")
            if extra:
                self._out.write(extra + "\n")
            self._out.flush()

    @property
    def pid(self) -> int:
        """The child's process id (also its process group id)."""
        return self.proc.pid

    def poll(self) -> int | None:
        """The exit code, or None while running."""
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit and for its output to be forwarded; return the exit code."""
        code = self.proc.wait(timeout)
        self._pump.join(timeout=5)
        return code

    def stop(self, grace_s: float = 30.0) -> int:
        """SIGTERM the child, then SIGKILL its whole process group after ``grace_s``; return the exit code."""
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM, group=False)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace_s)
        # Whatever the child left behind in its session goes too (the group id is the child's pid).
        self._signal(signal.SIGKILL, group=True)
        return self.wait(timeout=grace_s)

    def _signal(self, sig: signal.Signals, group: bool) -> None:
        try:
            if group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)
        except (ProcessLookupError, PermissionError):
            pass
