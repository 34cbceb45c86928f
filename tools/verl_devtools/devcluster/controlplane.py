"""The control plane's processes (etcd, kube-apiserver, controller-manager, scheduler, kwok), by pid.

``start_control_plane`` writes the instance's certificates and kubeconfigs, starts each component in the
order of :data:`~verl_devtools.devcluster.layout.COMPONENTS` and waits until it is healthy, then until the
controller-manager created the ``default`` ServiceAccount; on any failure it stops what it started.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from verl_devtools.devcluster import health, instance_files, process
from verl_devtools.devcluster.errors import DevClusterError
from verl_devtools.devcluster.instancestate import read_state
from verl_devtools.devcluster.layout import COMPONENTS, Layout, apiserver_url, component_argv
from verl_devtools.devcluster.nodenet import NodeNetwork


def running_components(state: dict[str, Any]) -> dict[str, bool]:
    """Whether each component's saved pid still runs its binary."""
    out = {}
    for component in COMPONENTS:
        entry = state.get("processes", {}).get(component)
        out[component] = bool(entry) and process.alive(int(entry["pid"]), entry.get("started"))
    return out


def start_control_plane(
    *,
    layout: Layout,
    name: str,
    paths: dict[str, Path],
    ports: dict[str, int],
    network: NodeNetwork | None,
    state: dict[str, Any],
    save: Callable[[], None],
    timeout: float,
    say: Callable[[str], None],
) -> None:
    """Write the instance's files, start every component and wait until each is healthy.

    Raises:
        DevClusterError: A component exited or did not become healthy (with its log's tail); every
            component started by then is stopped again.
    """
    host = network.api_ip if network else "127.0.0.1"
    _write_files(layout, name, ports, network, host)
    started = time.monotonic()
    try:
        for component in COMPONENTS:
            argv = component_argv(component, paths[component], layout, ports, name, network)
            pid = process.start(argv, layout.log(component), layout.base)
            state["processes"][component] = {
                "pid": pid,
                "executable": argv[0],
                "started": process.start_time(pid),
            }
            save()
            wait_healthy(layout, component, pid, ports, host, timeout)
        _wait_default_service_account(layout, name, timeout)
    except BaseException:
        stop_control_plane(layout, state, save)
        raise
    say(f"control plane ready in {time.monotonic() - started:.1f}s at {apiserver_url(ports, host)}")


def _write_files(
    layout: Layout, name: str, ports: dict[str, int], network: NodeNetwork | None, host: str
) -> None:
    """The log and etcd directories, the PKI (with the bridge's names for real nodes), kubeconfigs, kwok's."""
    for directory in (layout.logs, layout.etcd_data):
        directory.mkdir(parents=True, exist_ok=True)
    layout.etcd_data.chmod(0o700)
    if network is None:
        instance_files.write_pki(layout, name)
    else:
        instance_files.write_pki(layout, name, (network.kubernetes_service_ip, network.api_ip))
    instance_files.write_kubeconfigs(layout, name, ports, host)
    instance_files.write_kwok_config(layout)


def component_failure(layout: Layout, component: str, why: str) -> DevClusterError:
    """The error for a failed component, with its log's last lines."""
    log = layout.log(component)
    tail = process.log_tail(log, 25)
    return DevClusterError(f"{component} {why}; last lines of {log}:\n{tail}")


def wait_healthy(
    layout: Layout, component: str, pid: int, ports: dict[str, int], host: str, timeout: float
) -> None:
    """Poll the component's health endpoint until it answers.

    Raises:
        DevClusterError: It exited, or was not healthy within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.alive(pid):
            raise component_failure(layout, component, "exited during start")
        if health.component_healthy(component, ports, layout.pki, host):
            return
        time.sleep(0.2)
    raise component_failure(layout, component, f"did not become healthy within {timeout:.0f}s")


def _wait_default_service_account(layout: Layout, name: str, timeout: float) -> None:
    """Wait until the controller-manager created the ``default`` ServiceAccount (pods need it)."""
    deadline = time.monotonic() + timeout
    with admin_client(layout, name) as api:
        core = client.CoreV1Api(api)
        while time.monotonic() < deadline:
            try:
                core.read_namespaced_service_account("default", "default")
                return
            except ApiException as exc:
                if exc.status != 404:
                    raise
            if not running_components(read_state(layout))["kube-controller-manager"]:
                raise component_failure(layout, "kube-controller-manager", "exited")
            time.sleep(0.2)
    raise component_failure(
        layout, "kube-controller-manager", "did not create the 'default' ServiceAccount in time"
    )


def stop_control_plane(layout: Layout, state: dict[str, Any], save: Callable[[], None]) -> None:
    """Stop every component in reverse start order (by pid, waiting for each) and forget their pids."""
    for component in reversed(COMPONENTS):
        entry = state.get("processes", {}).get(component)
        if entry:
            process.stop(int(entry["pid"]), entry.get("started"))
    if state:
        state["processes"] = {}
        save()


def admin_client(layout: Layout, name: str) -> client.ApiClient:
    """A Kubernetes API client authenticated as the admin (``system:masters``).

    Raises:
        DevClusterError: The instance has no kubeconfig yet.
    """
    if not layout.kubeconfig.is_file():
        raise DevClusterError(f"devcluster {name!r} has no kubeconfig: run `verl-operator-dev devcluster up`")
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(layout.kubeconfig)
    )
    return api
