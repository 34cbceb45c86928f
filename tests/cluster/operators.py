"""A local operator process for one cluster-test module."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from verl_devtools.devcluster import DevCluster
from verl_devtools.devcluster.localrun import LocalOperator, install_crd


@contextlib.contextmanager
def webhook_operator(
    devcluster: DevCluster, workdir: Path, tag: str, log_lines: int = 80
) -> Iterator[LocalOperator]:
    """The CRD and one local operator process with a managed webhook of its own (named by ``tag`` and this
    process), stopped afterwards with its log tail printed."""
    install_crd(devcluster.kubeconfig)
    op = LocalOperator(
        devcluster.kubeconfig, workdir, webhook_name=f"pytest-{tag}-{os.getpid()}.verl-operator.io"
    )
    op.start()
    try:
        yield op
    finally:
        op.stop()
        print(op.log_tail(log_lines))
