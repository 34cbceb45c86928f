"""The operator against the real control plane: one ``verl-operator run`` process for the whole module.

Covers the examples through ``kubectl apply`` (placed, rejected with suggestions), placement on the DGX,
L40S and GB200 shapes, all-or-nothing placement of two competing jobs, suspend/resume, the backoff restart
of the whole Ray cluster after a simulated pod failure, TTL cleanup, the deletion cascade, the webhook (a
direct AdmissionReview round-trip and ``kubectl apply`` through the API server), CEL rules, ``kubectl
explain`` and the metrics endpoint.
"""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cluster.polling import wait_for
from verl_devtools.devcluster import DevCluster
from verl_devtools.devcluster.localrun import LocalOperator, install_crd
from verl_operator.clusters.labels import GPU_CLIQUE, PROFILE, RACK, SIMULATE, SIMULATE_EXIT_CODE
from verl_operator.clusters.profile import parse_profile

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "jobs"
GROUP, VERSION, PLURAL = "verl-operator.io", "v1alpha1", "verljobs"
IMAGE = "ghcr.io/example/verl:0.9.1"
DGX = {PROFILE: "dgx-h100"}

pytestmark = pytest.mark.timeout(180)

#: Two GB200 NVLink cliques: 3 trays in one, 4 in the other (a 16-GPU job with TP 8 fits only the second).
TWO_CLIQUES = {
    "name": "gb200-two-cliques",
    "nodeGroups": [
        {
            "namePrefix": f"gbc{suffix}",
            "count": count,
            "gpu": {
                "product": "NVIDIA-GB200",
                "count": 4,
                "memoryMib": 189471,
                "family": "blackwell",
                "machine": "GB200-NVL72",
                "computeMajor": 10,
                "computeMinor": 0,
                "clique": f"6b0f2d3e-8c41-4f7a-9e25-1a3c5d7e9b20.{clique}",
            },
            "cpu": "144",
            "memory": "880Gi",
            "arch": "arm64",
            "region": "us-central",
            "zone": "us-central-1c",
            "racks": [f"nvl72-rack-{clique}"],
        }
        for suffix, count, clique in (("a", 3, 7), ("b", 4, 8))
    ],
}


@pytest.fixture(scope="module")
def profiles(devcluster: DevCluster) -> Iterator[None]:
    """The DGX H100, L40S and two-clique GB200 nodes next to the session's profile."""
    devcluster.apply_profile("dgx-h100")
    devcluster.apply_profile("l40s")
    devcluster.apply_profile(parse_profile(TWO_CLIQUES))
    yield
    for name in ("gb200-two-cliques", "l40s", "dgx-h100"):
        devcluster.remove_profile(name)


@pytest.fixture(scope="module")
def operator(
    devcluster: DevCluster, profiles: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalOperator]:
    """One operator process with its own managed webhook, shared by the module."""
    install_crd(devcluster.kubeconfig)
    op = LocalOperator(
        devcluster.kubeconfig,
        tmp_path_factory.mktemp("operator"),
        webhook_name=f"pytest-{os.getpid()}.verl-operator.io",
    )
    op.start()
    yield op
    op.stop()
    print(op.log_tail(80))


class Jobs:
    """VerlJob helpers bound to one namespace."""

    def __init__(self, kube: client.ApiClient, kubectl: Any, namespace: str) -> None:
        self.kubectl = kubectl
        self.ns = namespace
        self.custom = client.CustomObjectsApi(kube)
        self.core = client.CoreV1Api(kube)

    def apply(self, manifest: dict[str, Any] | Path) -> Any:
        if isinstance(manifest, Path):
            return self.kubectl(["apply", "-n", self.ns, "-f", str(manifest)])
        return self.kubectl(["apply", "-n", self.ns, "-f", "-"], input=json.dumps(manifest))

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            obj: Any = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)
            return dict(obj)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def status(self, name: str) -> dict[str, Any]:
        return dict((self.get(name) or {}).get("status") or {})

    def phase(self, name: str) -> str | None:
        return self.status(name).get("phase")

    def wait_phase(self, name: str, phase: str, timeout: float = 30.0) -> dict[str, Any]:
        wait_for(
            lambda: self.phase(name) == phase, f"{name} phase {phase} (now {self.status(name)})", timeout
        )
        return self.status(name)

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name, {"spec": spec})

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def pods(self, name: str) -> list[client.V1Pod]:
        items = self.core.list_namespaced_pod(self.ns, label_selector=f"verl-operator.io/job={name}").items
        return sorted(items, key=lambda p: p.metadata.name)

    def running_pods(self, name: str, count: int) -> list[client.V1Pod]:
        def probe() -> list[client.V1Pod] | None:
            pods = [p for p in self.pods(name) if not p.metadata.deletion_timestamp]
            ok = len(pods) == count and all(p.status.phase == "Running" for p in pods)
            return pods if ok else None

        return wait_for(probe, f"{count} Running pods of {name}", 30)

    def fail_pod(self, pod: str, exit_code: int = 1) -> None:
        self.core.patch_namespaced_pod(
            pod,
            self.ns,
            {"metadata": {"annotations": {SIMULATE: "fail", SIMULATE_EXIT_CODE: str(exit_code)}}},
        )

    def events(self, name: str) -> list[client.CoreV1Event]:
        uid = (self.get(name) or {}).get("metadata", {}).get("uid")
        return [e for e in self.core.list_namespaced_event(self.ns).items if e.involved_object.uid == uid]


@pytest.fixture
def jobs(operator: LocalOperator, kube: client.ApiClient, kubectl: Any, namespace: str) -> Iterator[Jobs]:
    """Helpers for the test's namespace; deletes the test's VerlJobs (and waits for their pods) after it."""
    helper = Jobs(kube, kubectl, namespace)
    yield helper
    for item in helper.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]:
        helper.delete(item["metadata"]["name"])
    # Not left to the garbage collector: it learns a freshly installed CRD's kind only at its next
    # discovery refresh (up to ~30 s), and the next test needs these GPUs now.
    helper.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    wait_for(lambda: not helper.core.list_namespaced_pod(namespace).items or None, "pods gone", 30)


def job(name: str, gpus: int, per_node: int, **spec: Any) -> dict[str, Any]:
    """A VerlJob manifest (JSON-ready) with a small catalog model."""
    body: dict[str, Any] = {
        "verl": {"image": IMAGE},
        "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
        "data": {"trainBatchSize": 8 * gpus},
        "rollout": {"responsesPerPrompt": 4},
        "resources": {"gpus": gpus, "gpusPerNode": per_node},
    }
    for key, value in spec.items():
        body[key] = {**body[key], **value} if isinstance(body.get(key), dict) else value
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VerlJob", "metadata": {"name": name}, "spec": body}


