"""A real local Kubernetes control plane with kwok-simulated GPU nodes, for development and tests."""

from __future__ import annotations

from verl_devtools.devcluster.cluster import DevCluster, DevClusterError
from verl_devtools.devcluster.profiles import DEFAULT_PROFILE, load_profile
from verl_devtools.devcluster.status import DevClusterStatus

__all__ = [
    "DEFAULT_PROFILE",
    "DevCluster",
    "DevClusterError",
    "DevClusterStatus",
    "load_profile",
]
