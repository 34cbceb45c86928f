"""A real local Kubernetes control plane with kwok-simulated GPU nodes, for development and tests."""

from __future__ import annotations

from verl_operator.devcluster.cluster import DevCluster, DevClusterError
from verl_operator.devcluster.profiles import DEFAULT_PROFILE, Profile, ProfileError, load_profile
from verl_operator.devcluster.status import DevClusterStatus

__all__ = [
    "DEFAULT_PROFILE",
    "DevCluster",
    "DevClusterError",
    "DevClusterStatus",
    "Profile",
    "ProfileError",
    "load_profile",
]
