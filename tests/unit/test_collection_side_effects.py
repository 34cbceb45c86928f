"""Collecting a tier (``pytest --collect-only``) runs no command: no apt-get, no build, nothing on the host.

Builds and installs belong to the run (conftest ``pytest_runtestloop`` hooks, before the first test); a tier's
collection in a subprocess with every subprocess refused and recorded (tests/unit/plugins/no_commands.py) must
list its tests and record no command.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIERS = sorted(p.name for p in (REPO / "tests").iterdir() if p.is_dir() and (p / "conftest.py").exists())


def test_every_tier_is_checked() -> None:
    assert {"cluster", "fidelity", "node", "ray", "unit"} <= set(TIERS)


def test_collecting_every_tier_runs_no_command(tmp_path: Path) -> None:
    log = tmp_path / "commands.log"
    log.touch()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "tests" / "unit" / "plugins"), os.environ.get("PYTHONPATH", "")]
        ),
        "VERL_OPERATOR_NO_COMMANDS_LOG": str(log),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no_commands",
            *(f"tests/{t}" for t in TIERS),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert log.read_text() == "", f"collecting the tiers ran:\n{log.read_text()}"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    collected = {line.split("/", 2)[1] for line in proc.stdout.splitlines() if line.startswith("tests/")}
    assert collected == set(TIERS), proc.stdout[-2000:]
