"""The node table of ``devcluster status``, read from Node objects."""

from __future__ import annotations

import pytest
from kubernetes import client

from verl_devtools.devcluster.nodes import NodeRow, format_table
from verl_devtools.devcluster.profiles import load_profile
from verl_operator.clusters.profile import node_manifests


def rows(profile: str, ready: bool = True) -> list[NodeRow]:
    out = []
    for manifest in node_manifests(load_profile(profile)):
        node = client.V1Node.model_validate(manifest)
        node.status.conditions = [client.V1NodeCondition(type="Ready", status="True" if ready else "False")]
        out.append(NodeRow.from_node(node))
    return out


def test_rows_show_what_the_planner_reads() -> None:
    a100 = rows("a100-pcie")[0]
    assert (a100.product, a100.gpus, a100.memory_mib, a100.nvlink_domain, a100.ready) == (
        "NVIDIA-A100-PCIE-40GB",
        8,
        40960,
        "2 (label)",
        True,
    )
    gb200 = rows("gb200-nvl72", ready=False)[0]
    assert gb200.clique.endswith(".1")
    assert gb200.nvlink_domain == "4 (derived)"
    assert gb200.ready is False


@pytest.mark.parametrize(
    ("profile", "domain"),
    [
        pytest.param("dgx-h100", "8 (derived)", id="sxm-nvswitch"),
        pytest.param("l40s", "1 (derived)", id="pcie-no-nvlink"),
        pytest.param("a100-pcie", "2 (label)", id="probed-bridges"),
    ],
)
def test_nvlink_domain_column_follows_docs_topology(profile: str, domain: str) -> None:
    assert {r.nvlink_domain for r in rows(profile)} == {domain}


def test_cpu_nodes_have_no_gpu_columns() -> None:
    cpu = [r for r in rows("mixed") if r.name.startswith("mixed-cpu")]
    assert cpu
    assert {(r.product, r.gpus, r.memory_mib, r.nvlink_domain) for r in cpu} == {("-", 0, None, "-")}


def test_table_has_a_header_and_aligned_columns() -> None:
    table = format_table(rows("dgx-h100")).splitlines()
    assert table[0].split() == [
        "NAME",
        "PRODUCT",
        "GPUS",
        "GPU",
        "MEMORY",
        "NVLINK",
        "DOMAIN",
        "CLIQUE",
        "RACK",
        "READY",
    ]
    assert len(table) == 5
    product_column = table[0].index("PRODUCT")
    assert all(line[product_column:].startswith("NVIDIA-H100-80GB-HBM3") for line in table[1:])
    assert [line.split()[-2] for line in table[1:]] == ["rack-a1", "rack-a1", "rack-a2", "rack-a2"]
