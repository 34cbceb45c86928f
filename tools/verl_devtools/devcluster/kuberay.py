"""KubeRay's operator for the scale benchmark: built from its Go module, its CRDs taken from the same module.

Nothing here runs in ``make test``: ``bench/bench_scale.py`` asks for it. The operator binary is built like the
other binaries (:mod:`verl_devtools.devcluster.gobuild`, cached under ``bin/kuberay-<version>/`` with the
completion marker); the CRDs are copied from ``config/crd/bases`` of the module's source, which
``go mod download`` fetches from the Go module proxy (the same zip the binary is built from), into
``bin/kuberay-<version>/crds/``. :class:`KubeRayOperator` runs the binary out of cluster against a kubeconfig.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from verl_devtools.devcluster import binaries, gobuild, process
from verl_devtools.devcluster.health import http_status
from verl_devtools.devcluster.locking import file_lock
from verl_devtools.devcluster.ports import ADDRESS_IN_USE, pick_free_ports
from verl_devtools.devcluster.tools import KUBERAY, BinaryError, Progress, bin_dir
from verl_devtools.devcluster.versions import KUBERAY_VERSION, cache_dir

#: The module KubeRay's operator is built from (its ``main`` package is the module root).
MODULE = "github.com/ray-project/kuberay/ray-operator"
#: The CRDs the operator's controllers watch (RayCluster, RayJob, RayService): it refuses to start without all.
CRD_FILES = ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml", "ray.io_rayservices.yaml")


@dataclass(frozen=True)
class KubeRayBuild:
    """The operator binary and its CRD files, in the versioned cache."""

    binary: Path
    crds: tuple[Path, ...]
    version: str = KUBERAY_VERSION


def _module_dir(env: dict[str, str]) -> Path:
    """Download the module's source through the module proxy; return its directory in the module cache."""
    go = shutil.which("go")
    if go is None:
        raise BinaryError("the Go toolchain is needed to fetch KubeRay's CRDs and is not on PATH")
    return gobuild.module_download(go, MODULE, KUBERAY_VERSION, env, "Dir")


def ensure_kuberay(root: Path | None = None, progress: Progress | None = None) -> KubeRayBuild:
    """Find or build KubeRay's operator and its CRD files (minutes when cold, then cached).

    Args:
        root: The cache root (default :func:`~verl_devtools.devcluster.versions.cache_dir`).
        progress: Called with one line per step.

    Returns:
        The binary and the CRD files.

    Raises:
        BinaryError: Go is missing, the build failed, or the module has no ``config/crd/bases/<file>``.
    """
    root = root or cache_dir()
    binary = binaries.ensure(("kuberay-operator",), root=root, progress=progress)["kuberay-operator"]
    crd_dir = bin_dir(KUBERAY, root) / "crds"
    wanted = tuple(crd_dir / name for name in CRD_FILES)
    if not all(p.is_file() for p in wanted):
        with file_lock(root / "gotools" / f"{KUBERAY.name}.lock"):
            if not all(p.is_file() for p in wanted):
                source = _module_dir({**os.environ}) / "config" / "crd" / "bases"
                crd_dir.mkdir(parents=True, exist_ok=True)
                for name in CRD_FILES:
                    if not (source / name).is_file():
                        raise BinaryError(f"{MODULE}@{KUBERAY_VERSION} has no config/crd/bases/{name}")
                    partial = crd_dir / f".{name}.partial"
                    shutil.copyfile(source / name, partial)
                    partial.replace(crd_dir / name)
    return KubeRayBuild(binary=binary, crds=wanted)


def install_crds(api: Any, paths: Sequence[Path], timeout: float = 60.0) -> list[str]:
    """Create (or replace) CRDs from YAML files and wait until each is Established.

    Args:
        api: A ``kubernetes.client.ApiClient``.
        paths: CRD files (one CustomResourceDefinition each).
        timeout: Seconds to wait for all of them.

    Returns:
        The CRD names.

    Raises:
        TimeoutError: A CRD did not become Established.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    ext = client.ApiextensionsV1Api(api)
    names = []
    for path in paths:
        crd: Any = yaml.safe_load(path.read_text())
        name = crd["metadata"]["name"]
        names.append(name)
        try:
            current: Any = ext.read_custom_resource_definition(name)
            crd["metadata"]["resourceVersion"] = current.metadata.resource_version
            ext.replace_custom_resource_definition(name, crd)
        except ApiException as exc:
            if exc.status != 404:
                raise
            ext.create_custom_resource_definition(crd)
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            status = ext.read_custom_resource_definition(name).status
            conds = (status.conditions if status else None) or []
            if any(c.type == "Established" and c.status == "True" for c in conds):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established after {timeout:.0f}s")
            time.sleep(0.2)
    return names


class KubeRayOperator:
    """KubeRay's operator as a local process against a kubeconfig (out of cluster, loopback ports only).

    Defaults are KubeRay's own (one reconcile worker per controller, client QPS 100 / burst 200); leader
    election is off, as for one replica.
    """

    def __init__(self, binary: Path, kubeconfig: Path, workdir: Path) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        ports = pick_free_ports(("metrics", "probe"))
        self.metrics_port, self.probe_port = ports["metrics"], ports["probe"]
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def log_path(self) -> Path:
        """The process's combined output."""
        return self.workdir / "kuberay-operator.log"

    def argv(self) -> list[str]:
        """The command line (an argv list)."""
        return [
            str(self.binary),
            f"--kubeconfig={self.kubeconfig}",
            f"--metrics-addr=127.0.0.1:{self.metrics_port}",
            f"--health-probe-bind-address=127.0.0.1:{self.probe_port}",
            "--enable-leader-election=false",
        ]

    def start(self, timeout: float = 60.0, attempts: int = 3) -> KubeRayOperator:
        """Start the process and wait until ``/readyz`` answers.

        Its ports are picked free and bound by the process: another program can take one in between; the
        process then exits on its failed bind ("address already in use") and starts again on new ports.
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, attempts + 1):
            self._log = self.log_path.open("ab")
            offset = self._log.tell()
            env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
            self.proc = subprocess.Popen(self.argv(), stdout=self._log, stderr=subprocess.STDOUT, env=env)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                if http_status(f"http://127.0.0.1:{self.probe_port}", "/readyz", timeout=1) == 200:
                    return self
                time.sleep(0.2)
            else:
                raise BinaryError(f"kuberay-operator not ready after {timeout:.0f}s:\n{self.log_tail()}")
            self._log.close()
            lost = ADDRESS_IN_USE in self.log_path.read_bytes()[offset:].decode(errors="replace").lower()
            if not lost or attempt == attempts:
                raise BinaryError(f"kuberay-operator exited with {self.proc.returncode}:\n{self.log_tail()}")
            ports = pick_free_ports(("metrics", "probe"))
            self.metrics_port, self.probe_port = ports["metrics"], ports["probe"]
        raise AssertionError("unreachable")

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the log."""
        return process.log_tail(self.log_path, lines)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s."""
        process.stop_child(self.proc, self._log)
        self._log = None
