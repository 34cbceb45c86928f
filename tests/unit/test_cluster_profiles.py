"""Cluster profiles: the example files, their Node manifests, and clear errors for bad input."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from verl_devtools.devcluster.profiles import DEFAULT_PROFILE, available_profiles, load_profile
from verl_operator.clusters import labels as L
from verl_operator.clusters.profile import NodeGroup, ProfileError, node_manifests, parse_profile

# The hardware each example profile must describe (vendor facts), per node group:
# (nodes, GPUs per node, product, GPU memory MiB, racks used, NVLink label, clique shared by all nodes).
EXPECTED = {
    "dgx-h100": [(4, 8, "NVIDIA-H100-80GB-HBM3", 81559, 2, None, False)],
    "l40s": [(4, 4, "NVIDIA-L40S", 46068, 2, None, False)],
    "a100-pcie": [(2, 8, "NVIDIA-A100-PCIE-40GB", 40960, 1, "2", False)],
    "gb200-nvl72": [(18, 4, "NVIDIA-GB200", 189471, 1, None, True)],
}


def test_the_default_profile_exists() -> None:
    assert DEFAULT_PROFILE in available_profiles()
    assert {"dgx-h100", "l40s", "a100-pcie", "gb200-nvl72", "mixed"} <= set(available_profiles())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_profiles_describe_the_hardware(name: str) -> None:
    nodes = node_manifests(load_profile(name))
    ((count, gpus, product, memory, racks, nvlink, clique),) = EXPECTED[name]
    assert len(nodes) == count
    for node in nodes:
        node_labels = node["metadata"]["labels"]
        assert node["status"]["allocatable"][L.GPU_RESOURCE] == str(gpus)
        assert node_labels[L.GPU_COUNT] == str(gpus)
        assert node_labels[L.GPU_PRODUCT] == product
        assert node_labels[L.GPU_MEMORY_MIB] == str(memory)
        assert node_labels.get(L.NVLINK_DOMAIN_SIZE) == nvlink
    assert len({n["metadata"]["labels"][L.RACK] for n in nodes}) == racks
    cliques = {n["metadata"]["labels"].get(L.GPU_CLIQUE) for n in nodes}
    assert (cliques != {None} and len(cliques) == 1) if clique else cliques == {None}


def test_dgx_nodes_fill_two_racks_evenly() -> None:
    nodes = node_manifests(load_profile("dgx-h100"))
    assert Counter(n["metadata"]["labels"][L.RACK] for n in nodes) == {"rack-a1": 2, "rack-a2": 2}


def test_gb200_trays_are_arm64() -> None:
    nodes = node_manifests(load_profile("gb200-nvl72"))
    assert {n["metadata"]["labels"]["kubernetes.io/arch"] for n in nodes} == {"arm64"}


def test_mixed_has_cpu_only_nodes_without_gpu_labels() -> None:
    nodes = node_manifests(load_profile("mixed"))
    cpu_only = [n for n in nodes if L.GPU_RESOURCE not in n["status"]["capacity"]]
    assert cpu_only
    assert not [n for n in cpu_only if any(k.startswith("nvidia.com/") for k in n["metadata"]["labels"])]


@pytest.mark.parametrize("name", available_profiles())
def test_every_node_is_handed_to_kwok_and_schedulable(name: str) -> None:
    profile = load_profile(name)
    nodes = node_manifests(profile)
    assert [n["metadata"]["name"] for n in nodes] == profile.node_names
    assert len(set(profile.node_names)) == len(nodes)
    for node in nodes:
        assert node["metadata"]["annotations"][L.KWOK_NODE] == L.KWOK_NODE_VALUE
        assert "taints" not in node["spec"]
        assert node["metadata"]["labels"][L.PROFILE] == profile.name
        assert {L.ZONE, L.REGION, L.RACK, "kubernetes.io/hostname"} <= set(node["metadata"]["labels"])
        assert node["status"]["capacity"] == node["status"]["allocatable"]


def test_profiles_do_not_share_node_names() -> None:
    """Profiles stack in one cluster (apply_profile), so their node names must not collide."""
    names = [n for p in available_profiles() for n in load_profile(p).node_names]
    assert [n for n, c in Counter(names).items() if c > 1] == []


def _valid() -> dict[str, Any]:
    return {
        "name": "small",
        "nodeGroups": [
            {
                "namePrefix": "gpu",
                "count": 2,
                "gpu": {
                    "product": "NVIDIA-H100-80GB-HBM3",
                    "count": 8,
                    "memoryMib": 81559,
                    "family": "hopper",
                    "machine": "DGX-H100",
                    "computeMajor": 9,
                    "computeMinor": 0,
                },
                "cpu": "224",
                "memory": "2Ti",
                "region": "r",
                "zone": "z",
                "racks": ["a"],
            }
        ],
    }


def _with(path: str, value: Any) -> dict[str, Any]:
    data = _valid()
    target: Any = data
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    target[keys[-1]] = value
    return data


@pytest.mark.parametrize(
    ("data", "field", "why"),
    [
        pytest.param(
            _with("nodeGroups.0.count", 0), "nodeGroups[0].count", "greater than or equal to 1", id="count-0"
        ),
        pytest.param(_with("nodeGroups.0.cpu", "lots"), "nodeGroups[0].cpu", "quantity", id="bad-cpu"),
        pytest.param(
            _with("nodeGroups.0.memory", "2TB"), "nodeGroups[0].memory", "quantity", id="bad-memory"
        ),
        pytest.param(
            _with("nodeGroups.0.gpu.nvlinkDomainSize", 3),
            "nodeGroups[0].gpu",
            "does not divide",
            id="domain-3-of-8",
        ),
        pytest.param(
            _with("nodeGroups.0.gpu.clique", "nvl72"),
            "nodeGroups[0].gpu.clique",
            "ClusterUUID",
            id="bad-clique",
        ),
        pytest.param(
            _with("nodeGroups.0.gpu.product", "NVIDIA H100"),
            "nodeGroups[0].gpu.product",
            "label value",
            id="space-in-product",
        ),
        pytest.param(
            _with("nodeGroups.0.namePrefix", "GPU_Node"),
            "nodeGroups[0].namePrefix",
            "DNS label",
            id="bad-prefix",
        ),
        pytest.param(_with("nodeGroups.0.racks", []), "nodeGroups[0].racks", "at least 1", id="no-racks"),
        pytest.param(_with("nodeGroups.0.gpus", 8), "nodeGroups[0].gpus", "Extra inputs", id="unknown-field"),
        pytest.param(_with("nodeGroups.0.arch", "riscv"), "nodeGroups[0].arch", "amd64", id="bad-arch"),
        pytest.param(_with("name", "Big Cluster"), "name", "DNS label", id="bad-name"),
        pytest.param(
            _with("nodeGroups", _valid()["nodeGroups"] * 2),
            "(root)",
            "share namePrefix",
            id="duplicate-prefix",
        ),
    ],
)
def test_invalid_profiles_name_the_field(data: dict[str, Any], field: str, why: str) -> None:
    with pytest.raises(ProfileError) as caught:
        parse_profile(data, "test.yaml")
    message = str(caught.value)
    assert message.startswith("test.yaml: ")
    assert field in message
    assert why in message


def test_the_valid_base_profile_is_valid() -> None:
    assert parse_profile(_valid()).gpu_count == 16


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(ProfileError, match=r"known: .*dgx-h100"):
        load_profile("dgx-a100-superpod")


def test_profile_from_a_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(_valid()))
    assert load_profile(str(path)).node_names == ["gpu-0", "gpu-1"]


def test_missing_profile_path(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile(str(tmp_path / "absent.yaml"))


def test_profile_that_is_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ProfileError, match="a profile is a mapping"):
        load_profile(str(path))


@given(count=st.integers(1, 40), racks=st.integers(1, 8))
def test_nodes_fill_racks_in_order_and_evenly(count: int, racks: int) -> None:
    group = NodeGroup.model_validate(
        {**_valid()["nodeGroups"][0], "count": count, "racks": [f"r{i}" for i in range(racks)]}
    )
    assigned = [group.rack_of(i) for i in range(count)]
    order = [int(r[1:]) for r in assigned]
    assert order == sorted(order), "racks are filled in order"
    used = Counter(assigned)
    assert len(used) == min(count, racks)
    assert max(used.values()) - min(used.values()) <= 1


def test_gfd_nodes_carry_a_stock_gpu_operators_labels() -> None:
    """The simulated DGX H100 carries every GPU Operator label of the published DGX H100 node (drivers aside),
    with the same values: mig.strategy=single with MIG disabled, replicas 1, sharing none."""
    fixtures = yaml.safe_load((Path(__file__).parent / "data" / "gpu-nodes.yaml").read_text())
    published = next(f for f in fixtures if f["id"] == "gpu-operator-dgx-h100")["labels"]
    simulated = node_manifests(load_profile("dgx-h100"))[0]["metadata"]["labels"]
    expected = {k: v for k, v in published.items() if not k.startswith("nvidia.com/cuda.")}
    assert {k: simulated.get(k) for k in expected} == expected


def test_label_styles_profile_writes_each_style() -> None:
    nodes = {n["metadata"]["name"]: n for n in node_manifests(load_profile("label-styles"))}

    def labels(name: str) -> dict[str, str]:
        return dict(nodes[name]["metadata"]["labels"])

    def gpus(name: str) -> dict[str, str]:
        return {k: v for k, v in nodes[name]["status"]["allocatable"].items() if k.startswith("nvidia.com/")}

    shared = labels("style-time-sliced-0")
    assert shared[L.GPU_PRODUCT] == "NVIDIA-A100-SXM4-80GB-SHARED" and shared[L.GPU_REPLICAS] == "4"
    assert gpus("style-time-sliced-0") == {L.GPU_RESOURCE: "32"} and shared[L.GPU_COUNT] == "8"
    mig = labels("style-mig-0")
    assert mig[L.GPU_PRODUCT] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb" and mig[L.MIG_CONFIG] == "all-1g.5gb"
    assert gpus("style-mig-0") == {L.GPU_RESOURCE: "56"}
    assert not [k for k in labels("style-gke-0") if k.startswith("nvidia.com/")]
    assert labels("style-gke-0")[L.GKE_ACCELERATOR] == "nvidia-h100-80gb"
    assert labels("style-karpenter-0")[L.KARPENTER_GPU_MEMORY] == "81920"
    assert [k for k in labels("style-bare-0") if k.startswith("nvidia.com/")] == [L.GPU_RESOURCE]


def test_mixed_mig_offers_slices_and_no_whole_gpus() -> None:
    data = _with(
        "nodeGroups.0.gpu.mig", {"strategy": "mixed", "profile": "3g.40gb", "perGpu": 2, "memoryMib": 40192}
    )
    node = node_manifests(parse_profile(data))[0]
    assert node["status"]["allocatable"][L.GPU_RESOURCE] == "0"
    assert node["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] == "16"
    assert node["metadata"]["labels"][L.MIG_STRATEGY] == "mixed"


def test_a_cloud_label_style_needs_the_clouds_gpu_name() -> None:
    with pytest.raises(ProfileError, match="cloudName"):
        parse_profile(_with("nodeGroups.0.gpu.labelStyle", "gke"), "test.yaml")
