"""Helpers for the Ray tier. Real local Ray on CPU: each "node" is a separate `verl-launcher head|worker` process that runs its own
`ray start` on this machine, with its own ports, fake GPUs (`--num-gpus`) and node name."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")
FAKE_VERL = str(Path(__file__).parent / "fake_verl.py")

# Faster failure detection than Ray's defaults (3 s x 5 checks) so a killed node is noticed in seconds.
FAST_RAY_ENV = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    "RAY_gcs_rpc_server_reconnect_timeout_s": "5",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """Distinct ports that are free now (bound together, then released)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("0.0.0.0", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def worker_port_range(size: int = 16) -> tuple[int, int]:
    """A contiguous free range for Ray's worker processes (Ray needs a range, not single ports)."""
    for _ in range(200):
        base = random.randrange(30000, 39000)
        if all(_bindable(p) for p in range(base, base + size)):
            return base, base + size - 1
    raise RuntimeError("no free port range")


def node_args(head: bool) -> list[str]:
    """`--ray-start-arg` values that give one node its own ports (several nodes share this machine)."""
    ports = free_ports(7)
    low, high = worker_port_range()
    args = [
        f"--node-manager-port={ports[0]}",
        f"--object-manager-port={ports[1]}",
        f"--metrics-export-port={ports[2]}",
        f"--dashboard-agent-listen-port={ports[3]}",
        f"--dashboard-agent-grpc-port={ports[4]}",
        f"--runtime-env-agent-port={ports[5]}",
        f"--min-worker-port={low}",
        f"--max-worker-port={high}",
        "--object-store-memory=80000000",
    ]
    if head:
        args += [f"--ray-client-server-port={ports[6]}", "--include-dashboard=false"]
    return [f"--ray-start-arg={a}" for a in args]


@dataclass
class Launcher:
    """One running `verl-launcher` process (a "node")."""

    name: str
    proc: subprocess.Popen[str]
    log_path: Path
    termination_log: Path
    marker: str

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def termination(self) -> dict[str, Any]:
        return dict(json.loads(self.termination_log.read_text()))


@dataclass
class Env:
    """Per-test workspace: spec file, temp dir, ports, and every process started (for teardown)."""

    root: Path
    ray_tmp: Path
    port: int
    launchers: list[Launcher] = field(default_factory=list)

    def spec(self, nnodes: int, gpus: int = 2, **changes: Any) -> Path:
        doc: dict[str, Any] = {
            "apiVersion": "verl-operator.io/v1alpha1",
            "kind": "LaunchSpec",
            "job": {"name": "raytest", "namespace": "default", "uid": "u-1"},
            "verlVersion": "0.9",
            "nnodes": nnodes,
            "gpusPerNode": gpus,
            "head": {"host": "127.0.0.1", "port": self.port, "dashboardPort": free_ports(1)[0]},
            "entrypoint": [sys.executable, FAKE_VERL],
            "overrides": [
                "algorithm.adv_estimator=grpo",
                f"trainer.nnodes={nnodes}",
                f"trainer.n_gpus_per_node={gpus}",
            ],
            "env": {"FAKE_VERL_RECORD": str(self.root / "verl-record.json"), "NCCL_SOCKET_IFNAME": "lo"},
            "expect": {
                "gpuProduct": None,
                "gpuMemoryMiB": None,
                "requireNvlink": False,
                "nvlinkGroupSize": 1,
            },
            "checkpoint": {"dir": str(self.root / "ckpt"), "resume": False},
            "timeouts": {"clusterReadySeconds": 90, "workerJoinSeconds": 90},
        }
        for key, value in changes.items():
            if isinstance(value, dict) and isinstance(doc.get(key), dict):
                doc[key] = {**doc[key], **value}
            else:
                doc[key] = value
        path = self.root / "launch.json"
        path.write_text(json.dumps(doc))
        return path

    def start(
        self, role: str, name: str, extra_env: dict[str, str] | None = None, args: list[str] | None = None
    ) -> Launcher:
        log_path = self.root / f"{name}.log"
        termination = self.root / f"{name}.termination-log"
        env = {
            **os.environ,
            **FAST_RAY_ENV,
            "VERL_LAUNCH_SPEC": str(self.root / "launch.json"),
            "VERL_OPERATOR_ROLE": role,
            "VERL_LAUNCHER_TERMINATION_LOG": str(termination),
            "VERL_LAUNCHER_PROGRESS_FILE": str(self.root / "progress.json"),
            "VERL_LAUNCHER_FAKE_GPUS": "2",
            "VERL_LAUNCHER_NODE_NAME": name,
            "PYTHONPATH": os.pathsep.join([str(REPO / "launcher"), os.environ.get("PYTHONPATH", "")]),
            **(extra_env or {}),
        }
        env.pop("RAY_ADDRESS", None)
        marker = node_args(head=role == "head")
        argv = [
            sys.executable,
            "-m",
            "verl_launcher",
            role,
            f"--ray-executable={RAY}",
            "--num-cpus=1",
            "--stop-grace-seconds=10",
            *marker,
            *(args or []),
        ]
        if role == "head":
            argv += [f"--ray-start-arg=--temp-dir={self.ray_tmp}", "--poll-seconds=1"]
        else:
            argv += ["--retry-seconds=1", "--head-gone-grace-seconds=3"]
        handle = log_path.open("w")
        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            cwd=self.root,
        )
        launcher = Launcher(name, proc, log_path, termination, marker[0].split("=", 2)[-1])
        self.launchers.append(launcher)
        return launcher

    def kill_node(self, launcher: Launcher) -> None:
        """Make a node vanish: SIGKILL its launcher and every Ray process of that node (found by its port)."""
        os.kill(launcher.proc.pid, signal.SIGKILL)
        for pid in pids_with(f"--node-manager-port={launcher.marker}"):
            _kill_group(pid)


def pids_with(text: str) -> list[int]:
    """Processes whose command line contains ``text`` (how the tests find the Ray processes they started)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(entry.name))
    return pids


def _kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (a child started in its own session), then ``pid`` itself."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def ray_env() -> Iterator[Env]:
    root = Path(tempfile.mkdtemp(prefix="vlr-"))  # short: Ray's unix socket paths must stay < 108 bytes
    env = Env(root=root, ray_tmp=root / "r", port=free_ports(1)[0])
    try:
        yield env
    finally:
        for launcher in env.launchers:
            if launcher.proc.poll() is None:
                launcher.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for launcher in env.launchers:
            try:
                launcher.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill_group(launcher.proc.pid)
        # Anything of this test's Ray cluster still alive (found by its unique temp dir or GCS port) goes too.
        for text in (str(env.ray_tmp), f"--address=127.0.0.1:{env.port}", f"-address=127.0.0.1:{env.port}"):
            for pid in pids_with(text):
                if pid != os.getpid():
                    _kill_group(pid)
        for launcher in env.launchers:
            if launcher.proc.returncode not in (0, None):
                print(f"--- {launcher.name} output ---\n{launcher.output()[-4000:]}")
        shutil.rmtree(root, ignore_errors=True)
