"""Kueue's controller manager next to a devcluster: built from its Go module, run out of cluster.

``verl-operator-dev devcluster up --scheduler kueue`` and ``tests/cluster/test_kueue.py`` use it. The manager
binary is built like the other binaries (:mod:`verl_devtools.devcluster.gobuild`, cached under
``bin/kueue-<version>/`` with the completion marker). Its CRDs (``config/components/crd/bases``) and webhook
configurations (``config/components/webhook/manifests.yaml``) are copied from the same module source that
``go mod download`` fetched from the Go module proxy into ``bin/kueue-<version>/manifests/``; the webhooks are
rewritten at start (:func:`webhook_configurations`) to reach the local manager at
``https://127.0.0.1:<port>/...`` with the CA of a serving certificate made for it (:mod:`.certs`).

The manager runs with a :func:`configuration` of its own: Kueue's internal certificate management off (the
devcluster's certificate is in ``certDir``), the ``pod`` integration only, leader election off, every server
on a free loopback port, Kueue's on-demand visibility API server off. Its pid, ports and webhook
configurations are saved in the instance's state under ``kueue``; :func:`stop_kueue` (called by
``DevCluster.down``) stops it.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from verl_devtools.devcluster import binaries, certs, gobuild, process
from verl_devtools.devcluster.health import http_status
from verl_devtools.devcluster.instancestate import ports_of_other_instances, read_state, write_state
from verl_devtools.devcluster.kuberay import install_crds
from verl_devtools.devcluster.layout import Layout
from verl_devtools.devcluster.locking import file_lock
from verl_devtools.devcluster.ports import ADDRESS_IN_USE, PortTaken, pick_free_ports, serves_certificate
from verl_devtools.devcluster.tools import KUEUE, BinaryError, Progress, bin_dir
from verl_devtools.devcluster.versions import KUEUE_VERSION, cache_dir

#: The module the manager is built from (``cmd/kueue`` is its ``main``).
MODULE = "sigs.k8s.io/kueue"
#: Where the module's source keeps the CRDs and the webhook configurations (Kueue's kustomize bases).
CRD_DIR = "config/components/crd/bases"
WEBHOOK_MANIFESTS = "config/components/webhook/manifests.yaml"
#: The namespace Kueue names as its own (``Configuration.namespace``): never managed, created at start.
KUEUE_NAMESPACE = "kueue-system"
#: The scheduling gate Kueue's pod webhook puts on a pod of a queue until its workload is admitted.
ADMISSION_GATE = "kueue.x-k8s.io/admission"
#: API groups whose webhooks are installed: Kueue's own objects and pods (the ``pod`` integration).
#: The webhooks of the other integrations (Jobs, JobSets, Ray, Kubeflow, ...) are left out: their
#: integrations are off, and a webhook with ``failurePolicy: Fail`` for them would only add a way to fail.
WEBHOOK_GROUPS = frozenset({"", "kueue.x-k8s.io"})
#: Namespaces Kueue never manages (Kueue refuses a managedJobsNamespaceSelector that matches them).
UNMANAGED_NAMESPACES = ("kube-system", KUEUE_NAMESPACE)
#: Seconds to wait for the manager's ``/readyz``.
START_TIMEOUT = 120.0
#: Starts of the manager on new ports after one lost a port to another program between pick and bind.
PORT_ATTEMPTS = 3
#: The state file's key of the running manager.
STATE_KEY = "kueue"
#: Where Kueue v0.17's manager reads its metrics server's certificate when its internal certificate
#: management is off: a fixed path (``cmd/kueue/main.go``, ``metricsCertPath``), not configurable. A
#: self-signed pair is written there once (this needs root), marked as the devcluster's, and removed by
#: :func:`stop_kueue` when no other instance runs Kueue.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
METRICS_CERT_MARK = ".verl-operator-devcluster"


@dataclass(frozen=True)
class KueueBuild:
    """The manager binary, its CRD files and its webhook manifests, in the versioned cache."""

    binary: Path
    crds: tuple[Path, ...]
    webhooks: Path
    version: str = KUEUE_VERSION


def manifests_dir(root: Path | None = None) -> Path:
    """``bin/kueue-<version>/manifests`` under the cache root."""
    return bin_dir(KUEUE, root) / "manifests"


def _copy_manifests(target: Path) -> None:
    """Copy the CRDs and the webhook manifests from the module source (``go mod download``) into ``target``."""
    go = shutil.which("go")
    if go is None:
        raise BinaryError("the Go toolchain is needed to fetch Kueue's CRDs and is not on PATH")
    source = gobuild.module_download(go, MODULE, KUEUE_VERSION, {**os.environ}, "Dir")
    crds = sorted((source / CRD_DIR).glob("*.yaml"))
    if not crds:
        raise BinaryError(f"{MODULE}@{KUEUE_VERSION} has no {CRD_DIR}/*.yaml")
    if not (source / WEBHOOK_MANIFESTS).is_file():
        raise BinaryError(f"{MODULE}@{KUEUE_VERSION} has no {WEBHOOK_MANIFESTS}")
    (target / "crds").mkdir(parents=True, exist_ok=True)
    for path in [*crds, source / WEBHOOK_MANIFESTS]:
        dest = target / "crds" / path.name if path in crds else target / "webhooks.yaml"
        partial = dest.with_name(f".{dest.name}.partial")
        shutil.copyfile(path, partial)
        partial.chmod(0o644)  # the module cache is read-only
        partial.replace(dest)
    (target / "complete").write_text(f"{KUEUE_VERSION}\n")


def ensure_kueue(root: Path | None = None, progress: Progress | None = None) -> KueueBuild:
    """Find or build Kueue's manager and copy its manifests (minutes when cold, then cached).

    Args:
        root: The cache root (default :func:`~verl_devtools.devcluster.versions.cache_dir`).
        progress: Called with one line per build step.

    Returns:
        The binary, the CRD files and the webhook manifests.

    Raises:
        BinaryError: Go is missing, the build failed, or the module lacks the manifests.
    """
    root = root or cache_dir()
    binary = binaries.ensure(("kueue",), root=root, progress=progress)["kueue"]
    target = manifests_dir(root)
    if not (target / "complete").is_file():
        with file_lock(root / "gotools" / f"{KUEUE.name}.lock"):
            if not (target / "complete").is_file():
                _copy_manifests(target)
    return KueueBuild(
        binary=binary, crds=tuple(sorted((target / "crds").glob("*.yaml"))), webhooks=target / "webhooks.yaml"
    )


def _rules_groups(webhook: Mapping[str, Any]) -> set[str]:
    return {str(g) for rule in webhook.get("rules") or [] for g in rule.get("apiGroups") or []}


def webhook_configurations(manifests: str, port: int, ca_pem: bytes, prefix: str) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, rewritten for a manager on ``127.0.0.1:port`` (pure).

    Every webhook whose rules name only pods or Kueue's own API group is kept (see :data:`WEBHOOK_GROUPS`);
    its ``clientConfig`` becomes ``url: https://127.0.0.1:<port><path>`` with ``caBundle``. The pod webhooks
    get Kueue's own namespace selector (not ``kube-system`` or Kueue's namespace, as Kueue's kustomization
    patches them) and an object selector on the queue label: only a pod that names a queue is sent to the
    manager, so a pod without one never waits for (or fails on) it.

    Args:
        manifests: The text of ``config/components/webhook/manifests.yaml``.
        port: The manager's webhook port.
        ca_pem: The PEM CA that signed the manager's serving certificate.
        prefix: Names the configurations (``<prefix>-mutating``, ``<prefix>-validating``).

    Returns:
        The MutatingWebhookConfiguration and the ValidatingWebhookConfiguration.

    Raises:
        ValueError: A configuration has no webhook left, or a webhook no ``service.path``.
    """
    bundle = base64.b64encode(ca_pem).decode()
    out = []
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        config = copy.deepcopy(doc)
        kind = str(config["kind"])
        kept = []
        for hook in config.get("webhooks") or []:
            groups = _rules_groups(hook)
            if not groups or not groups <= WEBHOOK_GROUPS:
                continue
            path = ((hook.get("clientConfig") or {}).get("service") or {}).get("path")
            if not path:
                raise ValueError(f"{kind} webhook {hook.get('name')} has no clientConfig.service.path")
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
            if groups == {""}:  # pods
                hook["namespaceSelector"] = {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": list(UNMANAGED_NAMESPACES),
                        }
                    ]
                }
                hook["objectSelector"] = {
                    "matchExpressions": [{"key": "kueue.x-k8s.io/queue-name", "operator": "Exists"}]
                }
            kept.append(hook)
        if not kept:
            raise ValueError(
                f"{kind}: no webhook for pods or {sorted(WEBHOOK_GROUPS - {''})} in the manifests"
            )
        suffix = "mutating" if kind.startswith("Mutating") else "validating"
        config["metadata"] = {"name": f"{prefix}-{suffix}"}
        config["webhooks"] = kept
        out.append(config)
    return out