def node_labels(jobs: Jobs, name: str) -> dict[str, str]:
    return dict(jobs.core.read_node(name).metadata.labels or {})


# ---- the examples through kubectl apply ------------------------------------------------------------------


def test_example_plans_and_lands_on_two_whole_nodes_of_one_rack(jobs: Jobs) -> None:
    applied = jobs.apply(EXAMPLES / "grpo-qwen7b-dgx.yaml")
    assert applied.returncode == 0, applied.stderr
    status = jobs.wait_phase("grpo-qwen7b", "Running")
    pods = jobs.running_pods("grpo-qwen7b", 2)
    nodes = [p.spec.node_name for p in pods]
    assert len(set(nodes)) == 2
    racks = {node_labels(jobs, n).get(RACK) for n in nodes}
    assert len(racks) == 1 and None not in racks, f"nodes {nodes} span racks {racks}"
    for pod in pods:
        gpus = pod.spec.containers[0].resources.requests["nvidia.com/gpu"]
        assert gpus == "8" == jobs.core.read_node(pod.spec.node_name).status.allocatable["nvidia.com/gpu"]
        assert not pod.spec.scheduling_gates, "pods are released from the gang gate"
    head = next(p for p in pods if p.metadata.labels["verl-operator.io/role"] == "head")
    assert head.spec.node_name == status["placement"]["nodes"][0] == status["nodes"].split(",")[0]
    assert status["mesh"].startswith("dp16 sp1 tp")
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "True" and conditions["Placed"]["status"] == "True"
    assert all(c["observedGeneration"] == 1 for c in conditions.values())
    launch = json.loads(
        jobs.core.read_namespaced_config_map("grpo-qwen7b-launch", jobs.ns).data["launch.json"]
    )
    assert launch["head"]["host"] == f"grpo-qwen7b-head-0.grpo-qwen7b-ray.{jobs.ns}.svc"
    # The status keeps the planner's overrides and a count and hash of the user's; the launch gets them all.
    kept = [o for o in status["plan"]["overrides"] if not o.startswith("#passthrough")]
    assert launch["overrides"][: len(kept)] == kept and "trainer.total_epochs=15" in launch["overrides"]
    assert "trainer.total_epochs=15" not in status["plan"]["overrides"]
    assert jobs.core.read_namespaced_service("grpo-qwen7b-ray", jobs.ns).spec.cluster_ip == "None"
    reasons = {e.reason for e in jobs.events("grpo-qwen7b")}
    assert {"Placed", "PodsCreated", "Running"} <= reasons
    table = jobs.kubectl(["get", "vj", "-n", jobs.ns]).stdout
    assert "Running" in table and status["mesh"] in table and status["nodes"] in table


def test_megatron_example_lands_on_four_h20_nodes_of_one_rack(
    cluster_profile: Callable[[str], list[str]], jobs: Jobs
) -> None:
    """The Qwen3-235B-A22B Megatron example on the H20 profile (12 nodes in 3 racks): its four pipeline stages
    on four whole nodes of one rack, the Megatron mesh in the status and kubectl's table, verl's Megatron
    config and the planned sizes in the launch spec."""
    h20 = set(cluster_profile("h20"))
    assert jobs.apply(EXAMPLES / "megatron-qwen3-235b-h20.yaml").returncode == 0
    status = jobs.wait_phase("megatron-qwen3-235b", "Running")
    pods = jobs.running_pods("megatron-qwen3-235b", 4)
    nodes = {p.spec.node_name for p in pods}
    assert len(nodes) == 4 and nodes <= h20
    racks = {node_labels(jobs, n).get(RACK) for n in nodes}
    assert len(racks) == 1 and None not in racks, f"nodes {nodes} span racks {racks}"
    training = status["plan"]["training"]
    assert training["engine"] == "megatron"
    tp, pp, ep = (training[k] for k in ("tensorParallelSize", "pipelineParallelSize", "expertParallelSize"))
    assert tp * pp * training["contextParallelSize"] * training["dataParallelSize"] == 32
    assert status["mesh"].startswith(f"dp{training['dataParallelSize']} tp{tp} pp{pp}")
    assert status["mesh"] in jobs.kubectl(["get", "vj", "-n", jobs.ns]).stdout
    launch = json.loads(
        jobs.core.read_namespaced_config_map("megatron-qwen3-235b-launch", jobs.ns).data["launch.json"]
    )
    assert "--config-name=ppo_megatron_trainer" in launch["entrypoint"]
    assert f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={tp}" in launch["overrides"]
    assert f"actor_rollout_ref.actor.megatron.expert_model_parallel_size={ep}" in launch["overrides"]


