"""Fixtures of the node tier: the devcluster with two real kubelet nodes (containerd, runc, CNI bridge,
kube-proxy, CoreDNS) beside its kwok nodes, the operator installed by its Helm chart as a pod, and a test
image with Python and Ray but no part of this project.

The session's instance is ``pytest-node-<pid>``; it is removed at the end and the host must then be as it
was (links, iptables rules, nf_tables tables, sysctls, cgroups, mounts, host paths, processes). Set
``VERL_OPERATOR_TEST_NODE_CLUSTER=<name>`` to reuse a running instance started with
``verl-operator-dev devcluster up --name <name> --real-nodes 2`` (left running). Real nodes need root.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from cluster.polling import wait_for
from node import hostsnapshot
from node.verl_cpu import HostVerl
from verl_devtools.devcluster import DevCluster, binaries, imagebuild, oci, process, projectimages, realnodes
from verl_devtools.devcluster.layout import COMPONENTS
from verl_devtools.devcluster.nodeconfig import REAL_NODE_LABEL, REAL_NODE_TAINT
from verl_devtools.devcluster.versions import cache_dir
from verl_operator.policy import DEFAULT_VOLUME_TYPES

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "verl-operator"
STANDIN = Path(__file__).parent / "standin"
#: The kwok nodes beside the real ones.
SESSION_PROFILE = "dgx-h100"
REAL_NODES = 2
GPUS_PER_REAL_NODE = 2
#: Where the chart installs the operator.
OPERATOR_NAMESPACE = "verl-operator-system"
RELEASE = "verl-operator"
#: The test image's virtualenv (Debian's Python 3.11 with Ray; no verl-launcher in it).
TEST_VENV = "/opt/venv"
#: How long the session waits for another instance's real nodes to go (one instance at a time per machine).
OWNER_WAIT_SECONDS = 1200.0

Run = Callable[..., "subprocess.CompletedProcess[str]"]

#: The admission policy's volume types in this cluster: the defaults and hostPath, which the real-verl job
#: uses to mount the host's cached verl environment read-only (``verl_cpu.py``).
ALLOWED_VOLUME_TYPES = (*DEFAULT_VOLUME_TYPES, "hostPath")
#: The tests that run verl's real trainer (they need the real-verl environment, built before the first test).
VERL_CPU_TESTS = Path(__file__).parent / "test_verl_cpu.py"

#: Pods on the real nodes must tolerate the taint that keeps everything else off them.
REAL_NODE_TOLERATION = {"key": REAL_NODE_TAINT["key"], "operator": "Exists"}


def _is_node_test(item: pytest.Item) -> bool:
    return Path(__file__).parent in Path(str(item.fspath)).parents


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _is_node_test(item):
            item.add_marker(pytest.mark.node)


def python_ray_recipe() -> imagebuild.Recipe:
    """Debian's Python with ``ray[default]`` (the host's Ray version), the stand-in verl and nvidia-smi."""
    ray_version = metadata.version("ray")
    site = f"{TEST_VENV}/lib/python3.11/site-packages"
    files = {
        f"{site}/{path.relative_to(STANDIN).as_posix()}": path.read_bytes()
        for path in sorted((STANDIN / "verl").rglob("*.py"))
    }
    files["/usr/local/bin/nvidia-smi"] = (STANDIN / "nvidia-smi").read_bytes()
    return imagebuild.Recipe(
        name="node-test-python-ray",
        reference=f"localhost/verl-operator-test/python-ray:{ray_version}",
        requirements=(f"ray[default]=={ray_version}",),
        files=files,
        config=oci.ImageConfig(
            env=(
                f"PATH={TEST_VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME=/tmp",
                "PYTHONUNBUFFERED=1",
            ),
        ),
        venv=TEST_VENV,
    )


def python_ray_launcher_recipe() -> imagebuild.Recipe:
    """The test image with this project installed too (``verl-launcher`` on PATH): the probe's image."""
    base = python_ray_recipe()
    return dataclasses.replace(
        base,
        name="node-test-python-ray-launcher",
        reference=base.reference.replace("/python-ray:", "/python-ray-launcher:"),
        requirements=(*base.requirements, str(ROOT)),
        sources=(
            ROOT / "pyproject.toml",
            ROOT / "operator" / "verl_operator",
            ROOT / "launcher" / "verl_launcher",
            ROOT / "launcher" / "verl_contract",
        ),
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """Find or build the binaries and images before the first test, outside any test's timeout.

    Only when tests run: ``pytest --collect-only`` installs and builds nothing.

    Cold: the kubelet, kube-proxy and CoreDNS builds, a Debian base from packages and two images (minutes,
    see docs/devcluster.md), and the real-verl environment when its tests run and its tier has not built it
    (docs/realverl.md); warm: file lookups.
    """
    if session.config.option.collectonly or os.geteuid() != 0:
        return
    if not any(_is_node_test(item) for item in session.items):
        return
    capture = session.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        realnodes.ensure_host_packages(lambda m: print(f"[node tier] {m}", flush=True))
        binaries.ensure((*COMPONENTS, "kubectl", "helm", "kubelet", "kube-proxy", "coredns"))
        projectimages.pause_image()
        projectimages.build_operator_image()
        imagebuild.build(python_ray_recipe())
        imagebuild.build(python_ray_launcher_recipe())
        if any(Path(str(item.fspath)) == VERL_CPU_TESTS for item in session.items):
            HostVerl.ensure()  # cold: the real-verl environment (minutes of downloads), unless its tier built it


def _remove_stale_instances() -> None:
    """Tear down ``pytest-node-<pid>`` instances whose pytest process is gone (a killed earlier session)."""
    for state in (cache_dir() / "devclusters").glob("pytest-node-*/state.json"):
        pid = state.parent.name.removeprefix("pytest-node-")
        if pid.isdigit() and int(pid) != os.getpid() and not process.alive(int(pid)):
            DevCluster(name=state.parent.name, progress=lambda _msg: None).down()


def _wait_for_other_real_nodes() -> None:
    deadline = time.monotonic() + OWNER_WAIT_SECONDS
    while True:
        current = realnodes.owner()
        if current is None or not Path(current["directory"]).is_dir():
            return
        if time.monotonic() > deadline:
            pytest.fail(
                f"devcluster {current.get('name')!r} kept its real nodes for {OWNER_WAIT_SECONDS:.0f}s"
            )
        time.sleep(5)


@pytest.fixture(scope="session")
def realcluster() -> Iterator[DevCluster]:
    """The session's devcluster with two real nodes; the host is checked to be unchanged after ``down``."""
    if os.geteuid() != 0:
        pytest.skip("real kubelet nodes need root (containerd, network links, cgroups)")
    reuse = os.environ.get("VERL_OPERATOR_TEST_NODE_CLUSTER")
    cluster = DevCluster(
        name=reuse or f"pytest-node-{os.getpid()}",
        profile=SESSION_PROFILE,
        real_nodes=REAL_NODES,
        real_node_gpus=GPUS_PER_REAL_NODE,
    )
    if reuse:
        yield cluster.up()
        return
    _remove_stale_instances()
    _wait_for_other_real_nodes()
    before = hostsnapshot.take(cluster.layout.base)
    try:
        cluster.up()
        yield cluster
    finally:
        pids = {**cluster.pids(), **hostsnapshot.node_pids(cluster)}
        cluster.down()
        alone = realnodes.owner() is None
        after = hostsnapshot.take(cluster.layout.base)
        # Another instance may take the real-node slot the moment this one released it: then only what
        # belongs to this instance is compared.
        alone = alone and realnodes.owner() is None
        left = hostsnapshot.differences(before, after, shared=alone) + [
            f"pid {pid} ({name})" for name, pid in pids.items() if hostsnapshot.alive(pid)
        ]
        assert not left, "devcluster down left host changes behind:\n" + "\n".join(left)


@pytest.fixture(scope="session")
def kube(realcluster: DevCluster) -> Iterator[client.ApiClient]:
    with realcluster.api_client() as api:
        yield api


def _runner(exe: Path, kubeconfig: Path) -> Run:
    def run(
        argv: list[str], *, input: str | None = None, check: bool = False, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(exe), f"--kubeconfig={kubeconfig}", *argv],
            input=input,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{exe.name} {' '.join(argv)} failed ({done.returncode}):\n{done.stderr}")
        return done

    return run


@pytest.fixture(scope="session")
def kubectl(realcluster: DevCluster) -> Run:
    return _runner(binaries.ensure(("kubectl",))["kubectl"], realcluster.kubeconfig)


@pytest.fixture(scope="session")
def kubectl_command(realcluster: DevCluster) -> list[str]:
    """The kubectl argv prefix (binary and kubeconfig), for commands that stream (``logs -f``)."""
    return [str(binaries.ensure(("kubectl",))["kubectl"]), f"--kubeconfig={realcluster.kubeconfig}"]


@pytest.fixture(scope="session")
def helm(realcluster: DevCluster) -> Run:
    return _runner(binaries.ensure(("helm",))["helm"], realcluster.kubeconfig)


@pytest.fixture(scope="session")
def test_image(realcluster: DevCluster) -> str:
    """The test image (Python + Ray, no launcher), imported into every real node's containerd."""
    recipe = python_ray_recipe()
    realcluster.import_image(imagebuild.build(recipe))
    return recipe.reference


@pytest.fixture(scope="session")
def launcher_test_image(realcluster: DevCluster) -> str:
    """The test image with ``verl-launcher`` installed, imported into every real node's containerd."""
    recipe = python_ray_launcher_recipe()
    realcluster.import_image(imagebuild.build(recipe))
    return recipe.reference


def chart_install_argv() -> list[str]:
    """``helm install`` of the chart on the real nodes, hostPath volumes allowed (``ALLOWED_VOLUME_TYPES``)."""
    return [
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        OPERATOR_NAMESPACE,
        "--create-namespace",
        "--set-string",
        f"nodeSelector.{REAL_NODE_LABEL.replace('.', chr(92) + '.')}=true",
        "--set",
        f"tolerations[0].key={REAL_NODE_TAINT['key']}",
        "--set",
        "tolerations[0].operator=Exists",
        "--set",
        "policy.allowedVolumeTypes={" + ",".join(ALLOWED_VOLUME_TYPES) + "}",
        "--wait",
        "--timeout=180s",
    ]


@pytest.fixture(scope="session")
def host_verl() -> HostVerl:
    """The real-verl environment, its base interpreter, the assets and the CPU shim, mounted by the pods."""
    return HostVerl.ensure()


@pytest.fixture(scope="session")
def operator_release(realcluster: DevCluster, helm: Run, kube: client.ApiClient) -> Iterator[dict[str, Any]]:
    """``helm install`` of the chart with its defaults (the locally built operator image, two replicas with
    leader election) on the real nodes; the admission policy allows hostPath volumes too.

    Returns the release's namespace, name and the operator pod: the replica that holds the leader Lease, once
    both replicas are Ready.
    """
    helm(chart_install_argv(), check=True, timeout=240)
    core = client.CoreV1Api(kube)

    def ready_pod() -> Any:
        pods = core.list_namespaced_pod(
            OPERATOR_NAMESPACE, label_selector=f"app.kubernetes.io/instance={RELEASE}"
        ).items
        ready = [
            p
            for p in pods
            if p.metadata.deletion_timestamp is None
            and any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
        ]
        if len(ready) != 2:  # the chart's replicaCount
            return None
        try:
            lease: Any = client.CoordinationV1Api(kube).read_namespaced_lease(RELEASE, OPERATOR_NAMESPACE)
        except client.exceptions.ApiException:
            return None
        holder = str(lease.spec.holder_identity or "")
        return next((p for p in ready if holder.startswith(f"{p.metadata.name}_")), None)

    pod = wait_for(ready_pod, "both operator replicas Ready and one holding the Lease", timeout=120)
    try:
        yield {"namespace": OPERATOR_NAMESPACE, "release": RELEASE, "pod": pod}
    finally:
        helm(
            ["uninstall", RELEASE, "--namespace", OPERATOR_NAMESPACE, "--wait", "--timeout=120s"], timeout=180
        )


@pytest.fixture
def namespace(kube: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test; its VerlJobs and pods are deleted and waited for afterwards."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    name = f"n-{base}-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(kube)
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        custom = client.CustomObjectsApi(kube)
        custom.delete_collection_namespaced_custom_object("verl-operator.io", "v1alpha1", name, "verljobs")
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        deadline = time.monotonic() + 60
        while core.list_namespaced_pod(name).items and time.monotonic() < deadline:
            time.sleep(0.5)
        core.delete_namespace(name, propagation_policy="Background")
