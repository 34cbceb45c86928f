"""Exit codes and the termination message of the launcher (the operator reads both).

The table is part of the launch contract (docs/launch-contract.md): the operator maps the container's exit
code and the one-line JSON in ``/dev/termination-log`` to the job's status and decides whether to retry.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

#: Default path of the Kubernetes termination message file.
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
#: Kubernetes keeps at most 4096 bytes of a termination message.
TERMINATION_LOG_LIMIT = 4096
#: Environment variable that moves the termination message (tests, non-Kubernetes runs).
TERMINATION_LOG_ENV = "VERL_LAUNCHER_TERMINATION_LOG"


class ExitCode(IntEnum):
    """Process exit codes of ``verl-launcher head|worker``."""

    SUCCEEDED = 0
    INVALID_LAUNCH_SPEC = 2
    VERL_FAILED = 10
    WORKER_LOST = 11
    TOPOLOGY_MISMATCH = 12
    CLUSTER_NOT_READY = 13
    HEAD_UNREACHABLE = 14


#: The ``reason`` written to the termination log for every exit code.
REASONS: dict[ExitCode, str] = {
    ExitCode.SUCCEEDED: "Succeeded",
    ExitCode.INVALID_LAUNCH_SPEC: "InvalidLaunchSpec",
    ExitCode.VERL_FAILED: "VerlFailed",
    ExitCode.WORKER_LOST: "WorkerLost",
    ExitCode.TOPOLOGY_MISMATCH: "TopologyMismatch",
    ExitCode.CLUSTER_NOT_READY: "ClusterNotReady",
    ExitCode.HEAD_UNREACHABLE: "HeadUnreachable",
}

#: Whether the operator may restart the job after this exit (documented in the contract).
RETRYABLE: dict[ExitCode, bool] = {
    ExitCode.SUCCEEDED: False,
    ExitCode.INVALID_LAUNCH_SPEC: False,
    ExitCode.VERL_FAILED: True,
    ExitCode.WORKER_LOST: True,
    ExitCode.TOPOLOGY_MISMATCH: False,
    ExitCode.CLUSTER_NOT_READY: True,
    ExitCode.HEAD_UNREACHABLE: True,
}


#: Not in the contract's table: an unexpected error inside the launcher itself (a bug). The operator treats
#: unknown exit codes as a retryable pod failure.
UNEXPECTED_ERROR_EXIT = 1
UNEXPECTED_ERROR_REASON = "LauncherFailed"


class LauncherError(Exception):
    """A failure that ends the launcher with a specific exit code.

    Attributes:
        code: The exit code the process ends with.
        message: One human-readable sentence (or a few) saying what happened and how to fix it.
    """

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def reason(self) -> str:
        """The contract's reason string for this error's exit code."""
        return REASONS[self.code]


@dataclass(frozen=True)
class Outcome:
    """How the launcher ended: the exit code and the message for the termination log."""

    code: ExitCode
    message: str

    @property
    def reason(self) -> str:
        """The contract's reason string for this outcome's exit code."""
        return REASONS[self.code]


def termination_line(reason: str, message: str, limit: int = TERMINATION_LOG_LIMIT) -> str:
    """Render the one-line JSON termination message, shortened to fit ``limit`` bytes.

    Args:
        reason: The contract's reason (``VerlFailed``...).
        message: Free text; newlines are replaced by spaces, the end is cut with ``...`` when too long.
        limit: The byte budget of the whole line (Kubernetes keeps 4096 bytes).

    Returns:
        A JSON object on one line, at most ``limit`` bytes encoded as UTF-8.
    """
    text = " ".join(message.split())
    line = json.dumps({"reason": reason, "message": text}, ensure_ascii=False)
    while len(line.encode("utf-8")) > limit and text:
        overflow = len(line.encode("utf-8")) - limit
        text = text[: max(0, len(text) - overflow - 3)].rstrip() + "..."
        if len(text) <= 3:
            text = ""
        line = json.dumps({"reason": reason, "message": text}, ensure_ascii=False)
    return line


def write_termination_log(outcome: Outcome, path: str | None = None) -> None:
    """Write the outcome to the termination log; a missing or read-only file only prints a warning.

    Args:
        outcome: The exit code and message.
        path: The file to write; defaults to ``$VERL_LAUNCHER_TERMINATION_LOG`` or ``/dev/termination-log``.
    """
    write_termination_line(outcome.reason, outcome.message, path)


def write_termination_line(reason: str, message: str, path: str | None = None) -> None:
    """Write ``{"reason": reason, "message": message}`` to the termination log (see :func:`write_termination_log`)."""
    target = path or os.environ.get(TERMINATION_LOG_ENV) or DEFAULT_TERMINATION_LOG
    line = termination_line(reason, message)
    try:
        Path(target).write_text(line + "\n", encoding="utf-8")
    except OSError as exc:
        print(f"verl-launcher: cannot write the termination message to {target}: {exc}", file=sys.stderr)
