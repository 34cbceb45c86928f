"""GPU listings, the node probe (file and fake sources, a fake nvidia-smi executable) and the plan check."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from verl_contract.gpu_product import product_label
from verl_contract.launch_spec import LaunchSpec
from verl_launcher.check import check_node, check_nodes
from verl_launcher.gpus import GpuListParseError, parse_list_gpus, parse_query_gpu_csv
from verl_launcher.probe import NodeProbe, collect_probe, parse_gpu_listing
from verl_launcher.spec import parse_launch_spec

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
H100_QUERY = "".join(f"{i}, NVIDIA H100 80GB HBM3, 81559 MiB\n" for i in range(8))


def test_query_csv() -> None:
    gpus = parse_query_gpu_csv(
        "index, name, memory.total [MiB]\n1, NVIDIA L40S, 46068 MiB\n0, NVIDIA L40S, 46068\n"
    )
    assert [(g.index, g.name, g.memory_mib) for g in gpus] == [
        (0, "NVIDIA L40S", 46068),
        (1, "NVIDIA L40S", 46068),
    ]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        pytest.param("0, NVIDIA L40S\n", "got 2 field", id="two-fields"),
        pytest.param("x, NVIDIA L40S, 1 MiB\n", "index 'x'", id="bad-index"),
        pytest.param("0, NVIDIA L40S, [N/A]\n", "memory.total '[N/A]'", id="bad-memory"),
    ],
)
def test_query_csv_errors(text: str, needle: str) -> None:
    with pytest.raises(GpuListParseError, match=needle.replace("[", r"\[")):
        parse_query_gpu_csv(text)


def test_list_gpus_fixture() -> None:
    gpus = parse_list_gpus((FIXTURES / "h100_8gpu_vm_nv18_no_nics.nvidia-smi-L.txt").read_text())
    assert [g.index for g in gpus] == list(range(8))
    assert {g.name for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert gpus[0].uuid == "GPU-c7a0294c-c2c2-5476-438c-fb468eaa223b" and gpus[0].memory_mib is None


def test_list_gpus_mig_and_errors() -> None:
    text = "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-1)\n  MIG 1g.5gb     Device  0: (UUID: MIG-a)\n  MIG 1g.5gb     Device  1: (UUID: MIG-b)\n"
    assert parse_list_gpus(text)[0].mig_devices == 2
    with pytest.raises(GpuListParseError, match="line 1"):
        parse_list_gpus("No devices found\n")


def test_listing_kind_is_detected() -> None:
    assert parse_gpu_listing("GPU 0: NVIDIA L4 (UUID: GPU-9)\n")[0].name == "NVIDIA L4"
    assert parse_gpu_listing("0, NVIDIA L4, 23034 MiB\n")[0].memory_mib == 23034


def test_product_label_is_gfd_spelling() -> None:
    assert product_label("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"


def test_collect_from_files(tmp_path: Path) -> None:
    query = tmp_path / "q.csv"
    query.write_text(H100_QUERY)
    env = {
        "VERL_LAUNCHER_GPU_QUERY_FILE": str(query),
        "VERL_LAUNCHER_TOPO_FILE": str(FIXTURES / "h100_sxm_8gpu_nv18_mlx5_empty_cpu_affinity.txt"),
        "POD_NAME": "demo-worker-1",
        "POD_IP": "10.0.0.7",
    }
    probe = collect_probe(env)
    assert probe.errors == () and probe.source == "file"
    assert probe.node == "demo-worker-1" and probe.ip == "10.0.0.7"
    doc = probe.to_dict()
    assert (
        doc["gpuCount"] == 8
        and doc["nvlinkDomainSize"] == 8
        and doc["gpus"][0]["product"] == "NVIDIA-H100-80GB-HBM3"
    )
    assert doc["nvlinkDomains"] == [{"gpus": list(range(8)), "allToAll": True, "minLinks": 18}]


def test_collect_with_a_fake_nvidia_smi(tmp_path: Path) -> None:
    """A stand-in executable answers the two argv lists the probe runs."""
    topo = FIXTURES / "a100_pcie_4gpu_nvlink_bridge_pairs_nv12.txt"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = topo ] && [ "$2" = -m ]; then cat ' + str(topo) + "; exit 0; fi\n"
        'if [ "$1" = --query-gpu=index,name,memory.total ] && [ "$2" = --format=csv,noheader ]; then\n'
        '  for i in 0 1 2 3; do echo "$i, NVIDIA A100 80GB PCIe, 81920 MiB"; done; exit 0; fi\n'
        "echo unexpected arguments >&2; exit 3\n"
    )
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    probe = collect_probe({"VERL_LAUNCHER_NVIDIA_SMI": str(smi), "VERL_LAUNCHER_NODE_NAME": "n1"})
    assert probe.errors == ()
    assert len(probe.gpus) == 4 and probe.nvlink_domain_size == 2


def test_collect_reports_failures_instead_of_raising(tmp_path: Path) -> None:
    probe = collect_probe(
        {"VERL_LAUNCHER_NVIDIA_SMI": str(tmp_path / "absent"), "VERL_LAUNCHER_NODE_NAME": "n1"}
    )
    assert probe.gpus == () and probe.topology is None
    assert len(probe.errors) == 1 and probe.errors[0].startswith("GPU listing:")
    bad = tmp_path / "topo.txt"
    bad.write_text("garbage\n")
    probe = collect_probe({"VERL_LAUNCHER_FAKE_GPUS": "2", "VERL_LAUNCHER_TOPO_FILE": str(bad)})
    assert probe.source == "fake" and len(probe.gpus) == 2
    assert probe.errors and "no header line" in probe.errors[0]


def test_collect_flags_count_disagreement(tmp_path: Path) -> None:
    env = {
        "VERL_LAUNCHER_FAKE_GPUS": "4",
        "VERL_LAUNCHER_TOPO_FILE": str(FIXTURES / "h100_8gpu_vm_nv18_no_nics.txt"),
    }
    assert collect_probe(env).errors == ("topology shows 8 GPUs but the listing shows 4",)


def spec_for(gpus: int, expect: dict[str, Any]) -> LaunchSpec:
    return parse_launch_spec(
        {
            "apiVersion": "verl-operator.io/v1alpha1",
            "kind": "LaunchSpec",
            "job": {"name": "j", "namespace": "n"},
            "verlVersion": "0.9",
            "nnodes": 1,
            "gpusPerNode": gpus,
            "head": {"host": "h"},
            "entrypoint": ["python3"],
            "expect": expect,
        }
    )


def probe_from(topo_file: str, gpus: int, name: str, memory: int, tmp_path: Path) -> NodeProbe:
    query = tmp_path / f"{topo_file}.csv"
    query.write_text("".join(f"{i}, {name}, {memory} MiB\n" for i in range(gpus)))
    return collect_probe(
        {
            "VERL_LAUNCHER_GPU_QUERY_FILE": str(query),
            "VERL_LAUNCHER_TOPO_FILE": str(FIXTURES / topo_file),
            "VERL_LAUNCHER_NODE_NAME": "w1",
            "POD_IP": "10.1.0.2",
        }
    )


H100 = {
    "gpuProduct": "NVIDIA-H100-80GB-HBM3",
    "gpuMemoryMiB": 81559,
    "requireNvlink": True,
    "nvlinkGroupSize": 8,
}


@pytest.mark.parametrize(
    ("topo_file", "gpus", "name", "memory", "spec_gpus", "expect", "needles"),
    [
        pytest.param(
            "h100_8gpu_vm_nv18_no_nics.txt", 8, "NVIDIA H100 80GB HBM3", 81559, 8, H100, [], id="h100-matches"
        ),
        pytest.param(
            "h100_8gpu_vm_nv18_no_nics.txt",
            8,
            "NVIDIA H100 80GB HBM3",
            81559,
            8,
            {**H100, "gpuProduct": "NVIDIA-H100-80GB-HBM3-SHARED"},
            [],
            id="gfd-shared-suffix",
        ),
        pytest.param(
            "h100_8gpu_vm_nv18_no_nics.txt",
            8,
            "NVIDIA H100 80GB HBM3",
            80000,
            8,
            H100,
            [],
            id="memory-within-2pct",
        ),
        pytest.param(
            "h100_8gpu_vm_nv18_no_nics.txt",
            8,
            "NVIDIA H100 80GB HBM3",
            40960,
            8,
            H100,
            ["GPU(s) 0,1,2,3,4,5,6,7 have 40960 MiB, the plan expects 81559 MiB"],
            id="memory-differs",
        ),
        pytest.param(
            "dgx_a100_8gpu_nv12_mlx5_tabs.txt",
            8,
            "NVIDIA A100-SXM4-80GB",
            81920,
            8,
            H100,
            ["are NVIDIA-A100-SXM4-80GB, the plan expects NVIDIA-H100-80GB-HBM3"],
            id="product-differs",
        ),
        pytest.param(
            "h100_6gpu_subset_nv18_2nic.txt",
            6,
            "NVIDIA H100 80GB HBM3",
            81559,
            8,
            {**H100, "nvlinkGroupSize": 2},
            ["has 6 GPUs, the plan expects 8"],
            id="count-differs",
        ),
        pytest.param(
            "l40s_8gpu_pcie_only_node_sys.txt",
            8,
            "NVIDIA L40S",
            46068,
            8,
            {"requireNvlink": True, "nvlinkGroupSize": 2},
            [
                "GPUs 0,1 (an NVLink group of 2",
                "GPUs 6,7 (an NVLink group of 2",
                "NVLink domains: {0} {1} {2}",
            ],
            id="l40s-no-nvlink",
        ),
        pytest.param(
            "l40s_8gpu_pcie_only_node_sys.txt",
            8,
            "NVIDIA L40S",
            46068,
            8,
            {"requireNvlink": False, "nvlinkGroupSize": 2},
            [],
            id="nvlink-not-required",
        ),
        pytest.param(
            "a100_pcie_4gpu_nvlink_bridge_pairs_nv12.txt",
            4,
            "NVIDIA A100 80GB PCIe",
            81920,
            4,
            {"requireNvlink": True, "nvlinkGroupSize": 2},
            [],
            id="bridge-pairs-tp2",
        ),
        pytest.param(
            "a100_pcie_4gpu_nvlink_bridge_pairs_nv12.txt",
            4,
            "NVIDIA A100 80GB PCIe",
            81920,
            4,
            {"requireNvlink": True, "nvlinkGroupSize": 4},
            [
                "GPUs 0,1,2,3 (an NVLink group of 4, expect.nvlinkGroupSize) are not all NVLink-connected; NVLink domains: {0,1} {2,3}"
            ],
            id="bridge-pairs-tp4",
        ),
        pytest.param(
            "dgx1_v100_8gpu_hybrid_cube_mesh_nv1_nv2.txt",
            8,
            "Tesla V100-SXM2-16GB",
            16160,
            8,
            {"requireNvlink": True, "nvlinkGroupSize": 4},
            [],
            id="dgx1-tp4-quads",
        ),
        pytest.param(
            "dgx1_v100_8gpu_hybrid_cube_mesh_nv1_nv2.txt",
            8,
            "Tesla V100-SXM2-16GB",
            16160,
            8,
            {"requireNvlink": True, "nvlinkGroupSize": 8},
            ["GPUs 0,1,2,3,4,5,6,7"],
            id="dgx1-tp8-not-all-to-all",
        ),
        pytest.param(
            "3gpu_one_nv4_pair_plus_lone_gpu_2nic.txt",
            3,
            "GPU",
            24000,
            3,
            {"requireNvlink": True, "nvlinkGroupSize": 2},
            ["gpusPerNode 3 is not a multiple of nvlinkGroupSize 2"],
            id="group-does-not-divide",
        ),
    ],
)
def test_check_node(
    topo_file: str,
    gpus: int,
    name: str,
    memory: int,
    spec_gpus: int,
    expect: dict[str, Any],
    needles: list[str],
    tmp_path: Path,
) -> None:
    problems = check_node(probe_from(topo_file, gpus, name, memory, tmp_path), spec_for(spec_gpus, expect))
    assert bool(problems) == bool(needles), problems
    assert all(p.startswith("node w1 (10.1.0.2): ") for p in problems)
    for needle in needles:
        assert any(needle in p for p in problems), (needle, problems)


def test_unknown_topology_fails_when_nvlink_is_required() -> None:
    probe = NodeProbe(node="w2", gpus=parse_query_gpu_csv("0, G, 1 MiB\n1, G, 1 MiB\n"))
    problems = check_nodes([probe], spec_for(2, {"requireNvlink": True, "nvlinkGroupSize": 2}))
    assert problems == [
        "node w2: the NVLink topology is unknown (no `nvidia-smi topo -m`), the plan requires it"
    ]


def test_probe_errors_are_reported_per_node() -> None:
    probes = [
        NodeProbe(node="a", errors=("GPU listing: boom",)),
        NodeProbe(node="b", gpus=parse_query_gpu_csv("0, G, 1\n")),
    ]
    problems = check_nodes(probes, spec_for(1, {}))
    assert problems == ["node a: GPU listing: boom", "node a: has 0 GPUs, the plan expects 1 (gpusPerNode)"]


def test_env_is_not_read_from_the_process_when_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_LAUNCHER_FAKE_GPUS", "9")
    probe = collect_probe({"VERL_LAUNCHER_FAKE_GPUS": "3", "VERL_LAUNCHER_NODE_NAME": "x"})
    assert probe.node == "x" and len(probe.gpus) == 3