def gpu_pod(name: str, node: str, gpus: int) -> dict[str, Any]:
    """A plain pod (not a VerlJob's) holding GPUs on ``node``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {"name": "c", "image": "busy", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
        },
    }


def test_waiting_example_waits_for_capacity_then_runs(jobs: Jobs) -> None:
    assert jobs.apply(EXAMPLES / "grpo-qwen7b-dgx.yaml").returncode == 0
    jobs.wait_phase("grpo-qwen7b", "Running")
    taken = {p.spec.node_name for p in jobs.running_pods("grpo-qwen7b", 2)}
    h100 = sorted(
        n.metadata.name
        for n in jobs.core.list_node(label_selector="nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3").items
    )
    others = [n for n in h100 if n not in taken][:2]
    for i, node in enumerate(others):  # GPUs held by pods that are not VerlJob pods count as busy
        jobs.core.create_namespaced_pod(jobs.ns, gpu_pod(f"other-{i}", node, 8))
    wait_for(
        lambda: (
            all(
                p.status.phase == "Running"
                for p in jobs.core.list_namespaced_pod(jobs.ns, label_selector="!verl-operator.io/job").items
            )
            or None
        ),
        "the other GPU pods running",
    )
    assert jobs.apply(EXAMPLES / "waits-for-capacity.yaml").returncode == 0
    status = jobs.wait_phase("grpo-qwen14b-wait", "Pending")
    assert "job needs 3 nodes with 8 free GPUs" in status["message"]
    assert jobs.pods("grpo-qwen14b-wait") == []
    jobs.delete("grpo-qwen7b")
    status = jobs.wait_phase("grpo-qwen14b-wait", "Running")
    nodes = {p.spec.node_name for p in jobs.running_pods("grpo-qwen14b-wait", 3)}
    assert nodes.isdisjoint(others), "never placed on the nodes the other pods hold"


def test_gb200_example_stays_inside_one_clique(jobs: Jobs) -> None:
    assert jobs.apply(EXAMPLES / "gb200-clique.yaml").returncode == 0
    jobs.wait_phase("gb200-clique", "Running")
    pods = jobs.running_pods("gb200-clique", 4)
    cliques = {node_labels(jobs, p.spec.node_name).get(GPU_CLIQUE) for p in pods}
    assert len(cliques) == 1 and None not in cliques


def test_rejected_example_prints_the_violation_and_suggestions(jobs: Jobs) -> None:
    applied = jobs.apply(EXAMPLES / "rejected-batch-size.yaml")
    assert applied.returncode != 0
    assert "admission webhook" in applied.stderr
    assert "spec.data.trainBatchSize" in applied.stderr and "use trainBatchSize 96 or 112" in applied.stderr
    assert jobs.get("bad-batch") is None


def test_l40s_pinned_tp2_with_nvlink_required_is_rejected_with_the_reason(jobs: Jobs) -> None:
    applied = jobs.apply(EXAMPLES / "l40s-tp2-nvlink.yaml")
    assert applied.returncode != 0
    assert "spec.rollout.tensorParallelSize" in applied.stderr and "NVLink" in applied.stderr
    assert "nvlink: preferred" in applied.stderr


def test_gb200_job_stays_inside_one_clique(jobs: Jobs) -> None:
    manifest = job(
        "gb200",
        16,
        4,
        model={"path": "Qwen/Qwen2.5-32B-Instruct"},
        rollout={"responsesPerPrompt": 4, "tensorParallelSize": 8},
        resources={"gpuProduct": "NVIDIA-GB200", "nodeSelector": {PROFILE: "gb200-two-cliques"}},
        placement={"nvlink": "required"},
    )
    assert jobs.apply(manifest).returncode == 0
    status = jobs.wait_phase("gb200", "Running")
    pods = jobs.running_pods("gb200", 4)
    cliques = {node_labels(jobs, p.spec.node_name).get(GPU_CLIQUE) for p in pods}
    assert len(cliques) == 1, f"pods span cliques {cliques}"
    assert status["placement"]["clique"] == cliques.pop()
    assert all(p.spec.node_name.startswith("gbc" + "b-") for p in pods), "only the 4-tray clique holds it"


def test_two_jobs_exceeding_the_cluster_never_leave_a_half_placed_job(jobs: Jobs) -> None:
    big = job("big", 24, 8, resources={"nodeSelector": DGX})
    second = job("second", 16, 8, resources={"nodeSelector": DGX})
    assert jobs.apply(big).returncode == 0
    jobs.wait_phase("big", "Running")
    assert jobs.apply(second).returncode == 0
    status = jobs.wait_phase("second", "Pending")
    placed = {c["type"]: c for c in status["conditions"]}["Placed"]
    assert placed["status"] == "False" and placed["reason"] == "InsufficientCapacity"
    assert "2 nodes with 8 free GPUs" in placed["message"]
    for _ in range(8):  # several reconcile passes: never a single pod of the waiting job
        assert jobs.pods("second") == [] and jobs.phase("second") == "Pending"
        time.sleep(0.25)
    jobs.delete("big")
    jobs.wait_phase("second", "Running")
    pods = jobs.running_pods("second", 2)
    assert len({p.spec.node_name for p in pods}) == 2


# ---- lifecycle ------------------------------------------------------------------------------------------


def test_suspend_deletes_the_pods_and_resume_replans(jobs: Jobs) -> None:
    assert jobs.apply(job("sus", 8, 8, resources={"nodeSelector": DGX})).returncode == 0
    jobs.wait_phase("sus", "Running")
    first = {p.metadata.name for p in jobs.running_pods("sus", 1)}
    jobs.patch_spec("sus", {"suspend": True})
    status = jobs.wait_phase("sus", "Suspended")
    wait_for(lambda: jobs.pods("sus") == [] or None, "pods deleted", 30)
    assert "placement" not in status and jobs.get("sus") is not None
    jobs.patch_spec("sus", {"suspend": False})
    status = jobs.wait_phase("sus", "Running")
    second = {p.metadata.name for p in jobs.running_pods("sus", 1)}
    assert second.isdisjoint(first) and status["attempt"] == 1
    assert jobs.get("sus")["spec"]["suspend"] is False, "the operator never writes spec"


def test_failed_pod_restarts_the_whole_ray_cluster_then_backoff_limit_fails_it(jobs: Jobs) -> None:
    assert jobs.apply(job("boff", 16, 8, resources={"nodeSelector": DGX}, backoffLimit=1)).returncode == 0
    jobs.wait_phase("boff", "Running")
    first = jobs.running_pods("boff", 2)
    worker = next(p for p in first if p.metadata.labels["verl-operator.io/role"] == "worker")
    jobs.fail_pod(worker.metadata.name, exit_code=11)  # WorkerLost: retryable
    wait_for(lambda: jobs.status("boff").get("restarts") == 1 or None, "restart 1", 30)
    jobs.wait_phase("boff", "Running")
    second = jobs.running_pods("boff", 2)
    assert {p.metadata.labels["verl-operator.io/attempt"] for p in second} == {"1"}
    assert {p.metadata.name for p in second}.isdisjoint({p.metadata.name for p in first})
    env = {e.name: e.value for e in second[0].spec.containers[0].env}
    assert env["VERL_OPERATOR_ATTEMPT"] == "1"
    assert "Restarting" in {e.reason for e in jobs.events("boff")}
    jobs.fail_pod(second[0].metadata.name, exit_code=10)
    status = jobs.wait_phase("boff", "Failed")
    assert status["reason"] == "BackoffLimitExceeded" and status["restarts"] == 1
    assert {c["type"]: c for c in status["conditions"]}["Failed"]["status"] == "True"
    wait_for(
        lambda: (
            all(p.status.phase == "Failed" or p.metadata.deletion_timestamp for p in jobs.pods("boff"))
            or None
        ),
        "no live pod after the failure",
    )


def test_topology_mismatch_is_not_retried(jobs: Jobs) -> None:
    assert jobs.apply(job("topo", 8, 8, resources={"nodeSelector": DGX}, backoffLimit=3)).returncode == 0
    jobs.wait_phase("topo", "Running")
    jobs.fail_pod(jobs.running_pods("topo", 1)[0].metadata.name, exit_code=12)
    status = jobs.wait_phase("topo", "Failed")
    assert status["reason"] == "TopologyMismatch" and status.get("restarts", 0) == 0


def test_head_pod_success_completes_the_job(jobs: Jobs) -> None:
    assert jobs.apply(job("done", 16, 8, resources={"nodeSelector": DGX})).returncode == 0
    jobs.wait_phase("done", "Running")
    head = next(
        p for p in jobs.running_pods("done", 2) if p.metadata.labels["verl-operator.io/role"] == "head"
    )
    # No kubelet here: write what a kubelet reports when the launcher exits 0.
    terminated = {"exitCode": 0, "reason": "Completed"}
    jobs.core.patch_namespaced_pod_status(
        head.metadata.name,
        jobs.ns,
        {
            "status": {
                "phase": "Succeeded",
                "containerStatuses": [
                    {
                        "name": "ray",
                        "image": IMAGE,
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"terminated": terminated},
                    }
                ],
            }
        },
    )
    status = jobs.wait_phase("done", "Succeeded")
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Complete"]["status"] == "True" and conditions["Ready"]["status"] == "True"
    assert status["completionTime"]

    def workers_released() -> bool:
        live = [p for p in jobs.pods("done") if not p.metadata.deletion_timestamp]
        return all(p.metadata.labels["verl-operator.io/role"] == "head" for p in live)

    wait_for(workers_released, "the workers released after the run")


def test_active_deadline_fails_the_job(jobs: Jobs) -> None:
    assert (
        jobs.apply(job("late", 8, 8, resources={"nodeSelector": DGX}, activeDeadlineSeconds=2)).returncode
        == 0
    )
    status = jobs.wait_phase("late", "Failed", timeout=20)
    assert status["reason"] == "DeadlineExceeded"
    wait_for(lambda: all(p.metadata.deletion_timestamp for p in jobs.pods("late")) or None, "pods deleted")


def test_ttl_deletes_the_finished_job_and_its_children(jobs: Jobs) -> None:
    manifest = job("ttl", 8, 8, resources={"nodeSelector": DGX}, ttlSecondsAfterFinished=1)
    assert jobs.apply(manifest).returncode == 0
    jobs.wait_phase("ttl", "Running")
    jobs.fail_pod(jobs.running_pods("ttl", 1)[0].metadata.name)
    jobs.wait_phase("ttl", "Failed")
    wait_for(lambda: jobs.get("ttl") is None or None, "the job deleted by its TTL", 20)
    wait_for(lambda: jobs.pods("ttl") == [] or None, "children garbage-collected", 90)


def test_deleting_the_job_cascades_to_every_child(jobs: Jobs) -> None:
    assert jobs.apply(job("gone", 16, 8, resources={"nodeSelector": DGX})).returncode == 0
    jobs.wait_phase("gone", "Running")
    jobs.running_pods("gone", 2)
    for pod in jobs.pods("gone"):
        refs = pod.metadata.owner_references
        assert refs[0].kind == "VerlJob" and refs[0].controller is True
    assert not (jobs.get("gone") or {})["metadata"].get("finalizers"), "no finalizer is needed"
    jobs.delete("gone")

    def children_gone() -> bool:
        cms = jobs.core.list_namespaced_config_map(jobs.ns, label_selector="verl-operator.io/job=gone").items
        svcs = jobs.core.list_namespaced_service(jobs.ns, label_selector="verl-operator.io/job=gone").items
        return not cms and not svcs and not jobs.pods("gone")

    # The garbage collector may first have to discover the VerlJob kind (a fresh CRD): allow for that.
    wait_for(children_gone, "ConfigMap, Service and pods garbage-collected", 90)


#: A stand-in for Kueue's CRDs: the API group served, no Kueue controller running.
KUEUE_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "localqueues.kueue.x-k8s.io"},
    "spec": {
        "group": "kueue.x-k8s.io",
        "scope": "Namespaced",
        "names": {"plural": "localqueues", "singular": "localqueue", "kind": "LocalQueue"},
        "versions": [
            {
                "name": "v1beta1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}


@pytest.fixture
def kueue_crd(jobs: Jobs, kube: client.ApiClient) -> Iterator[None]:
    """Kueue's API group is served (its CRD installed) for one test; Kueue itself does not run."""
    extensions = client.ApiextensionsV1Api(kube)
    extensions.create_custom_resource_definition(KUEUE_CRD)
    groups = client.ApisApi(kube)
    wait_for(
        lambda: any(g.name == "kueue.x-k8s.io" for g in groups.get_api_versions().groups), "kueue served", 30
    )
    yield
    extensions.delete_custom_resource_definition(KUEUE_CRD["metadata"]["name"])


