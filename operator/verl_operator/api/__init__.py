"""The VerlJob API (``verl-operator.io/v1alpha1``): pydantic models, the single source of truth.

The CRD schema is generated from these models; the planner, the webhook and the CLI all parse with them.
"""

from __future__ import annotations

from verl_operator.api.spec import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    SUPPORTED_VERL_VERSIONS,
    VERSION,
    Algorithm,
    BatchingSpec,
    CheckpointSpec,
    CriticSpec,
    DataSpec,
    ModelShape,
    ModelSpec,
    OffloadSpec,
    ParallelismSpec,
    PlacementSpec,
    ResourcesSpec,
    RolloutSpec,
    SchedulingSpec,
    VerlJob,
    VerlJobSpec,
    VerlSpec,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "SUPPORTED_VERL_VERSIONS",
    "VERSION",
    "Algorithm",
    "BatchingSpec",
    "CheckpointSpec",
    "CriticSpec",
    "DataSpec",
    "ModelShape",
    "ModelSpec",
    "OffloadSpec",
    "ParallelismSpec",
    "PlacementSpec",
    "ResourcesSpec",
    "RolloutSpec",
    "SchedulingSpec",
    "VerlJob",
    "VerlJobSpec",
    "VerlSpec",
]
