"""The head's cluster logic without Ray: ray start argv, readiness, the deadline message, lost nodes."""

from __future__ import annotations

from typing import Any

import pytest

from verl_contract.launch_spec import LaunchSpec
from verl_launcher.exits import ExitCode, LauncherError
from verl_launcher.ray_cluster import (
    RayNode,
    RayOptions,
    head_start_argv,
    lost_nodes,
    nodes_from_ray,
    readiness_problem,
    wait_for_cluster,
    worker_start_argv,
)
from verl_launcher.spec import parse_launch_spec


def make_spec(nnodes: int = 2, gpus: int = 8) -> LaunchSpec:
    return parse_launch_spec(
        {
            "apiVersion": "verl-operator.io/v1alpha1",
            "kind": "LaunchSpec",
            "job": {"name": "demo", "namespace": "default"},
            "verlVersion": "0.9",
            "nnodes": nnodes,
            "gpusPerNode": gpus,
            "head": {"host": "demo-head-0.demo-ray.default.svc", "port": 6379, "dashboardPort": 8265},
            "entrypoint": ["python3", "-m", "verl.trainer.main_ppo"],
            "timeouts": {"clusterReadySeconds": 600, "workerJoinSeconds": 300},
        }
    )


def node(name: str, gpus: float = 8, alive: bool = True, head: bool = False, ip: str = "") -> RayNode:
    return RayNode(
        node_id=f"id-{name}",
        ip=ip or f"10.0.0.{len(name)}",
        hostname=name,
        gpus=gpus,
        alive=alive,
        is_head=head,
    )


def test_head_argv() -> None:
    options = RayOptions(
        executable="/opt/ray", num_gpus=8, num_cpus=64, node_ip="10.0.0.5", extra_args=("--x=1",)
    )
    assert head_start_argv(make_spec(), options) == [
        "/opt/ray", "start", "--head", "--port=6379", "--dashboard-host=0.0.0.0", "--dashboard-port=8265",
        "--disable-usage-stats", "--block", "--num-gpus=8", "--num-cpus=64", "--node-ip-address=10.0.0.5", "--x=1",
    ]  # fmt: skip


def test_worker_argv_lets_ray_detect_when_unknown() -> None:
    assert worker_start_argv(make_spec(), RayOptions()) == [
        "ray", "start", "--address=demo-head-0.demo-ray.default.svc:6379", "--disable-usage-stats", "--block",
    ]  # fmt: skip


def test_nodes_from_ray() -> None:
    raw: list[dict[str, Any]] = [
        {"NodeID": "b", "Alive": True, "NodeManagerAddress": "10.0.0.2", "NodeManagerHostname": "w-1",
         "Resources": {"GPU": 8.0, "CPU": 96.0}},
        {"NodeID": "a", "Alive": True, "NodeManagerAddress": "10.0.0.1", "NodeManagerHostname": "h-0",
         "Resources": {"GPU": 8.0, "node:__internal_head__": 1.0}},
        {"NodeID": "c", "Alive": False, "NodeManagerAddress": "10.0.0.3", "NodeManagerHostname": "w-2", "Resources": {}},
    ]  # fmt: skip
    nodes = nodes_from_ray(raw)
    assert [(n.node_id, n.is_head, n.alive, n.gpus) for n in nodes] == [
        ("a", True, True, 8.0), ("b", False, True, 8.0), ("c", False, False, 0.0),
    ]  # fmt: skip
    assert nodes[0].describe() == "h-0 (10.0.0.1, 8 GPUs, head)"


@pytest.mark.parametrize(
    ("nodes", "needles"),
    [
        pytest.param([node("h", head=True), node("w1")], None, id="ready"),
        pytest.param(
            [node("h", head=True), node("w1"), node("w2", alive=False)], None, id="dead-node-ignored"
        ),
        pytest.param(
            [node("h", head=True)],
            [
                "1 of 2 nodes and 8 of 16 GPUs",
                "registered: h (",
                "missing: 1 node(s)",
                "demo-head-0.demo-ray.default.svc:6379",
            ],
            id="worker-missing",
        ),
        pytest.param(
            [node("h", head=True), node("w1", gpus=4)],
            ["2 of 2 nodes and 12 of 16 GPUs", "wrong GPU count on w1 (", "each needs 8"],
            id="gpus-short",
        ),
        pytest.param(
            [node("h", head=True), node("w1"), node("w2")],
            ["3 of 2 nodes", "1 node(s) more than planned"],
            id="extra-node",
        ),
    ],
)
def test_readiness(nodes: list[RayNode], needles: list[str] | None) -> None:
    problem = readiness_problem(nodes, make_spec())
    if needles is None:
        assert problem is None
    else:
        assert problem is not None
        for needle in needles:
            assert needle in problem


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_wait_returns_when_the_worker_joins() -> None:
    clock = FakeClock()
    snapshots = [[node("h", head=True)]] * 3 + [[node("h", head=True), node("w1")]]
    calls = iter(snapshots)
    ready = wait_for_cluster(
        lambda: next(calls), make_spec(), deadline_s=60, poll_s=2, clock=clock, sleep=clock.sleep
    )
    assert [n.hostname for n in ready] == ["h", "w1"]
    assert clock.sleeps == [2, 2, 2]


def test_wait_deadline_names_what_is_missing() -> None:
    clock = FakeClock()
    with pytest.raises(LauncherError) as caught:
        wait_for_cluster(
            lambda: [node("h", head=True)],
            make_spec(),
            deadline_s=7,
            poll_s=2,
            clock=clock,
            sleep=clock.sleep,
        )
    assert caught.value.code is ExitCode.CLUSTER_NOT_READY
    assert clock.now == 7  # the last sleep is cut to the deadline
    assert caught.value.message.startswith(
        "the Ray cluster was not ready 600s after the head started (timeouts.clusterReadySeconds): 1 of 2 nodes"
    )


def test_lost_nodes() -> None:
    initial = [node("h", head=True), node("w1"), node("w2")]
    assert lost_nodes(initial, [node("h", head=True), node("w1"), node("w2", alive=False)]) == [initial[2]]
    assert lost_nodes(initial, [node("h", head=True), node("w2")]) == [initial[1]]
    assert lost_nodes(initial, initial) == []
