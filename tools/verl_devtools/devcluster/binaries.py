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
    bin/helm-v3.19.5-k8s1.34/helm
    bin/kuberay-v1.5.0/{kuberay-operator,crds/}   only for the scale benchmark (see devcluster/kuberay.py)
    gotools/<group>-<version>/   the generated Go modules the binaries are built from
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from verl_devtools.devcluster.gobuild import build_group
from verl_devtools.devcluster.tools import (
    GROUP_OF,
    GROUPS,
    HELM,
    KUBERAY,
    KUBERNETES,
    KWOK,
    MARKER,
    BinaryError,
    Located,
    Progress,
    Tool,
    ToolGroup,
    bin_dir,
    reported_version,
    verified,
    version_matches,
    write_marker,
)
from verl_devtools.devcluster.versions import cache_dir

__all__ = [
    "GROUPS",
    "GROUP_OF",
    "HELM",
    "KUBERAY",
    "KUBERNETES",
    "KWOK",
    "MARKER",
    "BinaryError",
    "Located",
    "Progress",
    "Tool",
    "ToolGroup",
    "bin_dir",
    "build_group",
    "ensure",
    "find",
    "reported_version",
    "version_matches",
]


def find(name: str, root: Path | None = None) -> Located | None:
    """Find one binary without building anything.

    Args:
        name: ``kube-apiserver``, ``kube-controller-manager``, ``kube-scheduler``, ``kubectl``, ``etcd``,
            ``kwok``, ``helm`` or ``kuberay-operator``.
        root: The cache root (default: :func:`~verl_devtools.devcluster.versions.cache_dir`).

    Returns:
        The binary, or None when no candidate reports the pinned version.

    Raises:
        KeyError: ``name`` is not one of the binaries above.
    """
    group = GROUP_OF[name]
    tool = next(t for t in group.tools if t.name == name)
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        hit = verified(Path(assets) / name, tool, "KUBEBUILDER_ASSETS")
        if hit:
            return hit
    directory = bin_dir(group, root)
    cached = directory / name
    if (directory / MARKER).is_file() and cached.is_file():
        return Located(name, cached, tool.version, "cache")
    hit = verified(cached, tool, "cache")
    if hit:
        return hit
    on_path = shutil.which(name)
    if on_path:
        return verified(Path(on_path), tool, "PATH")
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
        if all(verified(directory / t.name, t, "cache") for t in group.tools):
            write_marker(group, directory)
