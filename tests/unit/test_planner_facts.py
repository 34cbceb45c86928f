"""Node facts: GPU count, memory, NVLink domain, eligibility."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_node, make_spec

from verl_operator.planner.cluster import exclusion_reason
from verl_operator.planner.facts import memory_from_product, node_facts, nvlink_domain_from_product


@pytest.mark.parametrize(
    ("product", "gpus", "expected"),
    [
        pytest.param("NVIDIA-H100-80GB-HBM3", 8, 8, id="h100-hbm3-nvswitch"),
        pytest.param("NVIDIA-H200", 8, 8, id="h200"),
        pytest.param("NVIDIA-A100-SXM4-80GB", 8, 8, id="a100-sxm4"),
        pytest.param("NVIDIA-B200", 8, 8, id="b200"),
        pytest.param("NVIDIA-GB200", 4, 4, id="gb200"),
        pytest.param("NVIDIA-L40S", 8, 1, id="l40s-pcie"),
        pytest.param("NVIDIA-L4", 4, 1, id="l4"),
        pytest.param("NVIDIA-A10G", 4, 1, id="a10g"),
        pytest.param("NVIDIA-A100-PCIE-40GB", 4, 1, id="a100-pcie"),
        pytest.param("NVIDIA-H100-NVL", 4, 2, id="h100-nvl-pairs"),
        pytest.param("Some-Unknown-GPU", 8, 1, id="unknown-no-nvlink"),
    ],
)
def test_nvlink_domain_from_product(product: str, gpus: int, expected: int) -> None:
    assert nvlink_domain_from_product(product, gpus) == expected


@pytest.mark.parametrize(
    ("product", "expected"),
    [
        pytest.param("NVIDIA-H100-80GB-HBM3", 81559, id="h100"),
        pytest.param("NVIDIA-L4", 23034, id="l4-not-l40s"),
        pytest.param("NVIDIA-L40S", 46068, id="l40s"),
        pytest.param("NVIDIA-A100-SXM4-40GB", 40960, id="a100-40"),
        pytest.param("Mystery-9000", None, id="unknown"),
    ],
)
def test_memory_from_product(product: str, expected: int | None) -> None:
    assert memory_from_product(product) == expected


def test_node_facts_reads_labels_and_allocatable() -> None:
    node = make_node("n1", 8, "NVIDIA-H100-80GB-HBM3", None, labels={"nvidia.com/gpu.clique": "c1.0"})
    f = node_facts(node)
    assert (f.name, f.gpus, f.gpu_memory_mib, f.gpu_memory_source) == ("n1", 8, 81559, "table")
    assert (f.nvlink_domain_size, f.nvlink_source, f.clique, f.ready, f.schedulable) == (
        8,
        "product",
        "c1.0",
        True,
        True,
    )


def test_probe_label_overrides_product() -> None:
    node = make_node(
        "n1", 8, "NVIDIA-H100-80GB-HBM3", 81559, labels={"verl-operator.io/nvlink-domain-size": "4"}
    )
    f = node_facts(node)
    assert (f.nvlink_domain_size, f.nvlink_source) == (4, "label")


def test_empty_node_reads_as_no_gpus() -> None:
    f = node_facts({"metadata": {"name": "cpu"}})
    assert (f.gpus, f.gpu_memory_mib, f.nvlink_domain_size) == (0, None, 1)


@pytest.mark.parametrize(
    ("conditions", "ready"),
    [
        pytest.param([{"type": "Ready", "status": "True"}], True, id="ready"),
        pytest.param([{"type": "Ready", "status": "False"}], False, id="not-ready"),
        pytest.param([{"type": "Ready", "status": "Unknown"}], False, id="kubelet-gone"),
        pytest.param([{"type": "MemoryPressure", "status": "False"}], True, id="no-ready-condition"),
        pytest.param(None, True, id="no-conditions-hand-written-file"),
    ],
)
def test_ready(conditions: list[dict[str, str]] | None, ready: bool) -> None:
    node = make_node("n")
    if conditions is None:
        del node["status"]["conditions"]
    else:
        node["status"]["conditions"] = conditions
    assert node_facts(node).ready is ready


@pytest.mark.parametrize(
    ("node", "spec_extra", "reason_part"),
    [
        pytest.param(make_node("a"), {}, None, id="eligible"),
        pytest.param(make_node("a", gpus=0), {}, "no allocatable", id="no-gpus"),
        pytest.param(make_node("a", ready=False), {}, "not Ready", id="not-ready"),
        pytest.param(make_node("a", unschedulable=True), {}, "cordoned", id="cordoned"),
        pytest.param(
            make_node("a", labels={"nvidia.com/gpu.replicas": "4"}), {}, "time-sliced", id="time-sliced"
        ),
        pytest.param(
            make_node("a"),
            {"resources": {"gpuProduct": "NVIDIA-H200"}},
            "is not NVIDIA-H200",
            id="wrong-product",
        ),
        pytest.param(
            make_node(
                "a", product="NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", labels={"nvidia.com/mig.strategy": "single"}
            ),
            {},
            "MIG",
            id="mig-slices",
        ),
        pytest.param(
            make_node("a"), {"resources": {"nodeSelector": {"pool": "rl"}}}, "pool=rl", id="selector"
        ),
        pytest.param(
            make_node("a", taints=[{"key": "team", "value": "x", "effect": "NoSchedule"}]),
            {},
            "taint",
            id="taint",
        ),
        pytest.param(
            make_node("a", taints=[{"key": "team", "value": "x", "effect": "NoSchedule"}]),
            {"resources": {"tolerations": [{"key": "team", "operator": "Exists"}]}},
            None,
            id="taint-tolerated",
        ),
        pytest.param(
            make_node("a", taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]),
            {},
            None,
            id="gpu-taint-tolerated-by-convention",
        ),
        pytest.param(
            make_node("a", product="Mystery", memory_mib=None),
            {},
            "nvidia.com/gpu.memory",
            id="memory-unknown",
        ),
    ],
)
def test_exclusion_reasons(node: dict[str, Any], spec_extra: dict[str, Any], reason_part: str | None) -> None:
    reason = exclusion_reason(node_facts(node), make_spec(8, **spec_extra))
    if reason_part is None:
        assert reason is None
    else:
        assert reason is not None and reason_part in reason
