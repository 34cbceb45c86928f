"""Overrides that undid the plan, through the real API server and the operator's webhook.

Hydra merges a dict value into the node it names, so ``trainer={nnodes:5,n_gpus_per_node:3}`` after the
planner's ``trainer.nnodes=1`` gave verl 5 nodes, and ``~trainer`` deleted the planner's keys: all were
admitted and Running. Now a planner key set through a parent is a pin like the leaf (validated, refused when
it does not fit), deleting a parent of the planner's keys is refused naming them, and an admitted job's
launch ConfigMap gives verl the plan's values, the user's dict keeping only its other keys.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from cluster.operators import webhook_operator
from cluster.polling import wait_for
from verl_devtools.devcluster import DevCluster
from verl_devtools.devcluster.localrun import LocalOperator

GROUP, VERSION, PLURAL = "verl-operator.io", "v1alpha1", "verljobs"
ROLLOUT = "actor_rollout_ref.rollout"

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def operator(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalOperator]:
    """One operator process with its own managed webhook, shared by the module."""
    with webhook_operator(devcluster, tmp_path_factory.mktemp("operator"), "overrides") as op:
        yield op


def job(name: str, *overrides: str) -> dict[str, Any]:
    """A VerlJob of 8 GPUs on one node with ``overrides`` (nothing else pinned)."""
    spec = {
        "verl": {"image": "ghcr.io/example/verl:0.9.1"},
        "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"},
        "resources": {"gpus": 8, "gpusPerNode": 8},
        "overrides": list(overrides),
    }
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VerlJob", "metadata": {"name": name}, "spec": spec}


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        pytest.param(
            ["trainer={nnodes:5,n_gpus_per_node:3}"],
            ["spec.overrides[0] (trainer.n_gpus_per_node, in trainer={...})", "not a multiple of 3"],
            id="trainer-dict",
        ),
        pytest.param(
            [f"{ROLLOUT}={{n:64,tensor_model_parallel_size:3}}"],
            [f"({ROLLOUT}.tensor_model_parallel_size, in {ROLLOUT}={{...}})", "tensorParallelSize 3"],
            id="rollout-dict",
        ),
        pytest.param(
            ["data={train_batch_size:7}"], ["(data.train_batch_size, in data={...})", "7 x 5"], id="data-dict"
        ),
        pytest.param(
            ["~trainer"],
            ["spec.overrides[0] (trainer): '~trainer' deletes", "trainer.nnodes"],
            id="delete-trainer",
        ),
        pytest.param(
            [f"~{ROLLOUT}"],
            [f"'~{ROLLOUT}' deletes", f"{ROLLOUT}.gpu_memory_utilization"],
            id="delete-rollout",
        ),
        pytest.param(["trainer={nnodes:5"], ["spec.overrides[0]", "unbalanced braces"], id="unbalanced-dict"),
    ],
)
def test_an_override_that_would_undo_the_plan_is_refused_at_apply(
    operator: LocalOperator, kubectl: Any, namespace: str, overrides: list[str], fragments: list[str]
) -> None:
    applied = kubectl(
        ["apply", "-n", namespace, "-f", "-"], input=json.dumps(job("undo", *overrides)), timeout=60
    )
    assert applied.returncode != 0, applied.stdout
    assert all(f in applied.stderr for f in fragments), applied.stderr


def test_an_admitted_dict_override_launches_with_the_plan(
    operator: LocalOperator, kube: client.ApiClient, kubectl: Any, namespace: str
) -> None:
    body = job(
        "dicts",
        "trainer={nnodes:1,n_gpus_per_node:8,total_epochs:2}",
        f"++{ROLLOUT}={{n:4,temperature:0.9}}",
    )
    applied = kubectl(["apply", "-n", namespace, "-f", "-"], input=json.dumps(body), timeout=60)
    assert applied.returncode == 0, applied.stderr
    core = client.CoreV1Api(kube)

    def launch() -> dict[str, Any] | None:
        try:
            data = core.read_namespaced_config_map("dicts-launch", namespace).data
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return json.loads(data["launch.json"])

    overrides = wait_for(launch, "the launch ConfigMap", 60)["overrides"]
    assert {"trainer.nnodes=1", "trainer.n_gpus_per_node=8", f"{ROLLOUT}.n=4"} <= set(overrides)
    assert overrides[-2:] == ["trainer={total_epochs:2}", f"++{ROLLOUT}={{temperature:0.9}}"]
