"""Exit codes, reasons and the termination message (contract table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verl_launcher.exits import REASONS, RETRYABLE, ExitCode, Outcome, termination_line, write_termination_log

# The launch contract's table, written out independently of the code.
CONTRACT = [
    (0, "Succeeded", False),
    (2, "InvalidLaunchSpec", False),
    (10, "VerlFailed", True),
    (11, "WorkerLost", True),
    (12, "TopologyMismatch", False),
    (13, "ClusterNotReady", True),
    (14, "HeadUnreachable", True),
]


@pytest.mark.parametrize(("code", "reason", "retryable"), [pytest.param(*row, id=row[1]) for row in CONTRACT])
def test_contract_table(code: int, reason: str, retryable: bool) -> None:
    assert REASONS[ExitCode(code)] == reason
    assert RETRYABLE[ExitCode(code)] is retryable


def test_no_codes_outside_the_contract() -> None:
    assert sorted(int(c) for c in ExitCode) == [row[0] for row in CONTRACT]


def test_write_termination_log(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    write_termination_log(Outcome(ExitCode.WORKER_LOST, "node w1\nvanished"), str(path))
    text = path.read_text()
    assert text.count("\n") == 1
    assert json.loads(text) == {"reason": "WorkerLost", "message": "node w1 vanished"}


def test_unwritable_termination_log_does_not_raise(tmp_path: Path) -> None:
    write_termination_log(Outcome(ExitCode.SUCCEEDED, "ok"), str(tmp_path / "missing" / "log"))


@given(st.text(max_size=6000))
def test_termination_line_fits_and_is_json(message: str) -> None:
    line = termination_line("VerlFailed", message, limit=512)
    assert len(line.encode("utf-8")) <= 512
    assert "\n" not in line
    assert json.loads(line)["reason"] == "VerlFailed"
