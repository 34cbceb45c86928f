"""Pure builders of the objects the operator creates for a VerlJob; each returns a whole manifest dict."""

from __future__ import annotations

from verl_operator.manifests.children import (
    build_children,
    build_head_pod,
    build_launch_configmap,
    build_podgroup,
    build_service,
    build_worker_pod,
)
from verl_operator.manifests.launchspec import LaunchPlan, build_launch_spec
from verl_operator.manifests.names import ChildNames

__all__ = [
    "ChildNames",
    "LaunchPlan",
    "build_children",
    "build_head_pod",
    "build_launch_configmap",
    "build_launch_spec",
    "build_podgroup",
    "build_service",
    "build_worker_pod",
]
