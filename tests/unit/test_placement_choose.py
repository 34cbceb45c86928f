"""Concrete node placement: tables for each rule, the tie-break order, and invariants (hypothesis)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_operator.placement import NodeCapacity, PlacementRequest, place
from verl_operator.placement.choose import screen_node
from verl_operator.placement.model import MAX_EXCLUDED_IN_STATUS

H100 = "NVIDIA-H100-80GB-HBM3"
L40S = "NVIDIA-L40S"
RACK = "topology.kubernetes.io/rack"


def make_nodes(
    count: int,
    gpus: int = 8,
    product: str = H100,
    prefix: str = "n",
    nvlink: int | None = None,
    racks: int = 1,
    clique: str | None = None,
) -> list[NodeCapacity]:
    """``count`` identical nodes spread round-robin over ``racks`` racks (r0, r1, ...)."""
    return [
        NodeCapacity(
            name=f"{prefix}{i}",
            labels={RACK: f"r{i % racks}", "nvidia.com/gpu.product": product},
            gpus=gpus,
            gpu_product=product,
            nvlink_domain_size=gpus if nvlink is None else nvlink,
            clique=clique,
        )
        for i in range(count)
    ]


def dgx_racks() -> list[NodeCapacity]:
    """4 DGX nodes, 2 racks: rack-a holds dgx-0, dgx-2; rack-b holds dgx-1, dgx-3."""
    return make_nodes(4, prefix="dgx-", racks=2)


@pytest.mark.parametrize(
    ("request_", "used", "expected_nodes", "expected_domain"),
    [
        pytest.param(
            PlacementRequest(nnodes=2, gpus_per_node=8, topology_key=RACK, topology_policy="required"),
            {},
            ("dgx-0", "dgx-2"),
            "r0",
            id="dgx-16gpu-rack-required-empty-cluster-first-rack",
        ),
        pytest.param(
            PlacementRequest(nnodes=2, gpus_per_node=8, topology_key=RACK, topology_policy="required"),
            {"dgx-0": 8},
            ("dgx-1", "dgx-3"),
            "r1",
            id="dgx-16gpu-rack-required-skips-half-busy-rack",
        ),
        pytest.param(
            PlacementRequest(nnodes=2, gpus_per_node=8, topology_key=RACK, topology_policy="preferred"),
            {"dgx-0": 8, "dgx-1": 8},
            ("dgx-2", "dgx-3"),
            None,
            id="dgx-preferred-falls-back-across-racks",
        ),
        pytest.param(
            PlacementRequest(nnodes=1, gpus_per_node=4),
            {"dgx-0": 2, "dgx-1": 4, "dgx-2": 0},
            ("dgx-1",),
            None,
            id="best-fit-fewest-free-gpus-first",
        ),
        pytest.param(
            PlacementRequest(nnodes=1, gpus_per_node=8, candidates=frozenset({"dgx-3"})),
            {},
            ("dgx-3",),
            None,
            id="only-plan-candidates",
        ),
    ],
)
def test_place_table(
    request_: PlacementRequest,
    used: dict[str, int],
    expected_nodes: tuple[str, ...],
    expected_domain: str | None,
) -> None:
    result = place(request_, dgx_racks(), used)
    assert result.feasible, result.message
    assert result.nodes == expected_nodes
    assert result.domain == expected_domain


@pytest.mark.parametrize(
    ("request_", "node", "used", "fragment"),
    [
        pytest.param(
            PlacementRequest(nnodes=1, gpus_per_node=4, gpu_product=H100),
            make_nodes(1, gpus=4, product=L40S, nvlink=1)[0],
            0,
            "GPU product NVIDIA-L40S, job needs NVIDIA-H100-80GB-HBM3",
            id="product",
        ),
        pytest.param(
            PlacementRequest(nnodes=1, gpus_per_node=4, node_selector={"pool": "rl"}),
            make_nodes(1)[0],
            0,
            "label pool=rl missing",
            id="selector",
        ),
        pytest.param(
            PlacementRequest(nnodes=1, gpus_per_node=4, nvlink_required=True, nvlink_group_size=2),
            make_nodes(1, gpus=4, product=L40S, nvlink=1)[0],
            0,
            "NVLink domain of 1 GPUs, job needs 2 GPUs per NVLink group",
            id="l40s-nvlink-tp2",
        ),
        pytest.param(
            PlacementRequest(nnodes=1, gpus_per_node=4, nvlink_required=True, nvlink_group_size=2),
            make_nodes(1, gpus=8, nvlink=2)[0],
            0,
            "must take the whole node (8)",
            id="a100-pairs-partial-node",
        ),
        pytest.param(
            PlacementRequest(nnodes=2, gpus_per_node=4, nvlink_required=True, nvlink_group_size=8),
            make_nodes(1, gpus=4)[0],
            0,
            "no nvidia.com/gpu.clique",
            id="multi-node-group-without-clique",
        ),
        pytest.param(
            PlacementRequest(nnodes=1, gpus_per_node=8),
            make_nodes(1)[0],
            3,
            "5 of 8 GPUs free, job needs 8 per node",
            id="busy",
        ),
        pytest.param(
            PlacementRequest(nnodes=1, gpus_per_node=8, topology_key="block", topology_policy="required"),
            make_nodes(1)[0],
            0,
            "no block label",
            id="topology-label-missing",
        ),
        pytest.param(
            PlacementRequest(nnodes=1, gpus_per_node=8),
            NodeCapacity(name="x", gpus=8, schedulable=False),
            0,
            "not schedulable",
            id="cordoned",
        ),
    ],
)
def test_screen_node_reasons(
    request_: PlacementRequest, node: NodeCapacity, used: int, fragment: str
) -> None:
    reason = screen_node(request_, node, used)
    assert reason is not None and fragment in reason


def test_nvlink_pairs_whole_node_is_accepted() -> None:
    request = PlacementRequest(nnodes=1, gpus_per_node=8, nvlink_required=True, nvlink_group_size=2)
    assert screen_node(request, make_nodes(1, gpus=8, nvlink=2)[0], 0) is None


def test_gb200_16_gpus_stay_in_one_clique() -> None:
    nodes = make_nodes(3, gpus=4, prefix="a-", clique="c.1") + make_nodes(
        18, gpus=4, prefix="b-", clique="c.2"
    )
    request = PlacementRequest(nnodes=4, gpus_per_node=4, nvlink_required=True, nvlink_group_size=16)
    result = place(request, nodes, {})
    assert result.feasible
    assert result.clique == "c.2"
    assert all(n.startswith("b-") for n in result.nodes)


def test_gb200_clique_too_small_waits_with_reason() -> None:
    nodes = make_nodes(3, gpus=4, prefix="a-", clique="c.1") + make_nodes(
        3, gpus=4, prefix="b-", clique="c.2"
    )
    request = PlacementRequest(nnodes=4, gpus_per_node=4, nvlink_required=True, nvlink_group_size=16)
    result = place(request, nodes, {})
    assert not result.feasible and result.nodes == ()
    assert "one NVLink clique" in result.message and "at most 3 together" in result.message


def test_rack_required_never_spans_racks() -> None:
    request = PlacementRequest(nnodes=2, gpus_per_node=8, topology_key=RACK, topology_policy="required")
    result = place(request, dgx_racks(), {"dgx-0": 1, "dgx-1": 1})
    assert not result.feasible
    assert "one topology.kubernetes.io/rack domain" in result.message
    assert ("dgx-0", "7 of 8 GPUs free, job needs 8 per node") in result.excluded


def test_tie_break_order_is_fewest_spare_then_name() -> None:
    """Named tie-break test: tightest group first, then group key; inside, fewest free GPUs then name."""
    nodes = make_nodes(6, prefix="n", racks=3)  # r0: n0 n3, r1: n1 n4, r2: n2 n5
    request = PlacementRequest(nnodes=2, gpus_per_node=4, topology_key=RACK, topology_policy="required")
    # r1 has 4 spare GPUs after placement, r0 and r2 have 8: r1 wins.
    assert place(request, nodes, {"n1": 4, "n4": 4}).nodes == ("n1", "n4")
    # all equal: r0 wins by name.
    assert place(request, nodes, {}).domain == "r0"


BLOCK = "network.topology.nvidia.com/spine"


def test_without_a_policy_a_multi_node_job_takes_the_smallest_domain_that_holds_it() -> None:
    """The preferred domains in turn: one rack, else one block of racks, else anywhere; a single node is
    placed best-fit across the cluster as before."""
    nodes = [
        NodeCapacity(
            name=f"h{i}",
            labels={RACK: f"r{i // 4}", BLOCK: "b0" if i < 8 else "b1"},
            gpus=8,
            gpu_product=H100,
            nvlink_domain_size=8,
        )
        for i in range(12)
    ]  # r0: h0-h3 and r1: h4-h7 in block b0, r2: h8-h11 in b1
    request = PlacementRequest(nnodes=4, gpus_per_node=8, preferred_domains=(RACK, BLOCK))
    plain = PlacementRequest(nnodes=4, gpus_per_node=8)
    # every rack holds the job and none is tighter: the first by name
    assert place(request, nodes, {}).nodes == ("h0", "h1", "h2", "h3")
    # h0 and h10 busy: r0 and r2 keep 3 nodes each, r1 holds the job
    placed = place(request, nodes, {"h0": 8, "h10": 8})
    assert placed.nodes == ("h4", "h5", "h6", "h7") and placed.domain == "r1"
    assert f"{RACK}=r1" in placed.message
    # without the preference the same snapshot spans racks
    assert place(plain, nodes, {"h0": 8, "h10": 8}).nodes == ("h1", "h11", "h2", "h3")
    # no rack holds 4 (one busy node in each): block b0 does (6 free nodes), the tightest fit inside it
    busy = {"h0": 8, "h4": 8, "h8": 8}
    across = place(request, nodes, busy)
    assert across.domain == "b0" and set(across.nodes) <= {f"h{i}" for i in range(8)}
    # nor any block (3 free nodes in each): anywhere
    busy = {"h0": 8, "h1": 8, "h2": 8, "h4": 8, "h5": 8, "h8": 8}
    assert place(request, nodes, busy).domain is None and place(request, nodes, busy).feasible
    # one node: the best fit of the whole cluster, whatever its rack
    single = PlacementRequest(nnodes=1, gpus_per_node=4, preferred_domains=(RACK, BLOCK))
    assert place(single, nodes, {"h9": 4}).nodes == ("h9",)
    # nodes without the labels: the preference is empty and the job is placed as before
    unlabelled = make_nodes(4, prefix="n")
    bare = [NodeCapacity(name=n.name, labels={}, gpus=8, gpu_product=H100) for n in unlabelled]
    assert place(request, bare, {}) == place(plain, bare, {})


def test_a_topology_policy_replaces_the_preferred_domains() -> None:
    request = PlacementRequest(
        nnodes=2, gpus_per_node=8, topology_key=RACK, topology_policy="required", preferred_domains=(BLOCK,)
    )
    assert place(request, dgx_racks(), {}).domain == "r0"


NODE_SETS = st.lists(
    st.tuples(st.sampled_from([4, 8]), st.integers(0, 8), st.sampled_from(["r0", "r1", "r2"])),
    min_size=1,
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(
    node_set=NODE_SETS,
    nnodes=st.integers(1, 5),
    gpus_per_node=st.sampled_from([1, 2, 4, 8]),
    policy=st.sampled_from([None, "required", "preferred"]),
    seed=st.integers(0, 1000),
)
def test_placement_invariants(
    node_set: list[tuple[int, int, str]], nnodes: int, gpus_per_node: int, policy: str | None, seed: int
) -> None:
    nodes = [
        NodeCapacity(name=f"n{i:02d}", labels={RACK: rack}, gpus=gpus, nvlink_domain_size=gpus)
        for i, (gpus, _, rack) in enumerate(node_set)
    ]
    used = {f"n{i:02d}": min(u, gpus) for i, (gpus, u, _) in enumerate(node_set)}
    request = PlacementRequest(
        nnodes=nnodes,
        gpus_per_node=gpus_per_node,
        topology_key=RACK if policy else None,
        topology_policy=policy,  # type: ignore[arg-type]
    )
    result = place(request, nodes, used)
    shuffled = list(nodes)
    random.Random(seed).shuffle(shuffled)
    assert place(request, shuffled, used) == result, "placement depends on input order"
    by_name = {n.name: n for n in nodes}
    if result.feasible:
        assert len(result.nodes) == nnodes == len(set(result.nodes))
        for name in result.nodes:
            assert by_name[name].gpus - used[name] >= gpus_per_node
        if policy == "required":
            assert len({by_name[n].labels[RACK] for n in result.nodes}) == 1
    else:
        assert result.nodes == ()
        fits = [n for n in nodes if n.gpus - used[n.name] >= gpus_per_node]
        if policy == "required":
            per_rack = [sum(1 for n in fits if n.labels[RACK] == r) for r in ("r0", "r1", "r2")]
            assert max(per_rack) < nnodes
        else:
            assert len(fits) < nnodes


@settings(max_examples=100, deadline=None)
@given(
    cliques=st.lists(st.sampled_from(["c.1", "c.2", None]), min_size=1, max_size=14),
    busy=st.lists(st.integers(0, 4), min_size=14, max_size=14),
    nnodes=st.integers(2, 6),
)
def test_multi_node_nvlink_groups_share_one_clique(
    cliques: list[str | None], busy: list[int], nnodes: int
) -> None:
    nodes = [
        NodeCapacity(name=f"g{i:02d}", gpus=4, nvlink_domain_size=4, clique=c) for i, c in enumerate(cliques)
    ]
    used = {n.name: busy[i] for i, n in enumerate(nodes)}
    request = PlacementRequest(nnodes=nnodes, gpus_per_node=4, nvlink_required=True, nvlink_group_size=8)
    result = place(request, nodes, used)
    by_name = {n.name: n for n in nodes}
    free_per_clique = {
        c: sum(1 for n in nodes if n.clique == c and used[n.name] == 0) for c in ("c.1", "c.2")
    }
    assert result.feasible == (max(free_per_clique.values()) >= nnodes)
    if result.feasible:
        assert {by_name[n].clique for n in result.nodes} == {result.clique}
        assert result.clique is not None


def test_request_from_plan_reads_the_plan_contract_and_the_spec() -> None:
    from conftest import make_nodes, make_spec

    from verl_operator.api.spec import VerlJobSpec
    from verl_operator.placement import request_from_plan
    from verl_operator.planner import plan_job

    spec = VerlJobSpec.model_validate(
        {
            "verl": {"image": "i"},
            "model": {"path": "m"},
            "resources": {"gpus": 16, "gpuProduct": H100, "nodeSelector": {"pool": "rl"}},
            "placement": {"nvlink": "required", "topologyKey": RACK, "topologyPolicy": "preferred"},
        }
    )
    planned = plan_job(make_spec(16), make_nodes(3)).plan
    assert planned is not None
    plan = planned.model_copy(update={"nnodes": 2, "gpus_per_node": 8, "nvlink_group_size": 2})
    assert request_from_plan(plan, spec, frozenset({"a", "b", "c"})) == PlacementRequest(
        nnodes=2,
        gpus_per_node=8,
        candidates=frozenset({"a", "b", "c"}),
        gpu_product=H100,
        node_selector={"pool": "rl"},
        nvlink_required=True,
        nvlink_group_size=2,
        topology_key=RACK,
        topology_policy="preferred",
    )


def test_status_lists_a_bounded_number_of_excluded_nodes() -> None:
    nodes = make_nodes(120, prefix="n")
    result = place(PlacementRequest(nnodes=1, gpus_per_node=8), nodes, {n.name: 8 for n in nodes})
    status = result.to_status()
    assert status["excludedCount"] == 120
    assert isinstance(status["excluded"], list) and len(status["excluded"]) == MAX_EXCLUDED_IN_STATUS