def configuration(webhook_port: int, metrics_port: int, health_port: int, cert_dir: Path) -> dict[str, Any]:
    """The manager's ``Configuration`` (``config.kueue.x-k8s.io/v1beta2``) for an out-of-cluster run (pure).

    Args:
        webhook_port: The webhook server's port (on 127.0.0.1).
        metrics_port: The metrics server's port.
        health_port: ``/healthz`` and ``/readyz``.
        cert_dir: Holds ``tls.crt`` and ``tls.key`` of the webhook server.

    Returns:
        The configuration as a dict (written as YAML).
    """
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        # v0.17 needs a namespace selector with the pod integration, one that never matches its own
        # namespace or kube-system: every other namespace is managed (a pod is managed only with a queue).
        "managedJobsNamespaceSelector": {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": list(UNMANAGED_NAMESPACES),
                }
            ]
        },
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["pod"]},
        "clientConnection": {"qps": 50, "burst": 100},  # Kueue's defaults in its shipped configuration
    }


@dataclass(frozen=True)
class KueueRun:
    """A started manager: its pid, ports and the webhook configurations installed for it."""

    pid: int
    started: int | None
    ports: dict[str, int]
    webhooks: tuple[tuple[str, str], ...]  # (kind, name)
    log: Path

    def as_state(self) -> dict[str, Any]:
        """The state file's entry."""
        return {
            "pid": self.pid,
            "started": self.started,
            "ports": self.ports,
            "webhooks": [list(w) for w in self.webhooks],
            "log": str(self.log),
        }


