"""The nvidia-smi topo -m parser on real outputs (expected domains from fixtures/nvidia-smi/SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verl_launcher.topology import Topology, TopologyParseError, parse_topo_matrix

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"

# (file, GPUs, multi-GPU NVLink domains, smallest domain of any GPU, all-to-all per domain, NIC names or None,
#  a NUMA affinity of GPU0 or None when the columns are dropped)
TABLE = [
    pytest.param(
        "hgx_8gpu_nv18_13nic_mlx5_ib_eth.txt", 8, [tuple(range(8))], 8, [True], 13, "0", id="hgx-nv18-13nic"
    ),
    pytest.param(
        "h100_sxm_8gpu_nv18_mlx5_empty_cpu_affinity.txt",
        8,
        [tuple(range(8))],
        8,
        [True],
        6,
        "0",
        id="h100-sxm-empty-cpu",
    ),
    pytest.param(
        "h100_8gpu_vm_nv18_no_nics.txt", 8, [tuple(range(8))], 8, [True], 0, "0", id="h100-vm-no-nics"
    ),
    pytest.param(
        "nv18_8gpu_header_missing_leading_tab_4numa.txt",
        8,
        [tuple(range(8))],
        8,
        [True],
        2,
        "0",
        id="nv18-header-no-tab",
    ),
    pytest.param(
        "dgx_a100_8gpu_nv12_mlx5_tabs.txt", 8, [tuple(range(8))], 8, [True], 12, "3", id="dgx-a100-mlx5"
    ),
    pytest.param(
        "h100_4gpu_hgx_nv6_4nic_partial_legend.txt", 4, [(0, 1, 2, 3)], 4, [True], 4, "3", id="h100-4gpu-nv6"
    ),
    pytest.param(
        "h100_6gpu_subset_nv18_2nic.txt", 6, [tuple(range(6))], 6, [True], 2, "0", id="h100-6gpu-subset"
    ),
    pytest.param(
        "a100_pcie_4gpu_nvlink_bridge_pairs_nv12.txt",
        4,
        [(0, 1), (2, 3)],
        2,
        [True, True],
        0,
        "0",
        id="a100-pcie-bridge-pairs",
    ),
    pytest.param(
        "ibm_ac922_v100_4gpu_nv3_pairs_traverse.txt",
        4,
        [(0, 1), (2, 3)],
        2,
        [True, True],
        4,
        "0",
        id="ac922-nv3-pairs",
    ),
    pytest.param(
        "3gpu_one_nv4_pair_plus_lone_gpu_2nic.txt", 3, [(0, 1)], 1, [True], 2, "1", id="3gpu-pair-plus-lone"
    ),
    pytest.param("l40s_8gpu_pcie_only_node_sys.txt", 8, [], 1, [], 1, "0", id="l40s-pcie-only"),
    pytest.param("a100_pcie_2gpu_no_nvlink_della.txt", 2, [], 1, [], 2, "0", id="a100-pcie-no-nvlink"),
    pytest.param("gtx1080ti_2gpu_workstation_phb.txt", 2, [], 1, [], 0, "", id="gtx1080ti-phb"),
    pytest.param(
        "dgx1_v100_8gpu_hybrid_cube_mesh_nv1_nv2.txt",
        8,
        [tuple(range(8))],
        8,
        [False],
        1,
        "",
        id="dgx1-cube-mesh",
    ),
    pytest.param(
        "malformed_a100_8gpu_nv12_collapsed_nic_columns.txt",
        8,
        [tuple(range(8))],
        8,
        [True],
        None,
        None,
        id="malformed-collapsed-nic",
    ),
    pytest.param(
        "malformed_6gpu_pcie_prompt_line_in_paste.txt", 6, [], 1, [], 0, "0", id="malformed-prompt-line"
    ),
]


@pytest.mark.parametrize(("name", "gpus", "domains", "smallest", "all_to_all", "nics", "numa0"), TABLE)
def test_fixture_domains(
    name: str,
    gpus: int,
    domains: list[tuple[int, ...]],
    smallest: int,
    all_to_all: list[bool],
    nics: int | None,
    numa0: str | None,
) -> None:
    topo = parse_topo_matrix((FIXTURES / name).read_text(encoding="utf-8"))
    assert topo.gpu_count == gpus
    multi = [d for d in topo.nvlink_domains if d.size > 1]
    assert [d.gpus for d in multi] == domains
    assert [d.all_to_all for d in multi] == all_to_all
    assert topo.nvlink_domain_size == smallest
    if nics is None:
        assert topo.nics == () and topo.affinity == ()
        assert any("do not line up" in w for w in topo.warnings)
    else:
        assert len(topo.nics) == nics
        assert len(topo.affinity) == gpus
        assert topo.affinity[0].numa_affinity == numa0


def test_every_fixture_is_in_the_table() -> None:
    listed = {p.values[0] for p in TABLE}
    on_disk = {p.name for p in FIXTURES.glob("*.txt") if not p.name.endswith(".nvidia-smi-L.txt")}
    assert listed == on_disk


def test_dgx1_cliques_are_the_two_quads() -> None:
    topo = parse_topo_matrix((FIXTURES / "dgx1_v100_8gpu_hybrid_cube_mesh_nv1_nv2.txt").read_text())
    assert topo.nvlinked((0, 1, 2, 3)) and topo.nvlinked((4, 5, 6, 7))
    assert not topo.nvlinked((0, 1, 4, 5))
    assert topo.nvlink_width(0, 4) == 2 and topo.nvlink_width(2, 6) == 1 and topo.nvlink_width(0, 5) == 0
    assert topo.nvlink_domains[0].min_links == 1


def test_nic_legend_resolves_names() -> None:
    topo = parse_topo_matrix((FIXTURES / "hgx_8gpu_nv18_13nic_mlx5_ib_eth.txt").read_text())
    assert all(not n.startswith("NIC") for n in topo.nics)
    assert topo.nics[0].startswith("mlx5")


def test_empty_cpu_affinity_is_kept_empty() -> None:
    topo = parse_topo_matrix((FIXTURES / "h100_sxm_8gpu_nv18_mlx5_empty_cpu_affinity.txt").read_text())
    assert [a.cpu_affinity for a in topo.affinity] == ["", "", "", "", "1", "1", "1", "1"]
    assert [a.numa_affinity for a in topo.affinity] == ["0"] * 4 + ["1"] * 4


def test_prompt_line_is_reported() -> None:
    topo = parse_topo_matrix((FIXTURES / "malformed_6gpu_pcie_prompt_line_in_paste.txt").read_text())
    assert topo.warnings == ("skipped 1 line(s) above the header",)


GOOD = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-7\nGPU1\tNV4\t X \t0-7\n"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        pytest.param("", "no header line", id="empty"),
        pytest.param("No devices were found\n", "no header line", id="no-devices"),
        pytest.param(
            GOOD.replace("GPU1\tNV4\t X \t0-7\n", ""), "names 2 GPUs but 1 GPU rows", id="truncated"
        ),
        pytest.param(GOOD.replace("GPU1\tNV4", "GPU1\tSYS"), "not symmetric", id="asymmetric"),
        pytest.param(GOOD.replace("\tNV4\t0-7", "\tNVX\t0-7"), "'NVX', not a link code", id="bad-cell"),
        pytest.param(GOOD.replace("GPU0\t X ", "GPU0\tSYS"), "GPU0 x GPU0 is 'SYS'", id="diagonal"),
        pytest.param(GOOD.replace("\nGPU1\t", "\nGPU2\t"), "expected row GPU1, found GPU2", id="row-order"),
        pytest.param(GOOD.replace("\tNV4\t X \t0-7", "\tNV4"), "GPU1 has 1 cells", id="short-row"),
    ],
)
def test_malformed_input_gives_a_clear_error(text: str, needle: str) -> None:
    with pytest.raises(TopologyParseError, match=needle.replace("(", r"\(")):
        parse_topo_matrix(text)


def test_good_minimal_matrix() -> None:
    topo = parse_topo_matrix(GOOD)
    assert topo.gpu_count == 2 and topo.nvlink_domain_size == 2 and topo.affinity[1].cpu_affinity == "0-7"


def render(links: list[list[str]], sep: str) -> str:
    n = len(links)
    header = sep + sep.join(f"GPU{i}" for i in range(n)) + sep + "CPU Affinity" + sep + "NUMA Affinity"
    rows = [f"GPU{i}" + sep + sep.join(links[i]) + sep + "0-7" + sep + "0" for i in range(n)]
    return "\n".join([header, *rows, "", "Legend:", "", "  X    = Self"]) + "\n"


@st.composite
def matrices(draw: st.DrawFn) -> list[list[str]]:
    n = draw(st.integers(min_value=1, max_value=10))
    codes = st.sampled_from(["NV1", "NV4", "NV12", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS"])
    links = [["X"] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            links[a][b] = links[b][a] = draw(codes)
    return links


@given(matrices(), st.sampled_from(["\t", "    "]))
def test_domains_partition_the_gpus_and_follow_every_link(links: list[list[str]], sep: str) -> None:
    topo: Topology = parse_topo_matrix(render(links, sep))
    n = len(links)
    assert [list(row) for row in topo.links] == links
    seen = sorted(g for d in topo.nvlink_domains for g in d.gpus)
    assert seen == list(range(n))
    where = {g: i for i, d in enumerate(topo.nvlink_domains) for g in d.gpus}
    for a in range(n):
        for b in range(n):
            if links[a][b].startswith("NV"):
                assert where[a] == where[b]
    for domain in topo.nvlink_domains:
        assert domain.all_to_all == topo.nvlinked(domain.gpus)
    assert topo.nvlink_domain_size == min(d.size for d in topo.nvlink_domains)