def test_kueue_queue_name_without_kueue_is_denied(jobs: Jobs) -> None:
    manifest = job("queued", 16, 8, resources={"nodeSelector": DGX}, scheduling={"queueName": "gpu-queue"})
    applied = jobs.apply(manifest)
    assert applied.returncode != 0 and "Kueue is not installed" in applied.stderr, applied.stderr
    assert "spec.scheduling.queueName" in applied.stderr and jobs.get("queued") is None


def test_kueue_queue_name_hands_the_pods_to_kueue_and_their_gpus_count(jobs: Jobs, kueue_crd: None) -> None:
    manifest = job("queued", 16, 8, resources={"nodeSelector": DGX}, scheduling={"queueName": "gpu-queue"})
    applied = jobs.apply(manifest)
    assert applied.returncode == 0, applied.stderr
    # No Kueue controller runs here: nothing holds the pods, the default scheduler places them as they come.
    status = jobs.wait_phase("queued", "Running")
    assert status["placement"]["handoff"] == "Kueue" and status["placement"]["nodes"] == []
    taken = set()
    for pod in jobs.running_pods("queued", 2):
        labels = pod.metadata.labels
        assert labels["kueue.x-k8s.io/queue-name"] == "gpu-queue"
        assert labels["kueue.x-k8s.io/pod-group-name"] == "queued-r0"
        assert pod.metadata.annotations["kueue.x-k8s.io/pod-group-total-count"] == "2"
        assert not pod.spec.scheduling_gates and pod.spec.affinity is None, "Kueue gates and places, not us"
        taken.add(pod.spec.node_name)
    # The operator's own placement counts those GPUs: the next job takes the two other DGX nodes and runs.
    assert jobs.apply(job("after", 16, 8, resources={"nodeSelector": DGX})).returncode == 0
    placed = jobs.wait_phase("after", "Running")
    assert not set(placed["placement"]["nodes"]) & taken, (placed["placement"]["nodes"], taken)


