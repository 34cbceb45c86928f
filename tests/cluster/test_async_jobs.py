"""verl's trainer modes on the real control plane: each async example (one per mode) applied with kubectl to
the DGX H100 nodes (4 x 8 GPUs, racks rack-a1: dgx-h100-0/1 and rack-a2: dgx-h100-2/3) plans its pools, places
both as one gang, reaches Running with each pool's pods on the expected nodes, and leaves nothing behind when
deleted; a three-node separate_async job with one node busy keeps its trainer pool inside one rack."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from cluster.operators import webhook_operator
from cluster.polling import wait_for
from verl_devtools.devcluster import DevCluster
from verl_devtools.devcluster.localrun import LocalOperator
from verl_operator.clusters.labels import PROFILE, RACK

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "jobs"
GROUP, VERSION, PLURAL = "verl-operator.io", "v1alpha1", "verljobs"
POOL = "verl-operator.io/pool"
INDEX = "verl-operator.io/node-index"

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def operator(
    devcluster: DevCluster, dgx: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalOperator]:
    with webhook_operator(devcluster, tmp_path_factory.mktemp("operator"), "async") as op:
        yield op


class Ns:
    """The test's namespace: apply, read and delete VerlJobs, list their children."""

    def __init__(self, kube: client.ApiClient, kubectl: Any, namespace: str) -> None:
        self.kubectl = kubectl
        self.ns = namespace
        self.custom = client.CustomObjectsApi(kube)
        self.core = client.CoreV1Api(kube)

    def apply(self, manifest: dict[str, Any]) -> None:
        done = self.kubectl(["apply", "-n", self.ns, "-f", "-"], input=json.dumps(manifest))
        assert done.returncode == 0, done.stderr

    def status(self, name: str) -> dict[str, Any]:
        try:
            obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)
        except client.exceptions.ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        return dict(obj.get("status") or {})

    def running(self, name: str) -> dict[str, Any]:
        return wait_for(
            lambda: (s := self.status(name)).get("phase") == "Running" and s,
            f"{name} Running (now {self.status(name)})",
            60,
        )

    def pods(self, name: str) -> list[client.V1Pod]:
        items = self.core.list_namespaced_pod(self.ns, label_selector=f"verl-operator.io/job={name}").items
        return sorted(items, key=lambda p: int(p.metadata.labels[INDEX]))

    def running_pods(self, name: str, count: int) -> list[client.V1Pod]:
        def probe() -> list[client.V1Pod] | None:
            pods = [p for p in self.pods(name) if not p.metadata.deletion_timestamp]
            return pods if len(pods) == count and all(p.status.phase == "Running" for p in pods) else None

        return wait_for(probe, f"{count} Running pods of {name}", 60)

    def children(self, name: str) -> list[str]:
        selector = f"verl-operator.io/job={name}"
        found = [f"pod/{p.metadata.name}" for p in self.pods(name)]
        found += [
            f"configmap/{c.metadata.name}"
            for c in self.core.list_namespaced_config_map(self.ns).items
            if c.metadata.name.startswith(f"{name}-")
        ]
        found += [
            f"service/{s.metadata.name}"
            for s in self.core.list_namespaced_service(self.ns, label_selector=selector).items
        ]
        found += [
            f"serviceaccount/{a.metadata.name}"
            for a in self.core.list_namespaced_service_account(self.ns).items
            if a.metadata.name.startswith(f"{name}-")
        ]
        return found

    def delete_and_wait(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)
        # The garbage collector may first have to discover the VerlJob kind (a fresh CRD): allow for that.
        wait_for(
            lambda: not self.status(name) and not self.children(name), f"{name} and its children gone", 90
        )


@pytest.fixture
def ns(operator: LocalOperator, kube: client.ApiClient, kubectl: Any, namespace: str) -> Iterator[Ns]:
    helper = Ns(kube, kubectl, namespace)
    yield helper
    for item in helper.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]:
        helper.custom.delete_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, item["metadata"]["name"]
        )
    helper.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    wait_for(lambda: not helper.core.list_namespaced_pod(namespace).items or None, "pods gone", 30)


