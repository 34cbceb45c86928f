"""The launch contract end to end: what the operator writes, the launcher's own parser accepts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from verl_operator.api.spec import VerlJobSpec
from verl_operator.manifests import LaunchPlan, build_launch_configmap

launcher_spec = pytest.importorskip("verl_launcher.spec")

JOB = {"metadata": {"name": "demo", "namespace": "default", "uid": "1234"}}


@pytest.mark.parametrize(
    ("checkpoint", "product", "memory"),
    [
        pytest.param({"dir": "/checkpoints/demo"}, "NVIDIA-H100-80GB-HBM3", 81559, id="all-known"),
        pytest.param({}, None, None, id="nulls-allowed"),
    ],
)
def test_the_launcher_parses_the_operators_launch_json(
    checkpoint: dict[str, Any], product: str | None, memory: int | None
) -> None:
    spec = VerlJobSpec.model_validate(
        {
            "verl": {"image": "i"},
            "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
            "resources": {"gpus": 16, "gpusPerNode": 8},
            "checkpoint": checkpoint,
        }
    )
    plan = LaunchPlan(
        verl_version="0.9",
        nnodes=2,
        gpus_per_node=8,
        overrides=("trainer.nnodes=2", "trainer.n_gpus_per_node=8", "trainer.total_epochs=1"),
        nvlink_group_size=2,
        require_nvlink=True,
        gpu_product=product,
        gpu_memory_mib=memory,
        nodes=("a", "b"),
    )
    document = json.loads(build_launch_configmap(JOB, spec, plan)["data"]["launch.json"])
    parsed = launcher_spec.parse_launch_spec(document)
    assert parsed.nnodes == 2 and parsed.total_gpus == 16
    assert launcher_spec.unknown_fields(parsed) == []
