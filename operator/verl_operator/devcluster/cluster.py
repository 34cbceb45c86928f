"""``DevCluster``: a real local control plane (etcd, kube-apiserver, controller-manager, scheduler) with
kwok-simulated GPU nodes, on loopback ports of its own, managed by pid.

Several instances run side by side: each has a name, a directory (``<cache>/devclusters/<name>``) and ports
picked at its first start and kept in its state file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from verl_operator.devcluster import binaries, certs, nodes, process
from verl_operator.devcluster.kubeconfig import write_kubeconfig
from verl_operator.devcluster.layout import COMPONENTS, Layout, apiserver_url, component_argv
from verl_operator.devcluster.ports import PORT_NAMES, pick_free_ports, port_is_free
from verl_operator.devcluster.profiles import DEFAULT_PROFILE, Profile, load_profile
from verl_operator.devcluster.versions import cache_dir

#: Seconds to wait for each component to become healthy (cold start of the API server takes ~10 s).
START_TIMEOUT = 120.0

#: The client identity (certificate CN and O) of each component and of the admin kubeconfig.
IDENTITIES: dict[str, tuple[str, str | None]] = {
    "admin": ("verl-operator-admin", "system:masters"),
    "kube-controller-manager": ("system:kube-controller-manager", None),
    "kube-scheduler": ("system:kube-scheduler", None),
    "kwok": ("kwok-controller", "system:masters"),
}

#: Written after every certificate and key of an instance was generated.
_PKI_COMPLETE = ".complete"

_HEALTH_PORT = {"kube-controller-manager": "controller_manager", "kube-scheduler": "scheduler"}


class DevClusterError(RuntimeError):
    """The devcluster could not be started or used (the message names the component and shows its log)."""


@dataclass(frozen=True)
class ComponentStatus:
    """A component's pid and whether it runs."""

    name: str
    pid: int | None
    running: bool
    log: Path


