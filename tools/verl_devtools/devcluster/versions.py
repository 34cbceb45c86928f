"""Pinned versions of every binary the local control plane runs, and where they are cached."""

from __future__ import annotations

import os
from pathlib import Path

#: The Kubernetes release the devcluster runs (kube-apiserver, -controller-manager, -scheduler, kubectl).
KUBERNETES_VERSION = "v1.34.4"
#: etcd release built from ``go.etcd.io/etcd/server/v3`` (the one Kubernetes 1.34 is tested with).
ETCD_VERSION = "v3.6.4"
#: kwok simulates the nodes and the pod lifecycle (``sigs.k8s.io/kwok``).
KWOK_VERSION = "v0.7.0"
#: CoreDNS, the cluster DNS of the real-node tier (built with only the plugins it uses).
COREDNS_VERSION = "v1.12.4"
#: helm, for the chart (``helm.sh/helm/v3``).
HELM_VERSION = "v3.19.5"
#: KubeRay's operator (``github.com/ray-project/kuberay/ray-operator``), built only for the scale benchmark.
KUBERAY_VERSION = "v1.5.0"
#: Kueue's controller manager (``sigs.k8s.io/kueue``), for ``devcluster up --scheduler kueue`` and its tests.
KUEUE_VERSION = "v0.17.0"

#: Environment variable that moves the cache (default ``~/.cache/verl-operator``).
CACHE_ENV = "VERL_OPERATOR_CACHE"


def cache_dir() -> Path:
    """The root of everything the devcluster caches: binaries, Go tool modules, instances.

    Returns:
        ``$VERL_OPERATOR_CACHE`` when set, else ``~/.cache/verl-operator``.
    """
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "verl-operator"


def staging_version(kubernetes_version: str) -> str:
    """The version tag of the ``k8s.io/*`` staging modules released with a Kubernetes version.

    Kubernetes ``v1.X.Y`` publishes its staging repositories (client-go, apimachinery, ...) as ``v0.X.Y``.

    Args:
        kubernetes_version: A release tag such as ``v1.34.4``.

    Returns:
        The staging tag, e.g. ``v0.34.4``.

    Raises:
        ValueError: The tag is not of the form ``v1.X.Y``.
    """
    parts = kubernetes_version.removeprefix("v").split(".")
    if len(parts) != 3 or parts[0] != "1" or not all(p.isdigit() for p in parts):
        raise ValueError(f"kubernetes version {kubernetes_version!r} is not of the form v1.X.Y")
    return f"v0.{parts[1]}.{parts[2]}"
