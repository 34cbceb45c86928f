"""Find the control-plane binaries, or build them once from their Go modules into a versioned cache.

Lookup order for each binary, the first that fits wins:

1. ``$KUBEBUILDER_ASSETS/<name>`` (the envtest convention), if it reports the pinned version;
2. a complete cache directory (one with a marker file written after every binary of it was built);
3. ``PATH``, if it reports the pinned version (an older kubectl on PATH is ignored);

otherwise the whole group is built with ``go build`` (argv lists, never a shell) and the marker is written.
A cache directory left half-built by an interrupted build has no marker: each binary in it is trusted only
if it runs and reports the pinned version.

Layout under the cache (``$VERL_OPERATOR_CACHE``, default ``~/.cache/verl-operator``)::

    bin/v1.34.4/{kube-apiserver,kube-controller-manager,kube-scheduler,kubectl,etcd}
    bin/kwok-v0.7.0/kwok
    bin/helm-v3.19.5/helm
    gotools/<group>-<version>/   the generated Go modules the binaries are built from
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from verl_operator.devcluster import gomod
from verl_operator.devcluster.versions import (
    ETCD_VERSION,
    HELM_VERSION,
    KUBERNETES_VERSION,
    KWOK_VERSION,
    cache_dir,
)

#: Written into a bin directory after every binary of its group was built or verified.
MARKER = ".verl-operator-complete"

Progress = Callable[[str], None]


class BinaryError(RuntimeError):
    """A binary could not be found or built."""


@dataclass(frozen=True)
class Tool:
    """One executable: how to ask its version and how to build it."""

    name: str
    version: str
    version_argv: tuple[str, ...]
    #: The Go package to build (relative ``./dir`` for a package of the generated module).
    package: str


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
    bin_subdir=f"helm-{HELM_VERSION}",
    tools=(Tool("helm", HELM_VERSION, ("version", "--short"), "helm.sh/helm/v3/cmd/helm"),),
    ldflags=(f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",),
)

GROUPS: dict[str, ToolGroup] = {g.name: g for g in (KUBERNETES, KWOK, HELM)}
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


def reported_version(path: Path, tool: Tool) -> str | None:
    """Run ``path`` with the tool's version arguments and return its output, or None if it fails."""
    try:
        done = subprocess.run(
            [str(path), *tool.version_argv], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return (done.stdout + done.stderr).strip()


def _verified(path: Path, tool: Tool, source: str) -> Located | None:
    if not (path.is_file() and os.access(path, os.X_OK)):
        return None
    output = reported_version(path, tool)
    if output is None or not version_matches(output, tool.version):
        return None
    return Located(tool.name, path, tool.version, source)


def bin_dir(group: ToolGroup, root: Path | None = None) -> Path:
    """The cache directory a group's binaries are built into."""
    return (root or cache_dir()) / "bin" / group.bin_subdir


def find(name: str, root: Path | None = None) -> Located | None:
    """Find one binary without building anything.

    Args:
        name: ``kube-apiserver``, ``kube-controller-manager``, ``kube-scheduler``, ``kubectl``, ``etcd``,
            ``kwok`` or ``helm``.
        root: The cache root (default: :func:`~verl_operator.devcluster.versions.cache_dir`).

    Returns:
        The binary, or None when no candidate reports the pinned version.

    Raises:
        KeyError: ``name`` is not one of the binaries above.
    """
    group = GROUP_OF[name]
    tool = next(t for t in group.tools if t.name == name)
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        hit = _verified(Path(assets) / name, tool, "KUBEBUILDER_ASSETS")
        if hit:
            return hit
    directory = bin_dir(group, root)
    cached = directory / name
    if (directory / MARKER).is_file() and cached.is_file():
        return Located(name, cached, tool.version, "cache")
    hit = _verified(cached, tool, "cache")
    if hit:
        return hit
    on_path = shutil.which(name)
    if on_path:
        return _verified(Path(on_path), tool, "PATH")
    return None


def _print_progress(message: str) -> None:
    print(f"[binaries] {message}", file=sys.stderr, flush=True)


def ensure(
    names: tuple[str, ...], root: Path | None = None, progress: Progress | None = None
) -> dict[str, Path]:
    """Find the binaries, building the groups that are missing (minutes when cold).

    Args:
        names: Binary names (see :func:`find`).
        root: The cache root.
        progress: Called with one line per step (default: print to stderr).

    Returns:
        The path of each binary by name.

    Raises:
        BinaryError: A build failed, or Go is missing.
    """
    say = progress or _print_progress
    found: dict[str, Path] = {}
    missing_groups: list[ToolGroup] = []
    for name in names:
        hit = find(name, root)
        if hit:
            found[name] = hit.path
        elif GROUP_OF[name] not in missing_groups:
            missing_groups.append(GROUP_OF[name])
    for group in missing_groups:
        build_group(group, root or cache_dir(), say)
    for name in names:
        if name not in found:
            hit = find(name, root)
            if hit is None:
                raise BinaryError(f"{name}: built, but it does not report version {GROUP_OF[name].version}")
            found[name] = hit.path
    _adopt_verified_dirs(root or cache_dir())
    return found


def _adopt_verified_dirs(root: Path) -> None:
    """Write the marker into a group's cache directory whose binaries all report the pinned versions.

    A directory filled by an earlier build without a marker is then trusted without running each binary.
    """
    for group in GROUPS.values():
        directory = bin_dir(group, root)
        if not directory.is_dir() or (directory / MARKER).is_file():
            continue
        if all(_verified(directory / t.name, t, "cache") for t in group.tools):
            (directory / MARKER).write_text(
                json.dumps({t.name: t.version for t in group.tools}, indent=2, sort_keys=True) + "\n"
            )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise BinaryError(
            "the Go toolchain (go >= 1.24) is needed to build the control-plane binaries and is not on PATH; "
            "install Go, or put matching binaries in $KUBEBUILDER_ASSETS"
        )
    return go


def _run_go(argv: list[str], cwd: Path, env: dict[str, str], what: str) -> None:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        raise BinaryError(f"{what} failed (exit {done.returncode}) in {cwd}:\n{tail}")


def _module_go_mod(go: str, module: str, version: str, env: dict[str, str]) -> str:
    """Download ``module@version`` through the module proxy and return its go.mod text."""
    with tempfile.TemporaryDirectory(prefix="verl-operator-gomod-") as scratch:
        done = subprocess.run(
            [go, "mod", "download", "-json", f"{module}@{version}"],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise BinaryError(f"go mod download {module}@{version} failed: {done.stdout}{done.stderr}".strip())
    info = json.loads(done.stdout)
    if "GoMod" not in info:
        raise BinaryError(f"go mod download {module}@{version}: {info.get('Error', 'no go.mod reported')}")
    return Path(info["GoMod"]).read_text()


def _write_module(group: ToolGroup, workdir: Path, go: str, env: dict[str, str]) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    if group is KUBERNETES:
        k8s_mod = _module_go_mod(go, "k8s.io/kubernetes", KUBERNETES_VERSION, env)
        text = gomod.kubernetes_tools_go_mod(
            k8s_mod, KUBERNETES_VERSION, ETCD_VERSION, go_directive=gomod.go_directive(k8s_mod)
        )
        (workdir / "tools.go").write_text(gomod.KUBERNETES_TOOLS_GO)
        (workdir / "etcd").mkdir(exist_ok=True)
        (workdir / "etcd" / "main.go").write_text(gomod.ETCD_MAIN_GO)
    else:
        tool = group.tools[0]
        module = tool.package.rsplit("/cmd/", 1)[0]
        tool_mod = _module_go_mod(go, module, group.version, env)
        text = gomod.single_tool_go_mod(module, group.version, go_directive=gomod.go_directive(tool_mod))
        (workdir / "tools.go").write_text(gomod.single_tool_go(tool.package))
    (workdir / "go.mod").write_text(text)


def build_group(group: ToolGroup, root: Path, progress: Progress) -> Path:
    """Build every binary of a group into its cache directory and write the completion marker.

    Args:
        group: :data:`KUBERNETES`, :data:`KWOK` or :data:`HELM`.
        root: The cache root.
        progress: Called with one line per step.

    Returns:
        The bin directory.

    Raises:
        BinaryError: Go is missing or a step failed (the message carries the tail of Go's output).
    """
    go = _go()
    target = bin_dir(group, root)
    workdir = root / "gotools" / f"{group.name}-{group.version}"
    with _locked(root / "gotools" / f"{group.name}.lock"):
        if (target / MARKER).is_file():
            return target  # another process finished the build while this one waited
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
        started = time.monotonic()
        progress(f"building {group.name} {group.version} (cold: minutes) in {workdir}")
        _write_module(group, workdir, go, env)
        progress("go mod tidy (downloads modules through the Go module proxy)")
        _run_go([go, "mod", "tidy"], workdir, env, "go mod tidy")
        target.mkdir(parents=True, exist_ok=True)
        for tool in group.tools:
            begun = time.monotonic()
            progress(f"go build {tool.package} -> {target / tool.name}")
            partial = target / f".{tool.name}.partial"
            _run_go(
                [
                    go,
                    "build",
                    "-trimpath",
                    "-ldflags",
                    " ".join(("-s", "-w", *group.ldflags)),
                    "-o",
                    str(partial),
                    tool.package,
                ],
                workdir,
                env,
                f"go build {tool.package}",
            )
            partial.replace(target / tool.name)
            progress(f"built {tool.name} in {time.monotonic() - begun:.0f}s")
        for tool in group.tools:
            if _verified(target / tool.name, tool, "cache") is None:
                raise BinaryError(f"{target / tool.name} does not report version {tool.version}")
        (target / MARKER).write_text(
            json.dumps({t.name: t.version for t in group.tools}, indent=2, sort_keys=True) + "\n"
        )
        progress(f"{group.name} {group.version} ready in {time.monotonic() - started:.0f}s")
    return target
