"""``DevCluster``: a real local control plane (etcd, kube-apiserver, controller-manager, scheduler) with
kwok-simulated GPU nodes, on loopback ports of its own, managed by pid.

Several instances run side by side: each has a name, a directory (``<cache>/devclusters/<name>``) and ports
picked at its first start and kept in its state file. The class is the instance's lifecycle; the state file
is :mod:`~verl_devtools.devcluster.instancestate`, the control plane's processes
:mod:`~verl_devtools.devcluster.controlplane` and the real nodes :mod:`~verl_devtools.devcluster.realnodes`.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client

from verl_devtools.devcluster import binaries, health, hostchanges, kueue, nodes, realnodes
from verl_devtools.devcluster.controlplane import (
    admin_client,
    running_components,
    start_control_plane,
    stop_control_plane,
    wait_healthy,
)
from verl_devtools.devcluster.errors import DevClusterError
from verl_devtools.devcluster.instancestate import (
    choose_ports,
    plan_instance_network,
    ports_of_other_instances,
    read_state,
    saved_network,
    write_state,
)
from verl_devtools.devcluster.layout import COMPONENTS, Layout, apiserver_url
from verl_devtools.devcluster.locking import file_lock
from verl_devtools.devcluster.nodenet import NodeNetwork
from verl_devtools.devcluster.ports import ADDRESS_IN_USE, PORT_NAMES, pick_free_ports
from verl_devtools.devcluster.profiles import DEFAULT_PROFILE, load_profile
from verl_devtools.devcluster.status import ComponentStatus, DevClusterStatus
from verl_devtools.devcluster.versions import cache_dir
from verl_operator.clusters.profile import Profile

__all__ = ["START_TIMEOUT", "DevCluster", "DevClusterError"]

#: Starts of the control plane on new ports after one lost a port to another program between pick and bind.
PORT_ATTEMPTS = 3

#: Seconds to wait for each component to become healthy (cold start of the API server takes ~10 s).
START_TIMEOUT = 120.0

_INSTANCE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class DevCluster:
    """One local control plane instance.

    Example::

        cluster = DevCluster(name="demo", profile="dgx-h100")
        cluster.up()                 # idempotent
        print(cluster.kubeconfig)    # admin kubeconfig
        cluster.apply_profile("l40s")
        cluster.down()               # stops every process, removes the instance directory

    With ``real_nodes=N`` (N >= 2), ``up()`` also starts N real kubelet nodes (containerd, kubelet,
    kube-proxy, cluster DNS) that run real containers; ``down()`` undoes every host change they made.
    """

    def __init__(
        self,
        name: str = "default",
        profile: str = DEFAULT_PROFILE,
        base_dir: Path | None = None,
        progress: binaries.Progress | None = None,
        real_nodes: int = 0,
        real_node_gpus: int = 2,
    ) -> None:
        """Describe an instance (nothing is started).

        Args:
            name: Instance name (a DNS label); instances with different names are independent.
            profile: The profile ``up()`` applies: a name from ``examples/clusters`` or a YAML path.
            base_dir: The instance directory (default ``<cache>/devclusters/<name>``).
            progress: Receives progress lines (default: stderr).
            real_nodes: Real kubelet nodes to run beside the kwok nodes (0, or at least 2).
            real_node_gpus: ``nvidia.com/gpu`` capacity each real node advertises.
        """
        if not _INSTANCE_NAME.match(name):
            raise DevClusterError(f"instance name {name!r} must be lowercase letters, digits and '-'")
        if real_nodes == 1 or real_nodes < 0:
            raise DevClusterError(
                f"real_nodes is {real_nodes}: use 0 or at least 2 (a head and a worker node)"
            )
        if not 1 <= real_node_gpus <= 8:
            raise DevClusterError(f"real_node_gpus is {real_node_gpus}: use 1 to 8 GPUs per node")
        self.real_nodes = real_nodes
        self.real_node_gpus = real_node_gpus
        self.name = name
        self.profile = profile
        self.layout = Layout(base_dir or cache_dir() / "devclusters" / name)
        self._say = progress or (
            lambda message: print(f"[devcluster {name}] {message}", file=sys.stderr, flush=True)
        )

    # -- files -------------------------------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (exists once ``up()`` ran)."""
        return self.layout.kubeconfig

    def _state(self) -> dict[str, Any]:
        return read_state(self.layout)

    def _save_state(self, state: dict[str, Any]) -> None:
        write_state(self.layout, state)

    # -- lifecycle ---------------------------------------------------------------------------------------

    def network(self) -> NodeNetwork | None:
        """The real-node network of the instance (None without real nodes)."""
        return saved_network(self._state())

    @property
    def api_host(self) -> str:
        """The address the API server listens on: 127.0.0.1, or the real-node bridge's address."""
        network = self.network()
        return network.api_ip if network else "127.0.0.1"

    def running_components(self) -> dict[str, bool]:
        """Whether each component's saved pid still runs its binary."""
        return running_components(self._state())

    def is_running(self) -> bool:
        """Every component runs and the API server answers ``/readyz``."""
        state = self._state()
        return all(self.running_components().values()) and health.apiserver_ready(
            state.get("ports", {}), self.layout.pki, self.api_host
        )

    def up(self, profile: str | None = None, timeout: float = START_TIMEOUT) -> DevCluster:
        """Start the instance (building binaries first if needed) and apply its profile.

        Idempotent: when every process already runs, only the profile's nodes are (re)applied. A partly
        running instance (one process died) is stopped and started again on its existing data.

        Args:
            profile: Overrides the profile given to the constructor.
            timeout: Seconds to wait for each component.

        Returns:
            ``self``.

        Raises:
            DevClusterError: A component exited or did not become healthy (with its log's tail).
            ProfileError: The profile is unknown or invalid (checked before anything starts).
        """
        loaded = load_profile(profile or self.profile)
        with self._instance_lock():
            if all(self.running_components().values()):
                # Already running: wait for the API (it may be busy) rather than restarting anything.
                pid = self.pids()["kube-apiserver"]
                wait_healthy(self.layout, "kube-apiserver", pid, self.ports(), self.api_host, timeout)
                self._say(f"already running ({apiserver_url(self.ports(), self.api_host)})")
            else:
                self._start(timeout)
            self.apply_profile(loaded)
            if self.network() is not None:
                self._start_real_nodes(loaded)
        return self

    def _start_real_nodes(self, profile: Profile) -> None:
        network = self.network()
        assert network is not None  # planned by _start
        state = self._state()
        with self.api_client() as api:
            realnodes.start(
                layout=self.layout,
                name=self.name,
                network=network,
                count=len(network.node_ips),
                gpus=self.real_node_gpus,
                profile=profile,
                ports=state["ports"],
                state=state,
                save=lambda: self._save_state(state),
                api=api,
                say=self._say,
            )

    def _lock_path(self) -> Path:
        return self.layout.base.parent / f".{self.name}.lock"

    @contextlib.contextmanager
    def _instance_lock(self) -> Iterator[None]:
        """Serialise ``up``/``down`` of this instance across processes (a lock file beside its directory)."""
        with file_lock(self._lock_path()):
            yield

    def _start(self, timeout: float) -> None:
        """Start the control plane on the instance's data (stopping what is left of a partial run first)."""
        if any(self.running_components().values()):
            self._say("partly running: stopping what is left before starting again")
            self._stop_processes()
        paths = binaries.ensure(COMPONENTS, progress=self._say)
        state = self._state()
        network = plan_instance_network(self.layout, self.name, self.real_nodes, state)
        if network is not None:
            realnodes.ensure_host_packages(self._say)
            realnodes.claim(self.layout, self.name)
        ports = choose_ports(state, self.layout, self.name, self._say)
        state.update({"name": self.name, "ports": ports, "processes": {}})
        self._save_state(state)
        if network is not None:
            realnodes.create_network(network, state)
            self._save_state(state)
        # The ports are picked free and bound by each component when it starts: another program can take one
        # in between. The component then exits on its failed bind ("address already in use"); the lost race
        # is run again on new ports (every component started by then was stopped), any other failure raised.
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                start_control_plane(
                    layout=self.layout,
                    name=self.name,
                    paths=paths,
                    ports=ports,
                    network=network,
                    state=state,
                    save=lambda: self._save_state(state),
                    timeout=timeout,
                    say=self._say,
                )
                return
            except DevClusterError as exc:
                if ADDRESS_IN_USE not in str(exc).lower() or attempt == PORT_ATTEMPTS:
                    raise
                self._say(f"{str(exc).splitlines()[0]}: a port was taken before it was bound, new ports")
            ports = pick_free_ports(
                PORT_NAMES, avoid=ports_of_other_instances(self.layout.base.parent, self.name)
            )
            state.update({"ports": ports, "processes": {}})
            self._save_state(state)

    def _stop_processes(self) -> None:
        state = self._state()
        stop_control_plane(self.layout, state, lambda: self._save_state(state))

    def down(self) -> None:
        """Stop every process of the instance (by pid, waiting for each) and remove its directory."""
        with self._instance_lock():
            problems = self._stop_real_nodes()
            kueue.stop_kueue(self.layout)  # `up --scheduler kueue`: before the API server it talks to
            self._stop_processes()
            if problems:
                self._say("could not undo: " + "; ".join(problems))
            if self.layout.base.exists():
                hostchanges.unmount_below(self.layout.base)
                shutil.rmtree(self.layout.base)
            # Nothing of the instance is left, not even its lock file (removed while still held).
            self._lock_path().unlink(missing_ok=True)
        self._say("stopped and removed")

    def import_image(self, archive: Path) -> None:
        """Import an OCI image archive into every real node's containerd (``imagePullPolicy: Never`` works).

        Raises:
            DevClusterError: The instance runs no real nodes.
        """
        sockets = realnodes.containerd_sockets(self.layout, self._state())
        if not sockets:
            raise DevClusterError(f"devcluster {self.name!r} runs no real nodes: start it with --real-nodes")
        for socket in sockets:
            realnodes.import_image(socket, archive)

    def _stop_real_nodes(self) -> list[str]:
        state = self._state()
        if not (state.get("node_processes") or state.get("host")):
            if self.network() is not None:
                realnodes.release(self.layout)
            return []
        api = None
        if self.is_running():
            api = self.api_client()
        try:
            return realnodes.stop(self.layout, state, api, lambda: self._save_state(state), self._say)
        finally:
            if api is not None:
                api.close()  # type: ignore[no-untyped-call]

    # -- clients and nodes -------------------------------------------------------------------------------

    def api_client(self) -> client.ApiClient:
        """A Kubernetes API client authenticated as the admin (``system:masters``)."""
        return admin_client(self.layout, self.name)

    def _record_profile(self, profile_name: str, present: bool) -> None:
        state = self._state()
        applied = [p for p in state.get("profiles", []) if p != profile_name]
        if present:
            applied.append(profile_name)
        state["profiles"] = applied
        self._save_state(state)

    def apply_profile(self, profile: str | Profile, timeout: float = 60.0) -> list[str]:
        """Add (or refresh) a profile's nodes in the running cluster and wait until they are Ready.

        Args:
            profile: A profile name, a YAML path, or a loaded :class:`Profile`.
            timeout: Seconds to wait for kwok to report the nodes Ready.

        Returns:
            The node names.
        """
        loaded = profile if isinstance(profile, Profile) else load_profile(profile)
        with self.api_client() as api:
            names = nodes.apply_nodes(api, loaded)
            nodes.wait_nodes_ready(api, names, timeout)
        self._record_profile(loaded.name, present=True)
        self._say(f"profile {loaded.name}: {len(names)} nodes, {loaded.gpu_count} GPUs Ready")
        return names

    def remove_profile(self, profile: str, timeout: float = 60.0) -> list[str]:
        """Delete the nodes a profile created (pods bound to them are garbage-collected).

        Args:
            profile: The profile name (as in its ``name`` field).
            timeout: Seconds to wait for the nodes to disappear.

        Returns:
            The deleted node names.
        """
        with self.api_client() as api:
            names = nodes.remove_nodes(api, profile)
            nodes.wait_nodes_gone(api, names, timeout)
        self._record_profile(profile, present=False)
        return names

    def status(self, with_nodes: bool = True) -> DevClusterStatus:
        """The state of every component and, when the API answers, the nodes."""
        state = self._state()
        running = self.running_components()
        components = tuple(
            ComponentStatus(
                name=c,
                pid=state.get("processes", {}).get(c, {}).get("pid"),
                running=running[c],
                log=self.layout.log(c),
            )
            for c in COMPONENTS
        )
        up = all(running.values()) and health.apiserver_ready(
            state.get("ports", {}), self.layout.pki, self.api_host
        )
        rows: tuple[nodes.NodeRow, ...] = ()
        if up and with_nodes:
            with self.api_client() as api:
                rows = tuple(nodes.node_rows(api))
        return DevClusterStatus(
            name=self.name,
            directory=self.layout.base,
            running=up,
            server=apiserver_url(state["ports"], self.api_host) if "ports" in state else None,
            kubeconfig=self.layout.kubeconfig if self.layout.kubeconfig.is_file() else None,
            profiles=tuple(state.get("profiles", [])),
            components=components,
            nodes=rows,
        )

    def ports(self) -> dict[str, int]:
        """The instance's ports (empty before the first ``up()``)."""
        saved: dict[str, int] = self._state().get("ports", {})
        return dict(saved)

    def pids(self) -> dict[str, int]:
        """The pid of each started component."""
        return {c: int(e["pid"]) for c, e in self._state().get("processes", {}).items()}
