"""Start, watch and stop the devcluster's processes by pid (they outlive the command that started them)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import IO


def start(argv: list[str], log_path: Path, cwd: Path) -> int:
    """Start a detached process (own session: a Ctrl-C in the terminal does not reach it).

    Args:
        argv: The command line (never run through a shell).
        log_path: stdout and stderr are appended here.
        cwd: Working directory.

    Returns:
        The pid.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
        )
    return proc.pid


def _reap(pid: int) -> bool:
    """Reap ``pid`` if it is an exited child of this process; True if it was reaped."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == pid


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat`` field 22), None if it is gone.

    Together with the pid it identifies one process for good: a recycled pid has another start time.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may contain spaces: split after the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[19])


def alive(pid: int, started: int | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie) and, if ``started`` is given, is the process that started then.

    The start-time check guards against a recycled pid after a reboot or a long time.
    """
    if pid <= 0 or _reap(pid):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    proc = Path(f"/proc/{pid}")
    try:
        stat = (proc / "stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return started is None or start_time(pid) == started


def stop(pid: int, started: int | None = None, timeout: float = 15.0) -> None:
    """SIGTERM ``pid``, wait up to ``timeout`` seconds, then SIGKILL and wait until it is gone.

    Does nothing if ``pid`` is not the process that started at ``started`` (a recycled pid is never
    signalled).
    """
    if not alive(pid, started):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def stop_child(proc: subprocess.Popen[bytes] | None, log: IO[bytes] | None, timeout: float = 15.0) -> None:
    """Stop a child this process started: SIGTERM, up to ``timeout`` seconds, then SIGKILL; close its log."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    if log is not None:
        log.close()


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file ('' if it does not exist)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