def test_admission_denies_pods_the_cluster_cannot_create_with_its_reason(
    jobs: Jobs, kube: client.ApiClient
) -> None:
    """A missing ServiceAccount or PriorityClass, or a ResourceQuota below the job's GPUs: denied at
    ``kubectl apply`` with the API server's own reason (the dry run of the job's pods) or the quota named."""
    missing_sa = job(
        "nosa", 8, 8, resources={"nodeSelector": DGX}, security={"serviceAccountName": "trainer"}
    )
    missing_pc = job("nopc", 8, 8, resources={"nodeSelector": DGX}, scheduling={"priorityClassName": "nope"})
    for manifest, reason in (
        (missing_sa, 'serviceaccount "trainer" not found'),
        (missing_pc, "PriorityClass"),
    ):
        applied = jobs.apply(manifest)
        assert applied.returncode != 0 and reason in applied.stderr, applied.stderr
    quota = {"metadata": {"name": "gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "4"}}}
    jobs.core.create_namespaced_resource_quota(jobs.ns, quota)
    applied = jobs.apply(job("big", 8, 8, resources={"nodeSelector": DGX}))
    # Denied naming the quota: by the dry run of the pods (the API server's quota admission), or, where that
    # passed (a quota the controller-manager has not measured yet, a dry run proved before the quota's watch
    # event), by the job-wide quota check.
    assert applied.returncode != 0, applied.stdout
    by_dry_run = "exceeded quota: gpus" in applied.stderr
    by_check = f"exceed ResourceQuota {jobs.ns}/gpus (requests.nvidia.com/gpu: 4 < 8)" in applied.stderr
    assert by_dry_run or by_check, applied.stderr
    assert all(jobs.get(n) is None for n in ("nosa", "nopc", "big"))
    # Each pod fits a quota of 12, the job's 16 GPUs do not: denied too; a job of one 8-GPU pod is admitted.
    jobs.core.patch_namespaced_resource_quota(
        "gpus", jobs.ns, {"spec": {"hard": {"requests.nvidia.com/gpu": "12"}}}
    )
    applied = jobs.apply(job("pair", 16, 8, resources={"nodeSelector": DGX}))
    assert applied.returncode != 0 and "16 GPUs in all exceed ResourceQuota" in applied.stderr, applied.stderr
    assert jobs.apply(job("single", 8, 8, resources={"nodeSelector": DGX})).returncode == 0


def test_volcano_without_volcano_says_so(jobs: Jobs) -> None:
    manifest = job("vc", 8, 8, resources={"nodeSelector": DGX}, scheduling={"scheduler": "volcano"})
    assert jobs.apply(manifest).returncode == 0
    status = jobs.wait_phase("vc", "Pending")
    wait_for(
        lambda: jobs.status("vc").get("reason") == "SchedulerUnavailable" or None, "SchedulerUnavailable"
    )
    assert "Volcano" in jobs.status("vc")["message"]
    assert status["placement"]["handoff"] == "Volcano"
    assert jobs.pods("vc") == [], "no pod without its PodGroup"


# ---- admission, CRD -------------------------------------------------------------------------------------


def admission_review(namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0b5c9e1a-1111-2222-3333-444455556666",
            "kind": {"group": GROUP, "version": VERSION, "kind": "VerlJob"},
            "resource": {"group": GROUP, "version": VERSION, "resource": PLURAL},
            "requestKind": {"group": GROUP, "version": VERSION, "kind": "VerlJob"},
            "requestResource": {"group": GROUP, "version": VERSION, "resource": PLURAL},
            "name": manifest["metadata"]["name"],
            "namespace": namespace,
            "operation": "CREATE",
            # An administrator: the policy's SubjectAccessReview asks whether the author may create pods.
            "userInfo": {"username": "pytest", "groups": ["system:masters", "system:authenticated"]},
            "object": {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}},
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


@pytest.mark.parametrize(
    ("manifest", "allowed", "fragment"),
    [
        pytest.param(job("ok", 16, 8), True, None, id="valid"),
        pytest.param(
            job("odd", 16, 8, data={"trainBatchSize": 100}, rollout={"responsesPerPrompt": 1}),
            False,
            "use trainBatchSize 96 or 112",
            id="batch-not-divisible",
        ),
        pytest.param(job("typo", 16, 8, rollout={"nn": 2}), False, "spec.rollout.nn", id="unknown-field"),
    ],
)
def test_webhook_admission_review_round_trip(
    operator: LocalOperator, namespace: str, manifest: dict[str, Any], allowed: bool, fragment: str | None
) -> None:
    ctx = ssl.create_default_context(cafile=str(operator.ca_path))
    request = urllib.request.Request(
        f"https://127.0.0.1:{operator.webhook_port}/verljob",
        data=json.dumps(admission_review(namespace, manifest)).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, context=ctx, timeout=10) as rsp:
        review = json.loads(rsp.read())
    response = review["response"]
    assert review["kind"] == "AdmissionReview" and response["uid"] == "0b5c9e1a-1111-2222-3333-444455556666"
    assert response["allowed"] is allowed
    if fragment is None:
        assert "status" not in response, response
    else:
        # A denial by the rules (422), not a failing check (500) whose text happens to quote the field.
        assert response["status"]["code"] == 422, response
        assert fragment in response["status"]["message"]


def test_cel_rule_rejects_in_the_api_server(jobs: Jobs) -> None:
    applied = jobs.apply(job("cel", 8, 3))
    assert applied.returncode != 0
    assert "spec.resources.gpusPerNode must divide spec.resources.gpus" in applied.stderr
    spmd = job("spmd", 8, 8, rollout={"responsesPerPrompt": 4, "mode": "spmd"})
    applied = jobs.apply(spmd)
    assert applied.returncode != 0 and "spmd exists only with spec.verl.version 0.6" in applied.stderr


def test_kubectl_explain_describes_fields(jobs: Jobs) -> None:
    explained = jobs.kubectl(["explain", "verljob.spec.rollout"])
    assert explained.returncode == 0, explained.stderr
    assert "tensorParallelSize" in explained.stdout and "vLLM tensor parallel size" in explained.stdout


def test_metrics_endpoint(operator: LocalOperator, jobs: Jobs) -> None:
    assert jobs.apply(job("metrics", 8, 8, resources={"nodeSelector": DGX})).returncode == 0
    jobs.wait_phase("metrics", "Running")

    def gauge_shows_it() -> str | None:
        text = operator.metrics()
        return text if 'verl_operator_jobs{phase="Running"} 1.0' in text else None

    text = wait_for(gauge_shows_it, "the Running job in the jobs-by-phase gauge", 10)
    count = next(
        line for line in text.splitlines() if line.startswith("verl_operator_planning_seconds_count")
    )
    assert float(count.split()[-1]) >= 1
    assert "verl_operator_reconcile_errors_total" in text


#: A rendered child's fields that depend on the moment, not on what the operator builds: the job's uid, and
#: the gang gate (removed once every pod of the job exists).
_UIDS = (
    ("metadata", "ownerReferences", "*", "uid"),
    ("data", "launch.json", "job", "uid"),
    ("spec", "schedulingGates"),
)
#: Those that depend on the node chosen (another one while earlier tests' pods still hold GPUs).
_NODE_FIELDS = (("metadata", "annotations", "verl-operator.io/node"), ("spec", "affinity"), ("data",))


def _differences(
    rendered: Any, live: Any, skip: tuple[tuple[str, ...], ...] = _UIDS, path: tuple[str, ...] = ()
) -> list[str]:
    """Where ``live`` differs from what ``rendered`` sets (fields and list items the API server adds, such as
    its default tolerations, are not compared)."""
    if any(len(f) == len(path) and all(a in ("*", b) for a, b in zip(f, path, strict=True)) for f in skip):
        return []
    where = ".".join(path) or "<object>"
    if isinstance(rendered, dict):
        if not isinstance(live, dict):
            return [f"{where}: {live!r} is not an object"]
        return [d for k, v in rendered.items() for d in _differences(v, live.get(k), skip, (*path, k))]
    if isinstance(rendered, list):
        if not isinstance(live, list) or len(live) < len(rendered):
            return [f"{where}: {live!r} instead of {rendered!r}"]
        return [
            d for r, v in zip(rendered, live, strict=False) for d in _differences(r, v, skip, (*path, "*"))
        ]
    return [] if rendered == live else [f"{where}: {live!r} instead of {rendered!r}"]


def _parsed(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with the JSON documents of a ConfigMap's data parsed (compared member by member)."""
    data = obj.get("data") or {}
    parsed = {k: json.loads(v) if k.endswith(".json") else v for k, v in data.items()}
    return {**obj, "data": parsed} if data else obj


def _expected_children(jobs: Jobs, uid: str) -> list[str]:
    """Where the live children of job ``rend`` (8 GPUs on one DGX node, batch 8 x 8 = 64, n 4) differ from
    what the spec asks for, written out here from the spec (not from the builders ``render`` shares with the
    operator): names, ownership, the head pod's command, image and GPUs, the headless Service, the launch
    contract's layout and the planner's keys for the spec's values."""
    ns, problems = jobs.ns, []
    owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VerlJob", "name": "rend", "uid": uid}
    sa = jobs.core.read_namespaced_service_account("rend-ray", ns)
    pod = jobs.core.read_namespaced_pod("rend-r0-head", ns)
    config = jobs.core.read_namespaced_config_map("rend-launch", ns)
    for obj in (sa, pod, config):
        (ref,) = obj.metadata.owner_references
        got = {"apiVersion": ref.api_version, "kind": ref.kind, "name": ref.name, "uid": ref.uid}
        if got != owner or not ref.controller:
            problems.append(f"{obj.kind} {obj.metadata.name}: owner {got}")
    if sa.automount_service_account_token is not False:
        problems.append("the ServiceAccount mounts its token")
    container = pod.spec.containers[0]
    checks = {
        "command": (container.command, ["verl-launcher", "head"]),
        "image": (container.image, IMAGE),
        "gpus": (container.resources.requests.get("nvidia.com/gpu"), "8"),
        "role": (pod.metadata.labels.get("verl-operator.io/role"), "head"),
        "node profile": (node_labels(jobs, pod.spec.node_name).get(PROFILE), DGX[PROFILE]),
    }
    problems += [
        f"pod {what}: {got!r}, expected {want!r}" for what, (got, want) in checks.items() if got != want
    ]
    services = [
        s
        for s in jobs.core.list_namespaced_service(ns).items
        if s.spec.selector == {"verl-operator.io/job": "rend"}
    ]
    if len(services) != 1 or services[0].spec.cluster_ip != "None":
        problems.append(
            f"not one headless Service selecting the job's pods: {[s.metadata.name for s in services]}"
        )
    launch = json.loads(config.data["launch.json"])
    layout = (launch["nnodes"], launch["gpusPerNode"], launch["job"]["name"], launch["job"]["namespace"])
    if layout != (1, 8, "rend", ns):
        problems.append(f"launch.json layout {layout}")
    wanted = {
        "data.train_batch_size=64",
        "actor_rollout_ref.rollout.n=4",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=8",
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
    }
    problems += [f"launch.json lacks {key}" for key in sorted(wanted - set(launch["overrides"]))]
    return problems


def test_render_matches_what_the_operator_creates(jobs: Jobs, tmp_path: Path) -> None:
    """The operator creates the children the spec asks for (:func:`_expected_children`, written from the
    spec); ``verl-operator render`` prints those objects: every child by kind and name, each field it sets as
    the API server holds it (but the job's uid, and the node-dependent fields when earlier tests' pods made the
    operator choose another node); and what the CLI prints reads back as the same."""
    from verl_operator.commands.render import render

    manifest = job("rend", 8, 8, resources={"nodeSelector": DGX})
    assert jobs.apply(manifest).returncode == 0
    jobs.wait_phase("rend", "Running")
    live_pod = jobs.running_pods("rend", 1)[0]
    uid = jobs.custom.get_namespaced_custom_object(GROUP, VERSION, jobs.ns, PLURAL, "rend")["metadata"]["uid"]
    assert _expected_children(jobs, uid) == []
    api = client.ApiClient()
    nodes = [api.sanitize_for_serialization(n) for n in jobs.core.list_node().items]
    rendered = render({**manifest, "metadata": {"name": "rend", "namespace": jobs.ns}}, nodes)
    assert list(yaml.safe_load_all(yaml.safe_dump_all(rendered, sort_keys=False))) == rendered
    read = {
        "ServiceAccount": jobs.core.read_namespaced_service_account,
        "ConfigMap": jobs.core.read_namespaced_config_map,
        "Service": jobs.core.read_namespaced_service,
        "Pod": jobs.core.read_namespaced_pod,
    }
    assert sorted(c["kind"] for c in rendered) == sorted(read), [c["kind"] for c in rendered]
    pod = next(c for c in rendered if c["kind"] == "Pod")
    same_node = pod["metadata"]["annotations"] == (live_pod.metadata.annotations or {})
    skip = _UIDS if same_node else (*_UIDS, *_NODE_FIELDS)
    for child in rendered:
        name = child["metadata"]["name"]
        live = api.sanitize_for_serialization(read[child["kind"]](name, jobs.ns))
        assert _differences(_parsed(child), _parsed(live), skip) == [], (child["kind"], name)
    assert pod["metadata"]["name"] == live_pod.metadata.name
    assert pod["spec"]["containers"][0]["command"] == ["verl-launcher", "head"]


def test_a_job_posts_each_child_once_and_reads_none_back(
    operator: LocalOperator, jobs: Jobs, kube: client.ApiClient
) -> None:
    """From apply to Running, a two-pod job costs one POST of its ServiceAccount, ConfigMap and Service each
    besides the admission dry run of each (none answered 409, as a second post of the creating pass was), no
    read of its ConfigMap, the dry run of the head and a worker, a list of the namespace's quotas, two pod
    creates, and two gate removals."""

    def namespaces_settled() -> bool | None:
        # Deleting earlier tests' namespaces makes other clients post (and be refused) in them.
        return not any(n.status.phase == "Terminating" for n in jobs.core.list_namespace().items) or None

    wait_for(namespaces_settled, "earlier tests' namespaces deleted", 120)
    time.sleep(1.0)  # the namespace's own ServiceAccount and root CA ConfigMap exist by now
    before = _api_requests(kube)
    assert jobs.apply(job("once", 16, 8, resources={"nodeSelector": DGX})).returncode == 0
    jobs.wait_phase("once", "Running")
    jobs.running_pods("once", 2)
    time.sleep(1.0)  # the last status write and its event
    after = _api_requests(kube)
    made = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
    for kind in ("serviceaccounts", "configmaps", "services"):
        assert made.get(f"POST {kind} 201") == 2.0, (kind, made)  # the admission dry run, the create
        assert f"POST {kind} 409" not in made, (kind, made)
    assert not any(k.startswith("GET configmaps") for k in made), made
    assert made.get("PATCH pods 200") == 2.0, made  # the two gate removals, nothing else
    # the dry run of the head and a worker, the two pods; the namespace's quotas are listed for the job-wide
    # quota check instead of a dry-run pod with the job's 16 GPUs
    assert made.get("POST pods 201") == 4.0, made
    assert made.get("LIST resourcequotas 200", 0.0) >= 1.0, made


def _request_totals(kube: client.ApiClient) -> list[tuple[dict[str, str], float]]:
    """The API server's ``apiserver_request_total`` series (every client): each one's labels and count."""
    rsp = kube.rest_client.request("GET", f"{kube.configuration.host}/metrics")
    out = []
    for line in rsp.read().decode().splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(part.split("=", 1) for part in line[line.index("{") + 1 : line.rindex("}")].split(","))
        out.append(({k: v.strip('"') for k, v in labels.items()}, float(line.rsplit(" ", 1)[1])))
    return out


def _api_requests(kube: client.ApiClient) -> dict[str, float]:
    """Namespaced requests the API server has served (every client), by verb, resource and HTTP code."""
    out: dict[str, float] = {}
    for value, count in _request_totals(kube):
        if value.get("scope") not in ("namespace", "resource"):
            continue
        sub = value.get("subresource", "")
        key = f"{value.get('verb')} {value.get('resource')}{'/' + sub if sub else ''} {value.get('code')}"
        out[key] = out.get(key, 0.0) + count
    return out


def _api_reads(kube: client.ApiClient) -> dict[str, float]:
    """Namespaced GET and LIST requests the API server has served for VerlJobs and pods."""
    out: dict[str, float] = {}
    for value, count in _request_totals(kube):
        verb, resource = value.get("verb", ""), value.get("resource", "")
        # Namespaced reads only (what a per-pass GET of the job or LIST of its pods is): a watch that
        # restarts with a LIST, the operator's or another component's, is cluster-wide.
        if (
            verb in ("GET", "LIST")
            and resource in ("verljobs", "pods")
            and value.get("scope") in ("namespace", "resource")
            and not value.get("subresource")
        ):
            key = f"{verb} {resource}"
            out[key] = out.get(key, 0.0) + count
    return out


def _reconciles(operator: LocalOperator) -> float:
    text = operator.metrics().splitlines()
    line = next(row for row in text if row.startswith("verl_operator_reconciles_total "))
    return float(line.split()[1])


def test_reconciles_read_the_watch_cache_not_the_api_server(
    operator: LocalOperator, jobs: Jobs, kube: client.ApiClient
) -> None:
    """Changes of a running job and of its pods trigger reconciles that read nothing from the API server."""
    assert jobs.apply(job("cached", 16, 8, resources={"nodeSelector": DGX})).returncode == 0
    jobs.wait_phase("cached", "Running")
    pods = [p.metadata.name for p in jobs.running_pods("cached", 2)]
    time.sleep(1.0)  # the last status write's event is handled

    def namespaces_settled() -> bool | None:
        # The namespace controller deleting earlier tests' namespaces lists every kind in them.
        return not any(n.status.phase == "Terminating" for n in jobs.core.list_namespace().items) or None

    wait_for(namespaces_settled, "earlier tests' namespaces deleted", 120)
    reads, passes = _api_reads(kube), _reconciles(operator)
    annotate_job = jobs.custom.patch_namespaced_custom_object
    for i in range(3):  # nothing the test does from here reads a VerlJob or a pod
        touch = {"metadata": {"annotations": {"touch": str(i)}}}
        for change in ("job", "pod"):
            if change == "job":
                annotate_job(GROUP, VERSION, jobs.ns, PLURAL, "cached", touch)
            else:
                jobs.core.patch_namespaced_pod(pods[i % 2], jobs.ns, touch)
            before = passes
            wait_for(lambda b=before: _reconciles(operator) > b or None, f"a reconcile of the {change}", 10)
            passes = _reconciles(operator)
    after = _api_reads(kube)
    assert {k: after.get(k, 0.0) - v for k, v in reads.items()} == dict.fromkeys(reads, 0.0)
    assert set(after) == set(reads)


def test_admission_denies_a_job_whose_pods_exceed_a_pod_count_quota(jobs: Jobs) -> None:
    """``pods: 1`` admits each pod of a 2-pod job alone, never the job: denied at ``kubectl apply``."""
    quota = {"metadata": {"name": "one-pod"}, "spec": {"hard": {"pods": "1", "requests.cpu": "1000"}}}
    jobs.core.create_namespaced_resource_quota(jobs.ns, quota)
    applied = jobs.apply(job("pair", 16, 8, resources={"nodeSelector": DGX}))
    assert applied.returncode != 0, applied.stdout
    assert (
        f"the job's 2 Ray pods in all exceed ResourceQuota {jobs.ns}/one-pod (pods: 1 < 2)" in applied.stderr
    )
    assert jobs.get("pair") is None
    assert jobs.apply(job("single", 8, 8, resources={"nodeSelector": DGX})).returncode == 0


def test_a_forged_status_is_overwritten_from_the_pods(jobs: Jobs) -> None:
    """``kubectl patch --subresource=status`` of phase Succeeded on a Running job: the pods stay, the phase
    is derived from them again (Running), a StatusOverwritten Warning event says so."""
    assert jobs.apply(job("forged", 16, 8, resources={"nodeSelector": DGX})).returncode == 0
    jobs.wait_phase("forged", "Running")
    before = {p.metadata.name: p.metadata.uid for p in jobs.running_pods("forged", 2)}
    patched = jobs.kubectl(
        [
            "patch",
            "vj",
            "forged",
            "-n",
            jobs.ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"phase": "Succeeded", "completionTime": "2027-01-01T00:00:00Z"}}),
        ]
    )
    assert patched.returncode == 0, patched.stderr
    wait_for(
        lambda: any(e.reason == "StatusOverwritten" for e in jobs.events("forged")) or None,
        "a StatusOverwritten event",
    )
    status = jobs.wait_phase("forged", "Running")
    assert "completionTime" not in status
    after = {p.metadata.name: p.metadata.uid for p in jobs.running_pods("forged", 2)}
    assert after == before, "the forged phase deleted or replaced pods"


