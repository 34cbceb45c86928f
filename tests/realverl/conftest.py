"""Fixtures of the real-verl tier: the verl 0.6.1 CPU environment and the test assets, built once per session
(never at collection) and cached under ``~/.cache/verl-operator`` by the hash of their inputs."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import cpu_env
import pytest
from realverl_job import LocalJob


@pytest.fixture(scope="session")
def verl_cpu_python() -> Path:
    """The real-verl environment's interpreter (built on first use: about 3 GB of downloads, minutes)."""
    return cpu_env.ensure()


@pytest.fixture(scope="session")
def assets(verl_cpu_python: Path) -> Path:
    """The tiny model, tokenizer, data and reward (``assets.py``), built in the real-verl environment."""
    return cpu_env.ensure_assets(verl_cpu_python)


@pytest.fixture
def local_job(verl_cpu_python: Path) -> Iterator[LocalJob]:
    """A job workspace in a short temporary folder; every process it started is stopped afterwards."""
    root = Path(tempfile.mkdtemp(prefix="rv-"))  # short: Ray's unix socket paths must stay < 108 bytes
    job = LocalJob(root=root, python=verl_cpu_python)
    try:
        yield job
    finally:
        job.stop()
        for node in job.nodes:
            if node.proc.returncode != 0:
                print(f"--- {node.name} output ---\n{node.output()[-6000:]}")
        shutil.rmtree(root, ignore_errors=True)
