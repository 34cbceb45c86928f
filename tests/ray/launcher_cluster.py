"""Helpers for the Ray tier. Real local Ray on CPU: each "node" is a separate `verl-launcher head|worker` process that runs its own
`ray start` on this machine, with its own ports, fake GPUs (`--num-gpus`) and node name."""

from __future__ import annotations

import contextlib
import json
import os
import re
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


def free_ports(count: int) -> list[int]:
    """Distinct ports that are free now (bound together, then released: another program can take one before
    its server binds it; :func:`head_ports_outcome` tells when that happened)."""
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


#: Tries of a head whose picked ports were taken before Ray bound them (each try picks new ports).
PORT_TRIES = 3


def node_args(head: bool, client_port: int | None = None, marker: str | None = None) -> list[str]:
    """`--ray-start-arg` values for one node of several on this machine.

    Every per-node port is left to Ray, whose components bind port 0 themselves and publish the port they got
    (Ray 2.60: node manager, object manager, metrics export, dashboard agent gRPC, runtime env agent, and the
    workers without a port range); the dashboard agent's HTTP port is fixed by default (52365), so it is set to
    0. Only the head's GCS port (the launch spec's, which the workers join) and its Ray Client server port (1024
    or more, default 10001) are picked here; see :func:`head_ports_outcome`.

    Args:
        head: The head node (gets the client server port, no dashboard).
        client_port: The head's Ray Client server port; picked when None.
        marker: ``--node-name`` of the node, unique on this machine: how :meth:`Env.kill_node` finds its
            ``ray start``.
    """
    args = ["--dashboard-agent-listen-port=0", "--object-store-memory=80000000"]
    if marker is not None:
        args.append(f"--node-name={marker}")
    if head:
        port = client_port if client_port is not None else free_ports(1)[0]
        args += [f"--ray-client-server-port={port}", "--include-dashboard=false"]
    return [f"--ray-start-arg={a}" for a in args]


