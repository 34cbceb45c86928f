"""One product-name rule (``verl_contract.gpu_product.product_key``) for the planner, placement, manifests and the
launcher's check: every spelling of a product plans, places and passes the launcher's check the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from verl_contract.gpu_product import product_key, product_label, product_tokens, same_product
from verl_operator.commands.plan import load_nodes
from verl_operator.commands.render import render
from verl_operator.planner.facts import memory_from_product, nvlink_domain_from_product
from verl_operator.planner.gpu_labels import compute_from_product

CLUSTERS = Path(__file__).parents[2] / "examples" / "clusters"
H100_SPELLINGS = (
    "NVIDIA-H100-80GB-HBM3",  # GPU Feature Discovery's label
    "NVIDIA H100 80GB HBM3",  # nvidia-smi's name
    "nvidia-h100-80gb-hbm3",
    "H100-80GB-HBM3",
    "NVIDIA_H100_80GB_HBM3",
    "NVIDIA-H100-80GB-HBM3-SHARED",  # GFD under time-slicing
)


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        *[(spelling, "NVIDIA-H100-80GB-HBM3", True) for spelling in H100_SPELLINGS],
        ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", False),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-40GB", False),
        ("Tesla V100-SXM2-16GB", "Tesla-V100-SXM2-16GB", True),
        # one physical part under the names of other sources (PRODUCT_ALIASES)
        ("NVIDIA-H100-SXM5-80GB", "NVIDIA-H100-80GB-HBM3", True),
        ("NVIDIA H100 SXM 80GB", "NVIDIA H100 80GB HBM3", True),
        ("H100-80GB-SXM5", "NVIDIA-H100-80GB-HBM3", True),
        ("NVIDIA-H100-PCIe-80GB", "NVIDIA-H100-PCIe", True),
        ("NVIDIA-H100-NVL-94GB", "NVIDIA H100 NVL", True),
        ("NVIDIA-H200-SXM-141GB", "NVIDIA-H200", True),
        ("H200-141GB-HBM3e", "NVIDIA H200", True),
        ("NVIDIA-A100-PCIE-80GB", "NVIDIA A100 80GB PCIe", True),
        ("NVIDIA-A100-SXM-40GB", "NVIDIA-A100-SXM4-40GB", True),
        ("V100-SXM2-16GB", "Tesla-V100-SXM2-16GB", True),
        ("T4", "Tesla-T4", True),
        # names that do not fix the part stay apart
        ("NVIDIA-H100-SXM5-80GB", "NVIDIA-H100-PCIe", False),
        ("NVIDIA-H100-80GB", "NVIDIA-H100-80GB-HBM3", False),
        ("NVIDIA-H100-SXM5-94GB", "NVIDIA-H100-80GB-HBM3", False),
        ("NVIDIA-H200-NVL", "NVIDIA-H200", False),
        ("NVIDIA-A100-PCIE-80GB", "NVIDIA-A100-SXM4-80GB", False),
        ("NVIDIA-H100-NVL-94GB", "NVIDIA-H100-PCIe", False),
    ],
)
def test_product_key(a: str, b: str, same: bool) -> None:
    assert same_product(a, b) is same, (product_key(a), product_key(b))


@pytest.mark.parametrize("spelling", H100_SPELLINGS)
def test_every_spelling_reads_the_same_tables(spelling: str) -> None:
    """The planner's product tables (memory, NVLink, compute capability) look up the contract's key's words."""
    assert product_tokens(spelling) == ("H100", "80GB", "HBM3")
    assert memory_from_product(spelling) == 81559
    assert nvlink_domain_from_product(spelling, 8) == 8
    assert compute_from_product(spelling) == (9, 0)


def test_the_gfd_spelling_of_an_nvidia_smi_name() -> None:
    assert product_label("NVIDIA  H100 80GB HBM3 ") == "NVIDIA-H100-80GB-HBM3"
    assert same_product(product_label("NVIDIA A100-SXM4-80GB"), "nvidia a100 sxm4 80gb")


def _job(product: str) -> dict[str, Any]:
    return {
        "apiVersion": "verl-operator.io/v1alpha1",
        "kind": "VerlJob",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {
            "verl": {"image": "verl:x", "version": "0.9"},
            "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
            "resources": {"gpus": 16, "gpuProduct": product},
        },
    }


def _pods(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in children if c["kind"] == "Pod"]


@pytest.mark.parametrize("spelling", H100_SPELLINGS)
def test_every_spelling_plans_and_places_the_same(spelling: str) -> None:
    nodes = load_nodes(str(CLUSTERS / "dgx-h100.yaml"))
    reference = render(_job("NVIDIA-H100-80GB-HBM3"), nodes)
    children = render(_job(spelling), nodes)
    pods = _pods(children)
    assert len(pods) == 2
    assert [p["metadata"]["annotations"] for p in pods] == [
        p["metadata"]["annotations"] for p in _pods(reference)
    ]
    launch = next(c for c in children if c["kind"] == "ConfigMap")
    assert "NVIDIA-H100-80GB-HBM3" in str(launch["data"])  # the launcher expects the nodes' own label


def test_a_scheduler_placed_job_selects_the_nodes_label_not_the_spelling() -> None:
    job = _job("NVIDIA H100 80GB HBM3")
    job["spec"]["scheduling"] = {"scheduler": "volcano"}
    pods = _pods(render(job, load_nodes(str(CLUSTERS / "dgx-h100.yaml"))))
    assert {p["spec"]["nodeSelector"]["nvidia.com/gpu.product"] for p in pods} == {"NVIDIA-H100-80GB-HBM3"}
