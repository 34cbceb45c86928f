"""The scale benchmark's pure parts: equivalent workloads for both operators, /metrics parsing, statistics."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import make_nodes

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import scale_support as S
from verl_operator.api.spec import VerlJobSpec
from verl_operator.manifests import LaunchPlan, build_children
from verl_operator.planner import plan_job
from verl_operator.planner.facts import node_facts


def verl_pod_gpus(index: int) -> list[int]:
    """GPUs of each pod the verl-operator creates for the benchmark's ``index``-th VerlJob."""
    job: dict[str, Any] = S.verljob(index, "bench")
    job["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"
    spec = VerlJobSpec.model_validate(job["spec"])
    result = plan_job(spec, [node_facts(n) for n in make_nodes(8)])
    assert result.feasible, result.violations
    plan = result.to_json_dict()["plan"]
    nodes = tuple(f"gpu-{i}" for i in range(plan["nnodes"]))
    children = build_children(job, spec, LaunchPlan.from_plan_json(plan, spec, nodes=nodes), 0)
    return [
        sum(int(c["resources"]["requests"].get(S.GPU, 0)) for c in child["spec"]["containers"])
        for child in children
        if child["kind"] == "Pod"
    ]


@pytest.mark.parametrize("index", range(len(S.JOB_NODES)))
def test_raycluster_has_the_verljobs_pods_and_gpus(index: int) -> None:
    assert S.raycluster_pod_gpus(S.raycluster(index, "bench")) == verl_pod_gpus(index)
    assert len(verl_pod_gpus(index)) == S.job_nodes(index)


def test_the_mix_averages_375_pods_per_job() -> None:
    assert sum(S.job_nodes(i) for i in range(200)) == 750


def test_invalid_job_is_rejected_by_the_planner() -> None:
    spec = VerlJobSpec.model_validate(S.invalid_verljob("bench")["spec"])
    result = plan_job(spec, make_nodes(8))
    assert not result.feasible
    assert any(v.field == "spec.data.trainBatchSize" for v in result.violations)


@pytest.mark.parametrize(
    ("nodes", "groups", "last"), [(4, 1, 4), (200, 1, 200), (1000, 5, 200), (1001, 6, 1), (5000, 25, 200)]
)
def test_scale_profile_groups(nodes: int, groups: int, last: int) -> None:
    from verl_operator.clusters.profile import parse_profile

    profile = parse_profile(S.scale_profile(nodes))
    assert sum(g.count for g in profile.node_groups) == nodes
    assert len(profile.node_groups) == groups
    assert profile.node_groups[-1].count == last


METRICS = """# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 12
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 3
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="binding",verb="POST",version="v1"} 7
apiserver_request_total{code="200",component="apiserver",dry_run="",group="verl-operator.io",resource="verljobs",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 4.0
apiserver_request_total{code="0",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="",verb="WATCH",version="v1"} 1e+00
apiserver_request_duration_seconds_bucket{verb="LIST",le="0.1"} 99
"""


def test_request_counts_sum_over_codes_and_scopes() -> None:
    assert S.request_counts(METRICS) == {
        ("LIST", "pods"): 15.0,
        ("POST", "pods/binding"): 7.0,
        ("PATCH", "verljobs/status"): 4.0,
        ("WATCH", "nodes"): 1.0,
    }


def test_delta_and_reads() -> None:
    before = S.request_counts(METRICS)
    after = {**before, ("LIST", "pods"): 20.0, ("GET", "verljobs"): 5.0}
    moved = S.delta(after, before)
    assert moved == {("GET", "verljobs"): 5.0, ("LIST", "pods"): 5.0}
    assert S.reads(moved, ("verljobs", "pods")) == 10.0
    assert S.reads(moved, ("nodes",)) == 0.0


def test_writes_are_the_changes_of_the_named_objects() -> None:
    counts = S.request_counts(METRICS)
    assert S.writes(counts, S.OPERATOR_KINDS) == {("PATCH", "verljobs/status"): 4.0}
    assert S.writes(counts, ("pods/binding",)) == {
        ("POST", "pods/binding"): 7.0
    }  # a write, not a listed kind
    assert S.writes({("GET", "pods"): 3.0, ("DELETE", "pods"): 1.0}, ("pods",)) == {("DELETE", "pods"): 1.0}


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1.0], 99, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
        ([4.0, 1.0, 3.0, 2.0], 100, 4.0),
        ([0.0, 10.0], 99, 9.9),
    ],
)
def test_percentile(values: list[float], q: float, expected: float) -> None:
    assert S.percentile(values, q) == pytest.approx(expected)


