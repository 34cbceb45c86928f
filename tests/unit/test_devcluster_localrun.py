"""The local operator of the devcluster and the cluster tier (``devcluster/localrun.py``): its command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_contract.progress import PROGRESS_PORT
from verl_devtools.devcluster.localrun import LocalOperator
from verl_operator.cli import build_parser


@pytest.mark.parametrize(
    ("extra_args", "port"),
    [
        pytest.param((), 0, id="kwok-pods-are-never-read"),
        pytest.param(("--progress-port=18270",), 18270, id="a-test-serving-progress-reads-its-port"),
    ],
)
def test_the_local_operator_reads_no_simulated_pod_unless_told(
    tmp_path: Path, extra_args: tuple[str, ...], port: int
) -> None:
    """kwok's pods carry simulated IPs that no pod holds: the local operator is started with
    ``--progress-port=0`` (no head pod read) unless its caller passes a port of its own, which wins."""
    operator = LocalOperator(tmp_path / "kubeconfig", tmp_path / "work", extra_args=extra_args)
    args = build_parser().parse_args(operator.argv()[3:])
    assert args.progress_port == port
    assert build_parser().parse_args(["run"]).progress_port == PROGRESS_PORT  # the product's default reads