def test_forged_placement_start_time_and_restarts_move_nothing(jobs: Jobs) -> None:
    """``kubectl patch --subresource=status`` of the placement's nodes (nodes that do not exist), a start
    time years before the job and a restart count past ``backoffLimit`` on a Running job with
    ``activeDeadlineSeconds``: the pods stay, the fields are derived again from the pods and the job's
    creation, a StatusOverwritten Warning names them (read as written: NodeLost, then DeadlineExceeded)."""
    manifest = job(
        "forged2", 16, 8, resources={"nodeSelector": DGX}, activeDeadlineSeconds=3600, backoffLimit=1
    )
    assert jobs.apply(manifest).returncode == 0
    running = jobs.wait_phase("forged2", "Running")
    before = {p.metadata.name: p.metadata.uid for p in jobs.running_pods("forged2", 2)}
    forged = dict(running["placement"], nodes=["gone-0", "gone-1"])
    body = {"status": {"placement": forged, "startTime": "2001-01-01T00:00:00Z", "restarts": 7}}
    patch = ["patch", "vj", "forged2", "-n", jobs.ns, "--subresource=status", "--type=merge", "-p"]
    patched = jobs.kubectl([*patch, json.dumps(body)])
    assert patched.returncode == 0, patched.stderr
    event = wait_for(
        lambda: next((e for e in jobs.events("forged2") if e.reason == "StatusOverwritten"), None),
        "a StatusOverwritten event",
    )
    assert "status.placement.nodes gone-0, gone-1" in event.message and "status.startTime" in event.message

    def derived() -> dict[str, Any] | None:
        status = jobs.status("forged2")
        return status if status.get("placement", {}).get("nodes") != ["gone-0", "gone-1"] else None

    status = wait_for(derived, "the placement derived again")
    assert status["phase"] == "Running", status.get("message")
    assert sorted(status["placement"]["nodes"]) == sorted(running["placement"]["nodes"])
    assert status["startTime"] >= (jobs.get("forged2") or {})["metadata"]["creationTimestamp"]
    assert status.get("restarts", 0) == 0
    after = {p.metadata.name: p.metadata.uid for p in jobs.running_pods("forged2", 2)}
    assert after == before, "the forged status deleted or replaced pods"