def _listening_inodes(port: int) -> set[int]:
    """Socket inodes listening on TCP ``port`` (any address, IPv4 and IPv6), from /proc/net."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(int(fields[9]))
    return inodes


def _descendants(root: int) -> set[int]:
    """``root`` and every process below it (by parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def _socket_inodes(pids: set[int]) -> set[int]:
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(int(target[8:-1]))
    return inodes


def port_holder(port: int, pids: set[int]) -> str | None:
    """Who listens on ``port``: ``"ours"`` (a socket of one of ``pids``), ``"foreign"`` or None (nobody)."""
    listening = _listening_inodes(port)
    if not listening:
        return None
    return "ours" if listening & _socket_inodes(pids) else "foreign"


def lost_bind(output: str, port: int) -> bool:
    """Whether a head's output says Ray could not bind ``port`` (Ray 2.60: the GCS server's check failure
    "Failed to start the grpc server. The specified port is N." and the Ray Client server's "Failed to bind to
    address HOST:N"; both end `ray start` with code 1)."""
    return f"The specified port is {port}." in output or bool(
        re.search(rf"Failed to bind to address \S*:{port}\b", output)
    )


def head_ports_outcome(
    proc: subprocess.Popen[str], log_path: Path, ports: dict[str, int], timeout: float = 120.0
) -> str:
    """Whether a head launcher's Ray holds the ports picked for it.

    Polls (every 0.2 s) until one of: every port is listened on by a process of the launcher's tree
    (``"bound"``); one is listened on by another program (``"lost"``: the port was taken between the pick and
    Ray's bind; Ray itself would take 40 s to give up on it); the launcher exited (``"lost"`` when its output
    carries Ray's bind failure for one of the ports, else ``"exited"``, e.g. a spec it refused); ``timeout``
    seconds (``"timeout"``: left to the test's own assertions).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            output = log_path.read_text(errors="replace")
            return "lost" if any(lost_bind(output, port) for port in ports.values()) else "exited"
        tree = _descendants(proc.pid)
        holders = [port_holder(port, tree) for port in ports.values()]
        if "foreign" in holders:
            return "lost"
        if all(h == "ours" for h in holders):
            return "bound"
        time.sleep(0.2)
    return "timeout"


@dataclass
class Launcher:
    """One running `verl-launcher` process (a "node"); started again in place when its head lost a port."""

    name: str
    role: str
    log_path: Path
    termination_log: Path
    extra_env: dict[str, str]
    args: list[str]
    proc: subprocess.Popen[str] = field(init=False)
    marker: str = ""  # --node-name of its Ray node, new at each start

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
    client_port: int = field(default_factory=lambda: free_ports(1)[0])
    #: Lost port races seen by :meth:`start` (each started the nodes again on new ports).
    lost_races: list[dict[str, int]] = field(default_factory=list)
    _spec_call: tuple[int, int, dict[str, Any]] | None = None

    def spec(self, nnodes: int, gpus: int = 2, **changes: Any) -> Path:
        self._spec_call = (nnodes, gpus, changes)
        doc: dict[str, Any] = {
            "apiVersion": "verl-operator.io/v1alpha1",
            "kind": "LaunchSpec",
            "job": {"name": "raytest", "namespace": "default", "uid": "u-1"},
            "verlVersion": "0.9",
            "nnodes": nnodes,
            "gpusPerNode": gpus,
            # dashboardPort: not bound, the heads run with --include-dashboard=false
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
        """Start a launcher; a head is returned once its Ray holds its picked ports (or it exited).

        A head whose GCS or Ray Client port was taken by another program between the pick and Ray's bind is
        stopped with the workers already started, and all of them start again on new ports (``PORT_TRIES``).
        """
        log_path, termination = self.root / f"{name}.log", self.root / f"{name}.termination-log"
        launcher = Launcher(name, role, log_path, termination, dict(extra_env or {}), list(args or []))
        self.launchers.append(launcher)
        self._spawn(launcher)
        if role != "head":
            return launcher
        for _ in range(PORT_TRIES):
            ports = {"gcs": self.port, "client": self.client_port}
            if head_ports_outcome(launcher.proc, launcher.log_path, ports) != "lost":
                return launcher
            self.lost_races.append(ports)
            print(f"--- {name} lost a port race on {ports}; starting the nodes again on new ports ---")
            for started in self.launchers:
                self._stop(started)
            self.port, self.client_port = free_ports(2)
            if self._spec_call is not None:
                nnodes, gpus, changes = self._spec_call
                self.spec(nnodes, gpus, **changes)
            for started in self.launchers:
                self._spawn(started)
        return launcher

    def _spawn(self, launcher: Launcher) -> None:
        """Start (or start again) the launcher process of ``launcher`` with a new node marker."""
        role, name = launcher.role, launcher.name
        launcher.marker = f"{name}-{os.urandom(4).hex()}"
        env = {
            **os.environ,
            **FAST_RAY_ENV,
            "VERL_LAUNCH_SPEC": str(self.root / "launch.json"),
            "VERL_OPERATOR_ROLE": role,
            "VERL_LAUNCHER_TERMINATION_LOG": str(launcher.termination_log),
            "VERL_LAUNCHER_PROGRESS_FILE": str(self.root / "progress.json"),
            "VERL_LAUNCHER_FAKE_GPUS": "2",
            "VERL_LAUNCHER_NODE_NAME": name,
            "PYTHONPATH": os.pathsep.join([str(REPO / "launcher"), os.environ.get("PYTHONPATH", "")]),
            **launcher.extra_env,
        }
        env.pop("RAY_ADDRESS", None)
        argv = [
            sys.executable,
            "-m",
            "verl_launcher",
            role,
            f"--ray-executable={RAY}",
            "--num-cpus=1",
            "--stop-grace-seconds=10",
            *node_args(head=role == "head", client_port=self.client_port, marker=launcher.marker),
            *launcher.args,
        ]
        if role == "head":
            argv += [f"--ray-start-arg=--temp-dir={self.ray_tmp}", "--poll-seconds=1"]
        else:
            argv += ["--retry-seconds=1", "--head-gone-grace-seconds=3"]
        with launcher.log_path.open("w") as handle:
            launcher.proc = subprocess.Popen(
                argv,
                env=env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
                cwd=self.root,
            )

    def _stop(self, launcher: Launcher) -> None:
        """SIGKILL a launcher and its node's Ray (its ``ray start``, found by the node marker, and that group)."""
        _kill_group(launcher.proc.pid)
        for pid in pids_with(f"--node-name={launcher.marker}"):
            _kill_group(pid)
        launcher.proc.wait(30)

    def kill_node(self, launcher: Launcher) -> None:
        """Make a node vanish: SIGKILL its launcher and every Ray process of that node (found by its marker)."""
        os.kill(launcher.proc.pid, signal.SIGKILL)
        for pid in pids_with(f"--node-name={launcher.marker}"):
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
        markers = [f"--node-name={launcher.marker}" for launcher in env.launchers]
        for text in (
            str(env.ray_tmp),
            f"--address=127.0.0.1:{env.port}",
            f"-address=127.0.0.1:{env.port}",
            *markers,
        ):
            for pid in pids_with(text):
                if pid != os.getpid():
                    _kill_group(pid)
        for launcher in env.launchers:
            if launcher.proc.returncode not in (0, None):
                print(f"--- {launcher.name} output ---\n{launcher.output()[-4000:]}")
        shutil.rmtree(root, ignore_errors=True)
