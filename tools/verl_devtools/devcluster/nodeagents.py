"""The real nodes' agent processes, by pid: start and record them, wait until they answer, stop them.

Every agent (a containerd and a kubelet per node, kube-proxy, the cluster DNS) is recorded in the
instance state under ``node_processes`` with its pid, executable and start time, so that a later call
knows whether it still runs and stops exactly that process.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from verl_devtools.devcluster import process
from verl_devtools.devcluster.errors import RealNodeError
from verl_devtools.devcluster.health import http_status
from verl_devtools.devcluster.layout import Layout


def start_agent(
    state: dict[str, Any], key: str, argv: list[str], log: Path, cwd: Path, save: Callable[[], None]
) -> int:
    """Start ``argv`` (output to ``log``), record it under ``key`` and save the state; returns its pid."""
    pid = process.start(argv, log, cwd)
    state.setdefault("node_processes", {})[key] = {
        "pid": pid,
        "executable": argv[0],
        "started": process.start_time(pid),
    }
    save()
    return pid


def wait_ready(check: Callable[[], bool], pid: int, what: str, log: Path, timeout: float) -> None:
    """Poll ``check`` until it is true.

    Raises:
        RealNodeError: The process exited, or ``check`` stayed false for ``timeout`` seconds (the
            message has the log's tail).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.alive(pid):
            raise RealNodeError(
                f"{what} exited during start; last lines of {log}:\n{process.log_tail(log, 25)}"
            )
        if check():
            return
        time.sleep(0.2)
    raise RealNodeError(
        f"{what} not ready within {timeout:.0f}s; last lines of {log}:\n{process.log_tail(log, 25)}"
    )


def agent_running(state: dict[str, Any], key: str) -> bool:
    """Whether the agent recorded under ``key`` still runs (same pid, same start time)."""
    entry = state.get("node_processes", {}).get(key)
    return bool(entry) and process.alive(int(entry["pid"]), entry.get("started"))


def running(state: dict[str, Any]) -> dict[str, bool]:
    """Whether each started agent still runs."""
    return {key: agent_running(state, key) for key in state.get("node_processes", {})}


def stop_agent(state: dict[str, Any], key: str) -> None:
    """Stop the agent recorded under ``key`` (waiting for it) and forget it."""
    entry = state.get("node_processes", {}).pop(key, None)
    if entry:
        process.stop(int(entry["pid"]), entry.get("started"))


def http_ok(url: str) -> bool:
    """Whether a loopback HTTP endpoint answers 200."""
    parts = urlsplit(url)  # loopback only
    return http_status(f"{parts.scheme}://{parts.netloc}", parts.path or "/") == 200


# -- containerd ------------------------------------------------------------------------------------------------


def ctr(socket: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``ctr`` against one node's containerd, in the kubelet's ``k8s.io`` namespace."""
    return subprocess.run(
        ["ctr", f"--address={socket}", "--namespace=k8s.io", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )


def ctr_ready(socket: Path) -> Callable[[], bool]:
    """A check that the containerd at ``socket`` answers."""
    return lambda: ctr(socket, "version").returncode == 0


def import_image(socket: Path, archive: Path) -> None:
    """``ctr images import`` an OCI archive into one node's containerd (unpacked for overlayfs).

    Raises:
        RealNodeError: The import failed.
    """
    done = ctr(socket, "images", "import", "--snapshotter=overlayfs", str(archive))
    if done.returncode != 0:
        raise RealNodeError(
            f"ctr images import {archive} failed: {done.stderr.strip() or done.stdout.strip()}"
        )


def containerd_sockets(layout: Layout, state: dict[str, Any]) -> list[Path]:
    """The containerd socket of every running real node."""
    keys = sorted(k for k in state.get("node_processes", {}) if k.startswith("containerd-"))
    return [
        layout.base / "nodes" / k.removeprefix("containerd-") / "containerd" / "containerd.sock"
        for k in keys
        if agent_running(state, k)
    ]
