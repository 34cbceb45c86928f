"""A component that dies or hangs at start-up: a clear error naming it, with its log, and nothing left running."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

from verl_devtools.devcluster import DevCluster, DevClusterError
from verl_devtools.devcluster.process import alive, start_time, stop
from verl_devtools.devcluster.versions import CACHE_ENV, ETCD_VERSION, KUBERNETES_VERSION, KWOK_VERSION

VERSIONS = {
    "kube-apiserver": f"Kubernetes {KUBERNETES_VERSION}",
    "kube-controller-manager": f"Kubernetes {KUBERNETES_VERSION}",
    "kube-scheduler": f"Kubernetes {KUBERNETES_VERSION}",
    "kubectl": f"Client Version: {KUBERNETES_VERSION}",
    "kwok": f"kwok version {KWOK_VERSION}",
}


def install(directory: Path, name: str, version: str, behaviour: str) -> None:
    """An executable that reports ``version`` when asked and otherwise runs ``behaviour`` (shell)."""
    path = directory / name
    path.write_text(
        f'#!/bin/sh\ncase "$1" in --version|version) echo "{version}"; exit 0;; esac\n{behaviour}\n'
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def assets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "assets"
    directory.mkdir()
    for name, version in VERSIONS.items():
        install(directory, name, version, "while :; do sleep 0.1; done")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(directory))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return directory


def running_from(directory: Path) -> list[int]:
    """Pids of live processes whose command line names a file in ``directory``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(directory) in cmdline and alive(int(proc.name)):
                pids.append(int(proc.name))
    return pids


def quiet(tmp_path: Path) -> DevCluster:
    profile = tmp_path / "p.yaml"
    profile.write_text(
        "name: p\nnodeGroups:\n  - {namePrefix: n, count: 1, cpu: '1', memory: 1Gi, region: r, zone: z, racks: [a]}\n"
    )
    return DevCluster(name="failing", profile=str(profile), progress=lambda _m: None)


def test_a_component_that_exits_is_named_with_its_log(assets: Path, tmp_path: Path) -> None:
    install(
        assets,
        "etcd",
        f"etcd Version: {ETCD_VERSION.removeprefix('v')}",
        'echo "listen tcp: bind: address already in use"; exit 1',
    )
    cluster = quiet(tmp_path)
    with pytest.raises(DevClusterError) as caught:
        cluster.up(timeout=20)
    message = str(caught.value)
    assert message.startswith("etcd exited during start")
    assert "address already in use" in message
    assert str(cluster.layout.log("etcd")) in message


def test_a_component_that_never_gets_healthy_is_stopped(assets: Path, tmp_path: Path) -> None:
    install(
        assets,
        "etcd",
        f"etcd Version: {ETCD_VERSION.removeprefix('v')}",
        "echo starting; while :; do sleep 0.1; done",
    )
    cluster = quiet(tmp_path)
    with pytest.raises(DevClusterError, match=r"etcd did not become healthy within 1s") as caught:
        cluster.up(timeout=1)
    assert "starting" in str(caught.value)
    assert cluster.pids() == {}, "a failed start forgets what it started"
    assert running_from(assets) == [], "a failed start stops what it started"
    assert cluster.running_components() == dict.fromkeys(cluster.running_components(), False)


def test_only_lowercase_instance_names() -> None:
    with pytest.raises(DevClusterError, match="instance name"):
        DevCluster(name="My Cluster")


def test_stop_never_signals_a_recycled_pid() -> None:
    """A pid saved in the state file is only signalled while it is still the process started then."""
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        started = start_time(sleeper.pid)
        assert started is not None
        assert alive(sleeper.pid, started)
        assert not alive(sleeper.pid, started - 1)
        stop(sleeper.pid, started - 1)
        assert sleeper.poll() is None, "a process with another start time was signalled"
        stop(sleeper.pid, started)
        assert sleeper.poll() is not None
    finally:
        sleeper.kill()
        sleeper.wait()