@dataclass(frozen=True)
class DevClusterStatus:
    """What ``status()`` reports."""

    name: str
    directory: Path
    running: bool
    server: str | None
    kubeconfig: Path | None
    profiles: tuple[str, ...]
    components: tuple[ComponentStatus, ...]
    nodes: tuple[nodes.NodeRow, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly dict."""
        return {
            "name": self.name,
            "directory": str(self.directory),
            "running": self.running,
            "server": self.server,
            "kubeconfig": str(self.kubeconfig) if self.kubeconfig else None,
            "profiles": list(self.profiles),
            "components": [
                {"name": c.name, "pid": c.pid, "running": c.running, "log": str(c.log)}
                for c in self.components
            ],
            "nodes": [n.as_dict() for n in self.nodes],
        }


class DevCluster:
    """One local control plane instance.

    Example::

        cluster = DevCluster(name="demo", profile="dgx-h100")
        cluster.up()                 # idempotent
        print(cluster.kubeconfig)    # admin kubeconfig
        cluster.apply_profile("l40s")
        cluster.down()               # stops every process, removes the instance directory
    """

    def __init__(
        self,
        name: str = "default",
        profile: str = DEFAULT_PROFILE,
        base_dir: Path | None = None,
        progress: binaries.Progress | None = None,
    ) -> None:
        """Describe an instance (nothing is started).

        Args:
            name: Instance name (a DNS label); instances with different names are independent.
            profile: The profile ``up()`` applies: a name from ``examples/clusters`` or a YAML path.
            base_dir: The instance directory (default ``<cache>/devclusters/<name>``).
            progress: Receives progress lines (default: stderr).
        """
        if not name or not name.replace("-", "").isalnum() or name != name.lower():
            raise DevClusterError(f"instance name {name!r} must be lowercase letters, digits and '-'")
        self.name = name
        self.profile = profile
        self.layout = Layout(base_dir or cache_dir() / "devclusters" / name)
        self._say = progress or (lambda message: print(f"[devcluster {name}] {message}", flush=True))

    # -- files -------------------------------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (exists once ``up()`` ran)."""
        return self.layout.kubeconfig

    def _state(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.layout.state_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return data

    def _save_state(self, state: dict[str, Any]) -> None:
        self.layout.base.mkdir(parents=True, exist_ok=True)
        tmp = self.layout.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.layout.state_file)

    def _ports(self, state: dict[str, Any]) -> dict[str, int]:
        saved: dict[str, int] = state.get("ports", {})
        if set(saved) >= set(PORT_NAMES):
            busy = [f"{k}={p}" for k, p in saved.items() if not port_is_free(p)]
            if not busy:
                return saved
            self._say(f"saved ports taken by other programs ({', '.join(busy)}): picking new ones")
        return pick_free_ports(
            PORT_NAMES, avoid=_ports_of_other_instances(self.layout.base.parent, self.name)
        )

    def _write_pki(self) -> None:
        pki = self.layout.pki
        if (pki / _PKI_COMPLETE).is_file():
            return
        pki.mkdir(parents=True, exist_ok=True)
        ca = certs.write_ca(pki, f"verl-devcluster-{self.name}-ca")
        certs.write_signed(
            ca,
            pki,
            "apiserver",
            "kube-apiserver",
            server_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            server_ips=("127.0.0.1", "10.96.0.1"),
        )
        for who, (cn, org) in IDENTITIES.items():
            certs.write_signed(ca, pki, who, cn, organization=org)
        certs.write_service_account_keys(pki)
        front_proxy = certs.write_ca(
            pki, f"verl-devcluster-{self.name}-front-proxy-ca", stem="front-proxy-ca"
        )
        certs.write_signed(front_proxy, pki, "front-proxy-client", "front-proxy-client")
        (pki / _PKI_COMPLETE).write_text("")

    def _write_kubeconfigs(self, ports: dict[str, int]) -> None:
        pki = self.layout.pki
        server = apiserver_url(ports)
        cluster_name = f"verl-devcluster-{self.name}"
        for who, (cn, _) in IDENTITIES.items():
            path = self.layout.kubeconfig if who == "admin" else self.layout.component_kubeconfig(who)
            pair = certs.CertPair(pki / f"{who}.crt", pki / f"{who}.key")
            write_kubeconfig(path, cluster_name, server, pki / "ca.crt", pair, cn)

    def _write_kwok_config(self) -> None:
        stages = resources.files("verl_operator.devcluster") / "stages"
        documents = [
            "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions:\n"
            "  enableCNI: false\n",
            (stages / "node.yaml").read_text(),
            (stages / "pod.yaml").read_text(),
        ]
        self.layout.kwok_config.write_text("\n---\n".join(documents))

    # -- lifecycle ---------------------------------------------------------------------------------------

    def running_components(self) -> dict[str, bool]:
        """Whether each component's saved pid still runs its binary."""
        state = self._state()
        out = {}
        for component in COMPONENTS:
            entry = state.get("processes", {}).get(component)
            out[component] = bool(entry) and process.alive(int(entry["pid"]), entry.get("started"))
        return out

    def is_running(self) -> bool:
        """Every component runs and the API server answers ``/readyz``."""
        state = self._state()
        return all(self.running_components().values()) and self._apiserver_ready(state.get("ports", {}))

    def up(self, profile: str | None = None, timeout: float = START_TIMEOUT) -> DevCluster:
        """Start the instance (building binaries first if needed) and apply its profile.

        Idempotent: when everything already runs, only the profile's nodes are (re)applied. A partly running
        instance is stopped and started again on its existing data.

        Args:
            profile: Overrides the profile given to the constructor.
            timeout: Seconds to wait for each component.

        Returns:
            ``self``.

        Raises:
            DevClusterError: A component exited or did not become healthy (with its log's tail).
            profiles.ProfileError: The profile is unknown or invalid (checked before anything starts).
        """
        loaded = load_profile(profile or self.profile)
        with self._instance_lock():
            if self.is_running():
                self._say(f"already running ({apiserver_url(self._state()['ports'])})")
            else:
                self._start(timeout)
            self.apply_profile(loaded)
        return self

    def _lock_path(self) -> Path:
        return self.layout.base.parent / f".{self.name}.lock"

    @contextlib.contextmanager
    def _instance_lock(self) -> Iterator[None]:
        """Serialise ``up``/``down`` of this instance across processes (a lock file beside its directory)."""
        lock = self._lock_path()
        lock.parent.mkdir(parents=True, exist_ok=True)
        with lock.open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _start(self, timeout: float) -> None:
        if any(self.running_components().values()):
            self._say("partly running: stopping what is left before starting again")
            self._stop_processes()
        paths = binaries.ensure(COMPONENTS, progress=self._say)
        state = self._state()
        ports = self._ports(state)
        state.update({"name": self.name, "ports": ports, "processes": {}})
        self._save_state(state)
        for directory in (self.layout.logs, self.layout.etcd_data):
            directory.mkdir(parents=True, exist_ok=True)
        self.layout.etcd_data.chmod(0o700)
        self._write_pki()
        self._write_kubeconfigs(ports)
        self._write_kwok_config()
        started = time.monotonic()
        try:
            for component in COMPONENTS:
                argv = component_argv(component, paths[component], self.layout, ports, self.name)
                pid = process.start(argv, self.layout.log(component), self.layout.base)
                state["processes"][component] = {
                    "pid": pid,
                    "executable": argv[0],
                    "started": process.start_time(pid),
                }
                self._save_state(state)
                self._wait_healthy(component, pid, ports, timeout)
            self._wait_default_service_account(timeout)
        except BaseException:
            self._stop_processes()
            raise
        self._say(f"control plane ready in {time.monotonic() - started:.1f}s at {apiserver_url(ports)}")

    def _fail(self, component: str, why: str) -> DevClusterError:
        log = self.layout.log(component)
        tail = process.log_tail(log, 25)
        return DevClusterError(f"{component} {why}; last lines of {log}:\n{tail}")

    def _wait_healthy(self, component: str, pid: int, ports: dict[str, int], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not process.alive(pid):
                raise self._fail(component, "exited during start")
            if self._healthy(component, ports):
                return
            time.sleep(0.2)
        raise self._fail(component, f"did not become healthy within {timeout:.0f}s")

    def _healthy(self, component: str, ports: dict[str, int]) -> bool:
        if component == "etcd":
            return _get(f"http://127.0.0.1:{ports['etcd_client']}/health", None) == 200
        if component == "kube-apiserver":
            return self._apiserver_ready(ports)
        if component in _HEALTH_PORT:
            # Their serving certificates are self-signed in memory; only loopback is contacted.
            insecure = ssl.create_default_context()
            insecure.check_hostname = False
            insecure.verify_mode = ssl.CERT_NONE
            return _get(f"https://127.0.0.1:{ports[_HEALTH_PORT[component]]}/healthz", insecure) == 200
        return _get(f"http://127.0.0.1:{ports['kwok']}/healthz", None) == 200

    def _apiserver_ready(self, ports: dict[str, int]) -> bool:
        if "apiserver" not in ports or not (self.layout.pki / "admin.crt").is_file():
            return False
        context = ssl.create_default_context(cafile=str(self.layout.pki / "ca.crt"))
        context.load_cert_chain(str(self.layout.pki / "admin.crt"), str(self.layout.pki / "admin.key"))
        return _get(f"{apiserver_url(ports)}/readyz", context) == 200

    def _wait_default_service_account(self, timeout: float) -> None:
        core = client.CoreV1Api(self.api_client())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                core.read_namespaced_service_account("default", "default")
                return
            except ApiException as exc:
                if exc.status != 404:
                    raise
            if not process.alive(self._state()["processes"]["kube-controller-manager"]["pid"]):
                raise self._fail("kube-controller-manager", "exited")
            time.sleep(0.2)
        raise self._fail("kube-controller-manager", "did not create the 'default' ServiceAccount in time")

    def _stop_processes(self) -> None:
        state = self._state()
        for component in reversed(COMPONENTS):
            entry = state.get("processes", {}).get(component)
            if entry:
                process.stop(int(entry["pid"]), entry.get("started"))
        if state:
            state["processes"] = {}
            self._save_state(state)

    def down(self) -> None:
        """Stop every process of the instance (by pid, waiting for each) and remove its directory."""
        with self._instance_lock():
            self._stop_processes()
            if self.layout.base.exists():
                shutil.rmtree(self.layout.base)
            # Nothing of the instance is left, not even its lock file (removed while still held).
            self._lock_path().unlink(missing_ok=True)
        self._say("stopped and removed")

    # -- clients and nodes -------------------------------------------------------------------------------

    def api_client(self) -> client.ApiClient:
        """A Kubernetes API client authenticated as the admin (``system:masters``)."""
        if not self.layout.kubeconfig.is_file():
            raise DevClusterError(
                f"devcluster {self.name!r} has no kubeconfig: run `verl-operator devcluster up`"
            )
        api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.layout.kubeconfig)
        )
        return api

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
        up = all(running.values()) and self._apiserver_ready(state.get("ports", {}))
        rows: tuple[nodes.NodeRow, ...] = ()
        if up and with_nodes:
            with self.api_client() as api:
                rows = tuple(nodes.node_rows(api))
        return DevClusterStatus(
            name=self.name,
            directory=self.layout.base,
            running=up,
            server=apiserver_url(state["ports"]) if "ports" in state else None,
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


def _get(url: str, context: ssl.SSLContext | None) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:  # loopback only
            status: int = response.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


def _ports_of_other_instances(devclusters_dir: Path, own: str) -> set[int]:
    taken: set[int] = set()
    for state_file in devclusters_dir.glob("*/state.json"):
        if state_file.parent.name == own:
            continue
        try:
            taken.update(int(p) for p in json.loads(state_file.read_text()).get("ports", {}).values())
        except (json.JSONDecodeError, OSError, ValueError):
            continue
    return taken
