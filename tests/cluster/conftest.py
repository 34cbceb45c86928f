"""Fixtures of the cluster tier: a real local control plane (etcd, kube-apiserver, controller-manager,
scheduler) with kwok-simulated GPU nodes, shared by the whole session; a fresh namespace per test.

The session's instance is named ``pytest-<pid>`` (profile ``mixed``) and removed at the end; the ``default``
instance of ``make demo`` is never touched. Set ``VERL_OPERATOR_TEST_CLUSTER=<name>`` to run the tests
against a named instance that is started if needed and left running (fast iteration).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from verl_devtools.devcluster import DevCluster, binaries, load_profile
from verl_devtools.devcluster.kueue import ensure_kueue
from verl_devtools.devcluster.layout import COMPONENTS
from verl_devtools.devcluster.ports import listening
from verl_devtools.devcluster.process import alive
from verl_devtools.devcluster.versions import cache_dir

#: The profile the session's cluster starts with: DGX H100, L40S, bridged A100 PCIe and CPU-only nodes.
SESSION_PROFILE = "mixed"

Kubectl = Callable[..., "subprocess.CompletedProcess[str]"]


def _is_cluster_test(item: pytest.Item) -> bool:
    return Path(__file__).parent in Path(str(item.fspath)).parents


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _is_cluster_test(item):
            item.add_marker(pytest.mark.cluster)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """Find or build the control-plane binaries before the first test, outside any test's timeout.

    Only when tests run: ``pytest --collect-only`` builds and installs nothing.

    A cold build takes minutes (see docs/devcluster.md); its progress is shown, not captured.
    """
    if session.config.option.collectonly or not any(_is_cluster_test(item) for item in session.items):
        return
    capture = session.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        binaries.ensure((*COMPONENTS, "kubectl", "helm"))
        if any(Path(str(item.fspath)).name == "test_kueue.py" for item in session.items):
            ensure_kueue()  # Kueue's manager and manifests (cached after the first build)


def _remove_stale_test_instances() -> None:
    """Tear down ``pytest-<pid>[-...]`` instances whose pytest process is gone (a killed earlier session)."""
    for state in (cache_dir() / "devclusters").glob("pytest-*/state.json"):
        pid = state.parent.name.removeprefix("pytest-").split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not alive(int(pid)):
            DevCluster(name=state.parent.name, progress=lambda _msg: None).down()


@pytest.fixture(scope="session")
def devcluster() -> Iterator[DevCluster]:
    """The session's running control plane (profile ``mixed``)."""
    reuse = os.environ.get("VERL_OPERATOR_TEST_CLUSTER")
    if not reuse:
        _remove_stale_test_instances()
    cluster = DevCluster(name=reuse or f"pytest-{os.getpid()}", profile=SESSION_PROFILE)
    try:
        cluster.up()
        yield cluster
    finally:
        if not reuse:
            pids, ports = cluster.pids(), cluster.ports()
            cluster.down()
            left = [f"pid {pid}" for pid in pids.values() if alive(pid)] + [
                f"port {port}" for port in listening(ports.values())
            ]
            assert not left, f"devcluster down left {', '.join(left)} behind"


@pytest.fixture(scope="session")
def kube(devcluster: DevCluster) -> Iterator[client.ApiClient]:
    """A Kubernetes API client (admin) of the session's cluster."""
    with devcluster.api_client() as api:
        yield api


@pytest.fixture(scope="session")
def kubectl(devcluster: DevCluster) -> Kubectl:
    """Run the pinned kubectl against the session's cluster: ``kubectl(["get", "nodes"], input=None)``.

    Returns a ``CompletedProcess`` with text stdout/stderr; pass ``check=True`` to raise on failure.
    """
    exe = str(binaries.ensure(("kubectl",))["kubectl"])

    def run(
        argv: list[str], *, input: str | None = None, check: bool = False, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [exe, f"--kubeconfig={devcluster.kubeconfig}", *argv],
            input=input,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    return run


@pytest.fixture
def namespace(kube: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards.

    Its pods are deleted first and waited for (they hold the simulated GPUs the next test may need);
    the rest of the namespace goes in the background.
    """
    base = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    name = f"t-{base}-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(kube)
    core.create_namespace({"metadata": {"name": name, "labels": {"verl-operator.io/test": "true"}}})
    try:
        yield name
    finally:
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        deadline = time.monotonic() + 30
        while core.list_namespaced_pod(name).items and time.monotonic() < deadline:
            time.sleep(0.2)
        core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def cluster_profile(devcluster: DevCluster) -> Iterator[Callable[[str], list[str]]]:
    """Add a profile's nodes for one test: ``cluster_profile("dgx-h100") -> node names``; removed after.

    Node names are unique per profile (``dgx-h100-0``, ``l40s-0``, ...), so profiles stack.
    """
    applied: list[str] = []

    def apply(name: str) -> list[str]:
        names = devcluster.apply_profile(name)
        applied.append(load_profile(name).name)
        return names

    yield apply
    for profile_name in reversed(applied):
        devcluster.remove_profile(profile_name)


@pytest.fixture(scope="module")
def dgx(devcluster: DevCluster) -> Iterator[None]:
    """The DGX H100 profile's nodes (4 x 8 GPUs) for one module, and the CRD."""
    from verl_devtools.devcluster.localrun import install_crd

    install_crd(devcluster.kubeconfig)
    devcluster.apply_profile("dgx-h100")
    yield
    devcluster.remove_profile("dgx-h100")