def test_a_forged_attempt_and_placement_attempt_are_derived_from_the_pods(jobs: Jobs) -> None:
    """``kubectl patch --subresource=status`` of ``attempt`` and ``placement.attempt`` together (5) on a
    Running job whose pods are attempt 0: read as written, the pods would be deleted as an earlier attempt's
    and the job failed or restarted; the operator lists the pods from the API server, finds attempt 0
    running, derives the attempt again and keeps the pods, with a StatusOverwritten Warning."""
    assert jobs.apply(job("forged3", 16, 8, resources={"nodeSelector": DGX})).returncode == 0
    running = jobs.wait_phase("forged3", "Running")
    before = {p.metadata.name: p.metadata.uid for p in jobs.running_pods("forged3", 2)}
    body = {"status": {"attempt": 5, "placement": dict(running["placement"], attempt=5)}}
    patch = ["patch", "vj", "forged3", "-n", jobs.ns, "--subresource=status", "--type=merge", "-p"]
    patched = jobs.kubectl([*patch, json.dumps(body)])
    assert patched.returncode == 0, patched.stderr
    event = wait_for(
        lambda: next((e for e in jobs.events("forged3") if e.reason == "StatusOverwritten"), None),
        "a StatusOverwritten event",
    )
    assert (
        "status.attempt and status.placement.attempt 5: the job's running pods are attempt 0" in event.message
    )

    def derived() -> dict[str, Any] | None:
        status = jobs.status("forged3")
        return (
            status if status.get("attempt", 0) == 0 and status["placement"].get("attempt", 0) == 0 else None
        )

    status = wait_for(derived, "the attempt derived again")
    assert status["phase"] == "Running", status.get("message")
    after = {p.metadata.name: p.metadata.uid for p in jobs.running_pods("forged3", 2)}
    assert after == before, "the forged attempt deleted or replaced pods"