def _ensure_namespace(api: Any, name: str) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        body: Any = {"metadata": {"name": name}}
        client.CoreV1Api(api).create_namespace(body)
    except ApiException as exc:
        if exc.status != 409:
            raise


def _apply_webhooks(api: Any, configs: Sequence[Mapping[str, Any]]) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    admission = client.AdmissionregistrationV1Api(api)
    for config in configs:
        body: Any = dict(config)
        name = config["metadata"]["name"]
        mutating = config["kind"] == "MutatingWebhookConfiguration"
        create = (
            admission.create_mutating_webhook_configuration
            if mutating
            else admission.create_validating_webhook_configuration
        )
        try:
            create(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            delete = (
                admission.delete_mutating_webhook_configuration
                if mutating
                else admission.delete_validating_webhook_configuration
            )
            delete(name)
            create(body)


def _delete_webhooks(api: Any, webhooks: Sequence[Sequence[str]]) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    admission = client.AdmissionregistrationV1Api(api)
    for kind, name in webhooks:
        delete = (
            admission.delete_mutating_webhook_configuration
            if kind == "MutatingWebhookConfiguration"
            else admission.delete_validating_webhook_configuration
        )
        try:
            delete(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def ensure_metrics_cert(directory: Path = METRICS_CERT_DIR) -> None:
    """The metrics certificate the manager insists on (see :data:`METRICS_CERT_DIR`), written if missing.

    Raises:
        BinaryError: The directory cannot be written (not root).
    """
    if (directory / "tls.crt").is_file() and (directory / "tls.key").is_file():
        return
    try:
        directory.mkdir(parents=True, exist_ok=True)
        ca = certs.write_ca(directory, "kueue-metrics-ca", stem="ca")
        certs.write_signed(ca, directory, "tls", "kueue-metrics", server_ips=("127.0.0.1",))
        (directory / METRICS_CERT_MARK).write_text(
            "written by verl-operator-dev devcluster up --scheduler kueue\n"
        )
    except OSError as exc:
        raise BinaryError(
            f"Kueue {KUEUE_VERSION} reads its metrics certificate from {directory} (a fixed path when its "
            f"internal certificate management is off) and it could not be written ({exc}): run as root, or "
            f"put a tls.crt and tls.key there"
        ) from exc


def _remove_metrics_cert(layout: Layout, directory: Path = METRICS_CERT_DIR) -> None:
    """Remove the devcluster's metrics certificate when no other instance's state records a running Kueue."""
    if not (directory / METRICS_CERT_MARK).is_file():
        return  # not ours
    for state_file in layout.base.parent.glob("*/state.json"):
        if state_file.parent != layout.base and STATE_KEY in read_state(Layout(state_file.parent)):
            return
    for name in ("tls.crt", "tls.key", "ca.crt", "ca.key", METRICS_CERT_MARK):
        (directory / name).unlink(missing_ok=True)
    for parent in (directory, directory.parent, directory.parent.parent):
        with contextlib.suppress(OSError):
            parent.rmdir()  # only when empty


def kueue_dir(layout: Layout) -> Path:
    """The instance's Kueue files: ``certs/``, ``config.yaml``."""
    return layout.base / "kueue"


def start_kueue(
    layout: Layout,
    name: str,
    api: Any,
    progress: Progress | None = None,
    timeout: float = START_TIMEOUT,
) -> KueueRun:
    """Start Kueue's manager against a running devcluster instance (idempotent) and record it in its state.

    Order: build (cached), CRDs installed and Established, a serving certificate for 127.0.0.1, the
    manager started with its configuration and waited for (``/readyz``), then its webhook configurations
    installed: a pod is never sent to a webhook that does not answer yet.

    Args:
        layout: The instance's files.
        name: The instance's name (names the webhook configurations).
        api: An admin ``kubernetes.client.ApiClient`` of the instance.
        progress: Called with one line per step.
        timeout: Seconds to wait for the manager.

    Returns:
        The running manager.

    Raises:
        BinaryError: The build failed, or the manager exited or did not become ready (with its log's tail).
    """
    say = progress or (lambda _m: None)
    state = read_state(layout)
    saved = state.get(STATE_KEY)
    if saved and process.alive(int(saved["pid"]), saved.get("started")):
        say(f"kueue {KUEUE_VERSION} already running (pid {saved['pid']})")
        return KueueRun(
            int(saved["pid"]),
            saved.get("started"),
            dict(saved["ports"]),
            tuple((str(k), str(n)) for k, n in saved["webhooks"]),
            Path(saved["log"]),
        )
    build = ensure_kueue(progress=progress)
    ensure_metrics_cert()
    install_crds(api, build.crds)
    _ensure_namespace(api, KUEUE_NAMESPACE)
    home = kueue_dir(layout)
    cert_dir = home / "certs"
    cert_dir.mkdir(parents=True, exist_ok=True)
    ca = certs.write_ca(cert_dir, f"kueue-{name}-ca")
    certs.write_signed(
        ca, cert_dir, "tls", "kueue-webhook", server_names=("localhost",), server_ips=("127.0.0.1",)
    )
    avoid = set(state.get("ports", {}).values()) | ports_of_other_instances(layout.base.parent, name)
    # The ports are picked free and bound by the manager when it starts: another program can take one in
    # between. The manager then exits on its failed bind, or another listener answers on the webhook port
    # (not Kueue's certificate); either way that start is stopped and the next one gets new ports. The
    # webhook configurations are written only once the webhook port is the manager's own.
    for attempt in range(1, PORT_ATTEMPTS + 1):
        ports = pick_free_ports(("webhook", "metrics", "health"), avoid=avoid)
        try:
            run = _start_manager(build, layout, state, home, cert_dir, ports, timeout, say)
            break
        except PortTaken as exc:
            if attempt == PORT_ATTEMPTS:
                raise BinaryError(f"kueue lost the race for its ports {attempt} times: {exc}") from exc
            say(f"kueue: {exc}; new ports")
    pid, log = run.pid, run.log
    configs = webhook_configurations(
        build.webhooks.read_text(), ports["webhook"], ca.cert.read_bytes(), f"kueue-{name}"
    )
    _apply_webhooks(api, configs)
    run = KueueRun(pid, run.started, ports, tuple((c["kind"], c["metadata"]["name"]) for c in configs), log)
    state[STATE_KEY] = run.as_state()
    write_state(layout, state)
    say(f"kueue ready (pid {pid}, log {log})")
    return run


def _start_manager(
    build: KueueBuild,
    layout: Layout,
    state: dict[str, Any],
    home: Path,
    cert_dir: Path,
    ports: dict[str, int],
    timeout: float,
    say: Progress,
) -> KueueRun:
    """Start the manager on ``ports`` and wait until it is ready and serves its webhook with its certificate.

    Raises:
        PortTaken: A port was taken by another program (the manager stopped).
        BinaryError: The manager exited or was not ready in time.
    """
    config_path = home / "config.yaml"
    config_path.write_text(
        yaml.safe_dump(configuration(ports["webhook"], ports["metrics"], ports["health"], cert_dir))
    )
    argv = [
        str(build.binary),
        f"--config={config_path}",
        f"--kubeconfig={layout.kubeconfig}",
        # The on-demand visibility API server binds 0.0.0.0:8082 and needs an APIService: not used here.
        "--feature-gates=VisibilityOnDemand=false",
    ]
    log = layout.log("kueue")
    offset = log.stat().st_size if log.exists() else 0
    say(f"starting kueue {KUEUE_VERSION} (webhook 127.0.0.1:{ports['webhook']})")
    pid = process.start(argv, log, home)
    run = KueueRun(pid, process.start_time(pid), ports, (), log)
    state[STATE_KEY] = run.as_state()
    write_state(layout, state)
    cert = (cert_dir / "tls.crt").read_bytes()
    deadline = time.monotonic() + timeout
    while True:
        if not process.alive(pid, run.started):
            if ADDRESS_IN_USE in log.read_bytes()[offset:].decode(errors="replace").lower():
                raise PortTaken(f"a port of {sorted(ports.values())} was in use")
            raise BinaryError(f"kueue exited:\n{process.log_tail(log, 30)}")
        ready = http_status(f"http://127.0.0.1:{ports['health']}", "/readyz", timeout=1) == 200
        own = serves_certificate(ports["webhook"], cert) if ready else None
        if own is False:
            process.stop(pid, run.started)
            raise PortTaken(f"another program answers on the webhook port {ports['webhook']}")
        if own:
            return run
        if time.monotonic() > deadline:
            raise BinaryError(f"kueue not ready after {timeout:.0f}s:\n{process.log_tail(log, 30)}")
        time.sleep(0.2)


def stop_kueue(layout: Layout, api: Any | None = None) -> None:
    """Stop the instance's manager (by pid, waiting for it) and, given ``api``, delete its webhook
    configurations first (a pod of a queue would otherwise fail on a webhook nobody serves)."""
    state = read_state(layout)
    saved = state.get(STATE_KEY)
    if not saved:
        return
    if api is not None:
        _delete_webhooks(api, saved.get("webhooks") or [])
    process.stop(int(saved["pid"]), saved.get("started"))
    state.pop(STATE_KEY, None)
    write_state(layout, state)
    _remove_metrics_cert(layout)