def test_percentile_and_ratio_of_nothing_are_nan() -> None:
    assert math.isnan(S.percentile([], 50))
    assert math.isnan(S.ratio(1.0, 0.0))
    assert S.ratio(1.0, 4.0) == 0.25


HISTOGRAM = """verl_operator_plan_and_place_seconds_bucket{le="0.001"} 10.0
verl_operator_plan_and_place_seconds_bucket{le="0.002"} 30.0
verl_operator_plan_and_place_seconds_bucket{le="+Inf"} 30.0
verl_operator_plan_and_place_seconds_count 30.0
verl_operator_planning_seconds_bucket{le="0.001"} 99.0
"""


def test_histogram_quantile_interpolates_inside_the_bucket() -> None:
    buckets = S.histogram_buckets(HISTOGRAM, "verl_operator_plan_and_place_seconds")
    assert buckets == {0.001: 10.0, 0.002: 30.0, math.inf: 30.0}
    assert S.histogram_quantile(buckets, 0.5) == pytest.approx(0.00125)
    assert S.histogram_quantile(buckets, 0.2) == pytest.approx(0.0006)
    assert math.isnan(S.histogram_quantile({}, 0.5))


def test_a_py_spy_profile_ranks_functions_once_per_stack() -> None:
    raw = "\n".join(
        [
            "MainThread;run (/v/lib/site-packages/kopf/a.py:10);plan (/src/planner.py:5);plan (/src/planner.py:9) 6",
            "MainThread;run (/v/lib/site-packages/kopf/a.py:12) 2",
            "garbage line",
            "Thread-2;_bootstrap (threading.py:1002);dumps (json/encoder.py:200) 2",
        ]
    )
    total, top = S.profile_top(raw)
    assert total == 10
    assert [(e.function, e.inclusive, e.own) for e in top] == [
        ("run (kopf/a.py)", 0.8, 0.2),
        ("plan (/src/planner.py)", 0.6, 0.6),  # recursion counts once
        ("dumps (json/encoder.py)", 0.2, 0.2),
    ]  # no thread plumbing
    assert S.profile_top("", 3) == (0, [])


# ---- jobs reporting steps (bench/bench_progress.py) ----

PUBLISHED = Path(__file__).parent / "data" / "verl-output" / "gsm8k-vllm-ray-wrapped.log"


def test_loopback_addresses_are_distinct_loopback_and_map_back() -> None:
    addresses = [S.loopback_address(i) for i in range(1000)]
    assert len(set(addresses)) == 1000
    assert (addresses[0], addresses[253], addresses[254]) == ("127.1.0.1", "127.1.0.254", "127.1.1.1")
    for i, address in enumerate(addresses):
        octets = [int(p) for p in address.split(".")]
        assert octets[0] == 127 and octets[1] != 0 and 1 <= octets[3] <= 254
        assert S.job_of_address(address) == i


@pytest.mark.parametrize(
    "address", ["127.0.0.1", "10.244.0.5", "127.1.0.0", "127.1.0.255", "::1", "127.1.x.1"]
)
def test_other_addresses_are_no_job(address: str) -> None:
    assert S.job_of_address(address) is None


def test_loopback_address_refuses_an_index_out_of_range() -> None:
    with pytest.raises(ValueError):
        S.loopback_address(-1)
    with pytest.raises(ValueError):
        S.loopback_address(254 * 256)


def test_step_line_is_read_by_the_launcher_as_a_step_of_the_asked_time() -> None:
    from verl_launcher.progress import ProgressTracker

    tracker = ProgressTracker()
    tracker.feed("(TaskRunner pid=1) Total training steps: 1007")
    tracker.feed(S.step_line(PUBLISHED.read_text(), 7, 10.0))
    doc = tracker.progress()
    assert (doc.launch_phase, doc.step, doc.total_steps) == ("Stepping", 7, 1007)
    assert doc.step_seconds == pytest.approx(10.0)
    # the phases keep their shares of the published 93.52 s step (gen 24.53 s)
    assert doc.phases["gen"] == pytest.approx(10.0 * 24.533394969068468 / 93.52434759191237)
    assert doc.mfu == pytest.approx(0.3707644223640674)  # not a timer: unscaled


def test_per_job_per_interval() -> None:
    assert S.per_job_per_interval(400, 200, 300) == pytest.approx(0.2)
    assert S.per_job_per_interval(3, 1, 60, interval=30) == pytest.approx(1.5)
    assert math.isnan(S.per_job_per_interval(1, 0, 60))
