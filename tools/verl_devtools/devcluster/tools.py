"""The pinned binaries: what each is, which version it must report, where its group is cached."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from verl_devtools.devcluster.versions import (
    COREDNS_VERSION,
    ETCD_VERSION,
    HELM_VERSION,
    KUBERAY_VERSION,
    KUBERNETES_VERSION,
    KUEUE_VERSION,
    KWOK_VERSION,
    cache_dir,
)

#: Written into a bin directory after every binary of its group was built or verified.
MARKER = ".verl-operator-complete"

#: Receives one line per build step.
Progress = Callable[[str], None]


class BinaryError(RuntimeError):
    """A binary could not be found or built."""


@dataclass(frozen=True)
class Tool:
    """One executable: how to ask its version and how to build it."""

    name: str
    version: str
    #: Arguments that make the binary print its version; empty: read the version of ``module`` from the
    #: Go build information embedded in the binary (``go version -m``), for a command with no version flag.
    version_argv: tuple[str, ...]
    #: The Go package to build (relative ``./dir`` for a package of the generated module).
    package: str
    #: The Go module whose version the build information must report (with an empty ``version_argv``).
    module: str = ""


@dataclass(frozen=True)
class ToolGroup:
    """Binaries built together from one generated Go module into one cache directory."""

    name: str
    version: str
    bin_subdir: str
    tools: tuple[Tool, ...]
    ldflags: tuple[str, ...]


@dataclass(frozen=True)
class Located:
    """A binary that was found: its path, the version it reported and where it came from."""

    name: str
    path: Path
    version: str
    source: str


def _kube_tool(name: str) -> Tool:
    return Tool(name, KUBERNETES_VERSION, ("--version",), f"k8s.io/kubernetes/cmd/{name}")


KUBERNETES = ToolGroup(
    name="kubernetes",
    version=KUBERNETES_VERSION,
    bin_subdir=KUBERNETES_VERSION,
    tools=(
        _kube_tool("kube-apiserver"),
        _kube_tool("kube-controller-manager"),
        _kube_tool("kube-scheduler"),
        Tool("kubectl", KUBERNETES_VERSION, ("version", "--client"), "k8s.io/kubernetes/cmd/kubectl"),
        Tool("etcd", ETCD_VERSION, ("--version",), "./etcd"),
    ),
    # Without these the binaries report v0.0.0 and kubectl warns about version skew.
    ldflags=(
        f"-X k8s.io/component-base/version.gitVersion={KUBERNETES_VERSION}",
        f"-X k8s.io/component-base/version.gitMajor={KUBERNETES_VERSION.removeprefix('v').split('.')[0]}",
        f"-X k8s.io/component-base/version.gitMinor={KUBERNETES_VERSION.split('.')[1]}",
        f"-X k8s.io/client-go/pkg/version.gitVersion={KUBERNETES_VERSION}",
    ),
)

#: The node agents of the real-node tier, built from the same ``k8s.io/kubernetes`` module in a module of
#: their own (adding them to the control-plane module fails on go.sum entries only the kubelet needs).
KUBERNETES_NODE = ToolGroup(
    name="kubernetes-node",
    version=KUBERNETES_VERSION,
    bin_subdir=f"{KUBERNETES_VERSION}-node",
    tools=(_kube_tool("kubelet"), _kube_tool("kube-proxy")),
    ldflags=KUBERNETES.ldflags,
)

#: CoreDNS with the plugins the real-node tier's Corefile uses (``./coredns``: a generated main package).
COREDNS = ToolGroup(
    name="coredns",
    version=COREDNS_VERSION,
    bin_subdir=f"coredns-{COREDNS_VERSION}",
    tools=(Tool("coredns", COREDNS_VERSION, ("-version",), "./coredns"),),
    ldflags=(),
)

KWOK = ToolGroup(
    name="kwok",
    version=KWOK_VERSION,
    bin_subdir=f"kwok-{KWOK_VERSION}",
    tools=(Tool("kwok", KWOK_VERSION, ("--version",), "sigs.k8s.io/kwok/cmd/kwok"),),
    ldflags=(f"-X sigs.k8s.io/kwok/pkg/consts.Version={KWOK_VERSION.removeprefix('v')}",),
)

HELM = ToolGroup(
    name="helm",
    version=HELM_VERSION,
    # The directory names the Kubernetes minor too: it is compiled in below.
    bin_subdir=f"helm-{HELM_VERSION}-k8s{KUBERNETES_VERSION.removeprefix('v').rsplit('.', 1)[0]}",
    tools=(Tool("helm", HELM_VERSION, ("version", "--short"), "helm.sh/helm/v3/cmd/helm"),),
    # Helm's release builds compile in the Kubernetes version that `helm template` and `helm lint` assume
    # without a cluster; a plain `go build` leaves v1.20, which charts needing a newer Kubernetes refuse.
    ldflags=(
        f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
        *(
            f"-X helm.sh/helm/v3/pkg/{pkg}.k8sVersion{part}={value}"
            for pkg in ("chartutil", "lint/rules")
            for part, value in (
                ("Major", KUBERNETES_VERSION.removeprefix("v").split(".")[0]),
                ("Minor", KUBERNETES_VERSION.split(".")[1]),
            )
        ),
    ),
)

#: KubeRay's operator, for the scale benchmark only (``bench/bench_scale.py``): never built by ``make test``.
#: Its ``main`` package is the module root; it has no version flag, so the build information is read.
KUBERAY = ToolGroup(
    name="kuberay",
    version=KUBERAY_VERSION,
    bin_subdir=f"kuberay-{KUBERAY_VERSION}",
    tools=(
        Tool(
            "kuberay-operator",
            KUBERAY_VERSION,
            (),
            "github.com/ray-project/kuberay/ray-operator",
            module="github.com/ray-project/kuberay/ray-operator",
        ),
    ),
    ldflags=(),
)

#: Kueue's controller manager (``cmd/kueue``), run out of cluster by ``devcluster up --scheduler kueue``
#: (see devcluster/kueue.py). It has no version flag either: the build information is read.
KUEUE = ToolGroup(
    name="kueue",
    version=KUEUE_VERSION,
    bin_subdir=f"kueue-{KUEUE_VERSION}",
    tools=(Tool("kueue", KUEUE_VERSION, (), "sigs.k8s.io/kueue/cmd/kueue", module="sigs.k8s.io/kueue"),),
    # What Kueue's Makefile sets, so the manager logs its release.
    ldflags=(f"-X sigs.k8s.io/kueue/pkg/version.GitVersion={KUEUE_VERSION}",),
)

GROUPS: dict[str, ToolGroup] = {
    g.name: g for g in (KUBERNETES, KUBERNETES_NODE, COREDNS, KWOK, HELM, KUBERAY, KUEUE)
}
#: Which group builds which binary.
GROUP_OF: dict[str, ToolGroup] = {t.name: g for g in GROUPS.values() for t in g.tools}


def version_matches(output: str, version: str) -> bool:
    """Whether a ``--version`` output reports exactly ``version`` (with or without the leading ``v``).

    Args:
        output: What the binary printed.
        version: The pinned tag, e.g. ``v1.34.4``.

    Returns:
        True when the number appears as a whole token (``v1.34.4`` does not match ``v1.34.40``).
    """
    number = re.escape(version.removeprefix("v"))
    return re.search(rf"(?<![\w.])v?{number}(?![\w.])", output) is not None


def buildinfo_version(buildinfo: str, module: str) -> str | None:
    """The version of ``module`` in ``go version -m`` output (its ``dep`` or ``mod`` line), else None.

    Args:
        buildinfo: What ``go version -m <binary>`` printed.
        module: A module path, e.g. ``github.com/ray-project/kuberay/ray-operator``.

    Returns:
        The version, e.g. ``v1.5.0``; None when the module is not listed (or is a ``(devel)`` build).
    """
    for line in buildinfo.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[0] in ("dep", "mod") and fields[1] == module:
            return None if fields[2] == "(devel)" else fields[2]
    return None


def reported_version(path: Path, tool: Tool) -> str | None:
    """Run ``path`` with the tool's version arguments and return its output, or None if it fails.

    A tool without version arguments reports the version of its module in the Go build information.
    """
    argv = [str(path), *tool.version_argv]
    if not tool.version_argv:
        go = shutil.which("go")
        if go is None:
            return None
        argv = [go, "version", "-m", str(path)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    if not tool.version_argv:
        return buildinfo_version(done.stdout, tool.module)
    return (done.stdout + done.stderr).strip()


def verified(path: Path, tool: Tool, source: str) -> Located | None:
    if not (path.is_file() and os.access(path, os.X_OK)):
        return None
    output = reported_version(path, tool)
    if output is None or not version_matches(output, tool.version):
        return None
    return Located(tool.name, path, tool.version, source)


def bin_dir(group: ToolGroup, root: Path | None = None) -> Path:
    """The cache directory a group's binaries are built into."""
    return (root or cache_dir()) / "bin" / group.bin_subdir


def write_marker(group: ToolGroup, directory: Path) -> None:
    """Mark a group's bin directory complete (every binary built and reporting its version)."""
    (directory / MARKER).write_text(
        json.dumps({t.name: t.version for t in group.tools}, indent=2, sort_keys=True) + "\n"
    )