def test_an_image_that_cannot_be_pulled_gives_the_gpus_back_after_the_start_deadline(jobs: Jobs) -> None:
    """The kubelet cannot pull the image (the devcluster's pod-simulate-pull-failure stage): the job says so
    (Starting, ImagePullFailed, PodsStartable=False naming the image), then fails at spec.startDeadlineSeconds
    with its pods deleted: nothing holds the GPUs."""
    manifest = job("nopull", 16, 8, resources={"nodeSelector": DGX}, startDeadlineSeconds=5)
    manifest["spec"]["verl"]["image"] = "registry.invalid/verl:0.9.1"
    assert jobs.apply(manifest).returncode == 0
    wait_for(lambda: jobs.status("nopull").get("reason") == "ImagePullFailed" or None, "ImagePullFailed")
    startable = {c["type"]: c for c in jobs.status("nopull")["conditions"]}["PodsStartable"]
    assert startable["status"] == "False" and "registry.invalid/verl:0.9.1" in startable["message"]
    status = jobs.wait_phase("nopull", "Failed", timeout=60)
    assert status["reason"] == "StartDeadlineExceeded", status
    assert "not started within spec.startDeadlineSeconds 5" in status["message"]
    wait_for(lambda: jobs.pods("nopull") == [] or None, "the pods of nopull deleted")