def on_dgx(example: str) -> dict[str, Any]:
    """The example as shipped, kept to the DGX H100 profile's nodes (the session's cluster has other H100s)."""
    manifest = yaml.safe_load((EXAMPLES / example).read_text())
    manifest["spec"]["resources"]["nodeSelector"] = {PROFILE: "dgx-h100"}
    return dict(manifest)


def rack(ns: Ns, node: str) -> str | None:
    return (ns.core.read_node(node).metadata.labels or {}).get(RACK)


@pytest.mark.parametrize(
    ("example", "mode", "pools"),
    [
        ("async-separate-qwen7b-dgx.yaml", "separate_async", ["trainer", "rollout"]),
        ("async-fully-qwen7b-dgx.yaml", "fully_async", ["trainer", "rollout"]),
        ("async-one-step-off-qwen7b-dgx.yaml", "one_step_off", ["both", "both"]),
        ("async-colocate-qwen7b-dgx.yaml", "colocate_async", ["both"]),
    ],
)
def test_async_example_places_both_pools_runs_and_deletes_cleanly(
    ns: Ns, example: str, mode: str, pools: list[str]
) -> None:
    manifest = on_dgx(example)
    name = manifest["metadata"]["name"]
    ns.apply(manifest)
    status = ns.running(name)
    plan = status["plan"]
    assert plan["pools"]["mode"] == mode
    pods = ns.running_pods(name, len(pools))
    assert [p.metadata.labels.get(POOL) for p in pods] == pools
    nodes = [p.spec.node_name for p in pods]
    assert nodes == status["placement"]["nodes"], "pod i runs on the placement's node i"
    assert len(set(nodes)) == len(nodes) and all(n.startswith("dgx-h100-") for n in nodes)
    assert len({rack(ns, n) for n in nodes}) == 1, f"{nodes}: both pools and the weight sync in one rack"
    gpus = {p.spec.containers[0].resources.requests["nvidia.com/gpu"] for p in pods}
    assert gpus == {str(plan["gpusPerNode"])}, "pods of one size: one gang"
    if "rollout" in pools:
        rollout = plan["pools"]["rollout"]
        trainer = plan["pools"]["trainer"]
        assert pools.count("trainer") == trainer["nnodes"] and pools.count("rollout") == rollout["nnodes"]
        message = status["placement"]["message"]
        assert f"trainer pool on {nodes[0]}" in message and f"rollout pool on {nodes[1]}" in message
    ns.delete_and_wait(name)


def test_separate_async_on_three_nodes_keeps_its_trainer_pool_in_one_rack(ns: Ns) -> None:
    """With dgx-h100-0 busy, no rack holds the three nodes: the trainer pool (2 nodes) takes rack-a2 whole and
    the rollout pool dgx-h100-1 (by node name alone the trainer would span both racks)."""
    ns.core.create_namespaced_pod(
        ns.ns,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "other"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "dgx-h100-0"},
                "containers": [
                    {"name": "c", "image": "busy", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
                ],
            },
        },
    )
    wait_for(
        lambda: ns.core.read_namespaced_pod("other", ns.ns).status.phase == "Running" or None, "busy pod", 30
    )
    manifest = on_dgx("async-separate-qwen7b-dgx.yaml")
    manifest["metadata"]["name"] = "separate-three"
    manifest["spec"]["resources"]["gpus"] = 24
    manifest["spec"]["overrides"] = [
        "trainer.nnodes=2" if o == "trainer.nnodes=1" else o for o in manifest["spec"]["overrides"]
    ]
    ns.apply(manifest)
    status = ns.running("separate-three")
    pods = ns.running_pods("separate-three", 3)
    by_pool = {
        pool: [p.spec.node_name for p in pods if p.metadata.labels[POOL] == pool]
        for pool in ("trainer", "rollout")
    }
    assert by_pool == {"trainer": ["dgx-h100-2", "dgx-h100-3"], "rollout": ["dgx-h100-1"]}, status[
        "placement"
    ]
    assert {rack(ns, n) for n in by_pool["trainer"]} == {"rack-a2"}
    head = next(p for p in pods if p.metadata.labels["verl-operator.io/role"] == "head")
    assert head.metadata.labels[POOL] == "trainer"
    ns.delete_and_wait("separate-three")
