"""VerlJobs handed to a real Kueue (v0.17.0, built from its Go module) through its pod-group integration.

One devcluster instance of its own (the DGX H100 profile: 4 nodes x 8 GPUs) with Kueue's controller manager
running out of cluster (``devcluster up --scheduler kueue``'s code path) and one local operator with its
webhook. Kueue, not the operator, decides here: its webhook gates every pod of a queue, its scheduler admits
the pod group against a ClusterQueue's ``nvidia.com/gpu`` quota, and it evicts a lower-priority group to
admit a higher one. Each test has its own namespace, ClusterQueue and LocalQueue.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cluster.operators import webhook_operator
from cluster.polling import wait_for
from verl_devtools.devcluster import DevCluster, binaries
from verl_devtools.devcluster.jobs import GROUP, PLURAL, VERSION, verljob
from verl_devtools.devcluster.kueue import ADMISSION_GATE, start_kueue

pytestmark = pytest.mark.timeout(300)

KUEUE_API = ("kueue.x-k8s.io", "v1beta2")
H100 = "NVIDIA-H100-80GB-HBM3"


@pytest.fixture(scope="module")
def kueue_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DevCluster, client.ApiClient]]:
    """A devcluster of the module's own with the DGX H100 nodes, Kueue and the operator (its webhook too)."""
    cluster = DevCluster(name=f"pytest-{os.getpid()}-kueue", profile="dgx-h100")
    try:
        cluster.up()
        with cluster.api_client() as api:
            start_kueue(cluster.layout, cluster.name, api)
            with webhook_operator(cluster, tmp_path_factory.mktemp("operator"), "kueue"):
                yield cluster, api
                print(Path(cluster.layout.log("kueue")).read_text()[-4000:])
    finally:
        cluster.down()


class Kueued:
    """One test's namespace, ClusterQueue (GPU quota on an H100 flavor) and LocalQueue, and its VerlJobs."""

    def __init__(self, api: client.ApiClient, tag: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.ns = f"kq-{tag}-{uuid.uuid4().hex[:6]}"
        self.cq = f"cq-{self.ns}"
        self.cluster_objects: list[tuple[str, str, str, str]] = []  # (group, version, plural, name)
        self.core.create_namespace({"metadata": {"name": self.ns}})

    def queues(
        self, gpus: int, preemption: dict[str, Any] | None = None, topology: str | None = None
    ) -> None:
        """An H100 ResourceFlavor (with a Topology: Kueue's TAS), a ClusterQueue with ``gpus`` nvidia.com/gpu and
        a LocalQueue ``gpu``."""
        flavor = f"h100-{self.ns}"
        flavor_spec: dict[str, Any] = {"nodeLabels": {"nvidia.com/gpu.product": H100}}
        if topology:
            flavor_spec["topologyName"] = topology
        self._cluster_create("resourceflavors", {"metadata": {"name": flavor}, "spec": flavor_spec})
        spec: dict[str, Any] = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.ns}},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": flavor,
                            "resources": [
                                {"name": "cpu", "nominalQuota": "1000"},
                                {"name": "memory", "nominalQuota": "20Ti"},
                                {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)},
                            ],
                        }
                    ],
                }
            ],
        }
        if preemption:
            spec["preemption"] = preemption
        self._cluster_create("clusterqueues", {"metadata": {"name": self.cq}, "spec": spec})
        self.custom.create_namespaced_custom_object(
            *KUEUE_API,
            self.ns,
            "localqueues",
            {
                "apiVersion": "/".join(KUEUE_API),
                "kind": "LocalQueue",
                "metadata": {"name": "gpu"},
                "spec": {"clusterQueue": self.cq},
            },
        )

    def _cluster_create(self, plural: str, body: dict[str, Any]) -> None:
        kind = {"resourceflavors": "ResourceFlavor", "clusterqueues": "ClusterQueue"}[plural]
        body = {"apiVersion": "/".join(KUEUE_API), "kind": kind, **body}
        self.custom.create_cluster_custom_object(*KUEUE_API, plural, body)
        self.cluster_objects.append((*KUEUE_API, plural, body["metadata"]["name"]))

    def set_gpu_quota(self, gpus: int) -> None:
        cq: Any = self.custom.get_cluster_custom_object(*KUEUE_API, "clusterqueues", self.cq)
        cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]["nominalQuota"] = str(gpus)
        self.custom.replace_cluster_custom_object(*KUEUE_API, "clusterqueues", self.cq, cq)

    def priority_class(self, name: str, value: int) -> str:
        full = f"{name}-{self.ns}"
        client.SchedulingV1Api(self.core.api_client).create_priority_class(
            {"metadata": {"name": full}, "value": value}
        )
        self.cluster_objects.append(("scheduling.k8s.io", "v1", "priorityclasses", full))
        return full

    def submit(self, name: str, gpus: int = 16, priority: str | None = None) -> dict[str, Any]:
        scheduling: dict[str, Any] = {"queueName": "gpu"}
        if priority:
            scheduling["priorityClassName"] = priority
        body = verljob(name, gpus, scheduling=scheduling)
        created: Any = self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, body)
        return dict(created)

    def job(self, name: str) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name))  # type: ignore[arg-type]

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.job(name).get("status") or {})

    def wait(self, name: str, phase: str, reason: str | None = None, timeout: float = 60) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            st = self.status(name)
            return st if st.get("phase") == phase and (reason is None or st.get("reason") == reason) else None

        return wait_for(reached, f"{name} {phase}/{reason} (now {self.status(name)})", timeout)

    def pods(self, name: str) -> list[client.V1Pod]:
        items = self.core.list_namespaced_pod(self.ns, label_selector=f"verl-operator.io/job={name}").items
        return sorted(items, key=lambda p: p.metadata.name)

    def workload(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.custom.get_namespaced_custom_object(*KUEUE_API, self.ns, "workloads", name))  # type: ignore[arg-type]
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def delete_job(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def cleanup(self) -> None:
        with contextlib.suppress(ApiException):
            for job in self.custom.list_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL)["items"]:  # type: ignore[index]
                self.delete_job(job["metadata"]["name"])
        wait_for(lambda: not self.pods_left(), f"pods of {self.ns} gone", 60)
        for group, version, plural, name in reversed(self.cluster_objects):
            with contextlib.suppress(ApiException):
                if plural == "priorityclasses":
                    client.SchedulingV1Api(self.core.api_client).delete_priority_class(name)
                else:
                    self.custom.delete_cluster_custom_object(group, version, plural, name)
        self.core.delete_namespace(self.ns, propagation_policy="Background")

    def pods_left(self) -> list[str]:
        return [p.metadata.name for p in self.core.list_namespaced_pod(self.ns).items]


def gated(pod: client.V1Pod) -> bool:
    return any(g.name == ADMISSION_GATE for g in pod.spec.scheduling_gates or [])


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    conds = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((dict(c) for c in conds if c.get("type") == kind), {})


@pytest.fixture
def kq(
    kueue_cluster: tuple[DevCluster, client.ApiClient], request: pytest.FixtureRequest
) -> Iterator[Kueued]:
    tag = "".join(c for c in request.node.name.lower() if c.isalnum())[:20]
    made = Kueued(kueue_cluster[1], tag)
    try:
        yield made
    finally:
        made.cleanup()


def test_over_quota_the_gang_stays_gated_with_kueues_reason_then_runs_once_admitted(kq: Kueued) -> None:
    """8 GPUs of quota, a job of 2 pods x 8 GPUs: one pod would fit the quota, none is admitted (the group is
    one Workload); the job is Pending with the message of the Workload's QuotaReserved condition. Raising the
    quota to 16 admits the group: Kueue removes every gate, the scheduler binds the pods, the job runs."""
    kq.queues(gpus=8)
    kq.submit("big")
    status = kq.wait("big", "Pending", "NotAdmitted")
    pods = kq.pods("big")
    assert len(pods) == 2 and all(gated(p) for p in pods), [p.spec.scheduling_gates for p in pods]
    assert all(not p.spec.node_name for p in pods), "a gated pod holds no node"
    assert {p.metadata.labels["kueue.x-k8s.io/pod-group-name"] for p in pods} == {"big-r0"}
    reserved = wait_for(
        lambda: condition(kq.workload("big-r0"), "QuotaReserved").get("message"), "Kueue's reason", 30
    )
    assert "nvidia.com/gpu" in reserved, reserved

    def with_kueues_message() -> dict[str, Any] | None:
        st = kq.status("big")
        return st if reserved in st.get("message", "") else None

    status = wait_for(with_kueues_message, f"Kueue's message {reserved!r} in the job's status", 30)
    placed = next(c for c in status["conditions"] if c["type"] == "Placed")
    assert placed["status"] == "False" and placed["reason"] == "NotAdmitted" and reserved in placed["message"]

    kq.set_gpu_quota(16)
    status = kq.wait("big", "Running", timeout=60)
    pods = kq.pods("big")
    assert all(not gated(p) and p.spec.node_name for p in pods), [
        (p.spec.scheduling_gates, p.spec.node_name) for p in pods
    ]
    assert status.get("restarts", 0) == 0
    assert condition(kq.workload("big-r0"), "Admitted").get("status") == "True"
    placed = next(c for c in status["conditions"] if c["type"] == "Placed")
    assert (placed["status"], placed["reason"]) == ("True", "Admitted"), placed


def test_two_jobs_that_do_not_both_fit_run_in_kueues_order(kq: Kueued) -> None:
    """16 GPUs of quota, two 16-GPU jobs: the first is admitted and runs, the second waits gated; deleting the
    first releases its quota and the second runs. Deleting both leaves the ClusterQueue with nothing reserved."""
    kq.queues(gpus=16)
    kq.submit("first")
    kq.wait("first", "Running")
    kq.submit("second")
    waiting = kq.wait("second", "Pending", "NotAdmitted")
    assert "Kueue has not admitted pod group second-r0" in waiting["message"], waiting["message"]
    assert all(gated(p) and not p.spec.node_name for p in kq.pods("second"))
    assert kq.status("first")["phase"] == "Running"

    kq.delete_job("first")
    kq.wait("second", "Running", timeout=90)
    assert all(not gated(p) for p in kq.pods("second"))
    kq.delete_job("second")

    def released() -> bool:
        cq: Any = kq.custom.get_cluster_custom_object(*KUEUE_API, "clusterqueues", kq.cq)
        return (cq.get("status") or {}).get("reservingWorkloads") == 0

    wait_for(released, "the ClusterQueue reserving nothing after both jobs are deleted", 90)


def test_a_higher_priority_job_preempts_and_the_preempted_job_requeues(kq: Kueued) -> None:
    """Kueue preempts a running low-priority job for a high-priority one (withinClusterQueue: LowerPriority):
    its pods are evicted; the job is Pending (Preempted) with Kueue's message, restarts and spec unchanged,
    and its next attempt is a new pod group that Kueue gates until the high-priority job is deleted."""
    low, high = kq.priority_class("low", 100), kq.priority_class("high", 1000)
    kq.queues(gpus=16, preemption={"withinClusterQueue": "LowerPriority"})
    created = kq.submit("victim", priority=low)
    kq.wait("victim", "Running")
    kq.submit("urgent", priority=high)

    def preempted() -> dict[str, Any] | None:
        st = kq.status("victim")
        return st if condition({"status": st}, "Preempted").get("status") == "True" else None

    def kueue_side() -> str:
        urgent = kq.workload("urgent-r0") or {}
        return f"urgent's Workload: priority {urgent.get('spec', {}).get('priority')}, {urgent.get('status')}"

    try:
        status = wait_for(preempted, "victim's Preempted condition", 90)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {kueue_side()}") from exc
    message = condition({"status": status}, "Preempted")["message"]
    assert "Kueue evicted the Ray pods of attempt 0" in message and "preempt" in message.lower(), message
    assert status.get("restarts", 0) == 0 and status["attempt"] == 1
    assert kq.job("victim")["spec"] == created["spec"], "the spec is left as the user wrote it"
    kq.wait("urgent", "Running", timeout=90)
    waiting = kq.wait("victim", "Pending", "NotAdmitted", timeout=60)
    pods = kq.pods("victim")
    assert {p.metadata.labels["kueue.x-k8s.io/pod-group-name"] for p in pods} == {"victim-r1"}
    assert all(gated(p) and not p.spec.node_name for p in pods), "the next attempt waits for quota, gated"
    assert waiting.get("restarts", 0) == 0

    kq.delete_job("urgent")
    final = kq.wait("victim", "Running", timeout=90)
    assert final["attempt"] == 1 and final.get("restarts", 0) == 0
    assert condition({"status": final}, "Preempted").get("status") == "False"
    assert all(p.metadata.name.startswith("victim-r1-") for p in kq.pods("victim"))


def test_the_example_queues_and_job_run_as_documented(
    kueue_cluster: tuple[DevCluster, client.ApiClient], tmp_path: Path
) -> None:
    """``examples/kueue/queues.yaml`` and ``examples/jobs/grpo-qwen7b-kueue.yaml`` applied with kubectl, as
    docs/operator.md walks through them: the job is admitted by the example ClusterQueue and runs."""
    cluster, api = kueue_cluster
    made = Kueued(api, "example")
    kubectl = str(binaries.ensure(("kubectl",))["kubectl"])
    examples = Path(__file__).resolve().parents[2] / "examples"

    def apply(path: Path) -> None:
        done = subprocess.run(
            [kubectl, f"--kubeconfig={cluster.kubeconfig}", "apply", "-n", made.ns, "-f", str(path)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr

    try:
        apply(examples / "kueue" / "queues.yaml")
        made.cluster_objects += [
            (*KUEUE_API, "clusterqueues", "gpu-cluster-queue"),
            (*KUEUE_API, "resourceflavors", "h100"),
        ]
        apply(examples / "jobs" / "grpo-qwen7b-kueue.yaml")
        status = made.wait("grpo-qwen7b-kueue", "Running", timeout=90)
        assert status["placement"]["handoff"] == "Kueue"
        admitted = condition(made.workload("grpo-qwen7b-kueue-r0"), "Admitted")
        assert admitted.get("status") == "True", admitted
        pods = made.pods("grpo-qwen7b-kueue")
        assert len(pods) == 2 and all(p.spec.node_name and not gated(p) for p in pods)
    finally:
        made.cleanup()


def test_a_required_rack_is_kueues_topology_aware_scheduling(kq: Kueued) -> None:
    """``placement.topologyKey`` (the rack label) with ``topologyPolicy: required`` becomes Kueue's
    ``podset-required-topology``: with a Topology of racks and nodes on the flavor, Kueue assigns the whole pod
    group to one rack (its Workload's topology assignment) and both pods run on nodes of that rack."""
    rack = "network.topology.nvidia.com/leaf"
    topology = f"racks-{kq.ns}"
    kq.custom.create_cluster_custom_object(
        *KUEUE_API,
        "topologies",
        {
            "apiVersion": "/".join(KUEUE_API),
            "kind": "Topology",
            "metadata": {"name": topology},
            "spec": {"levels": [{"nodeLabel": rack}, {"nodeLabel": "kubernetes.io/hostname"}]},
        },
    )
    kq.cluster_objects.append((*KUEUE_API, "topologies", topology))
    kq.queues(gpus=16, topology=topology)
    body = verljob(
        "racked",
        16,
        scheduling={"queueName": "gpu"},
        placement={"topologyKey": rack, "topologyPolicy": "required"},
    )
    kq.custom.create_namespaced_custom_object(GROUP, VERSION, kq.ns, PLURAL, body)
    kq.wait("racked", "Running", timeout=90)
    pods = kq.pods("racked")
    assert all(p.metadata.annotations["kueue.x-k8s.io/podset-required-topology"] == rack for p in pods)
    admission = ((kq.workload("racked-r0") or {}).get("status") or {}).get("admission") or {}
    assignments = admission.get("podSetAssignments") or []
    assert assignments and all(a.get("topologyAssignment") for a in assignments), admission
    nodes = client.CoreV1Api(kq.core.api_client)
    racks = {nodes.read_node(p.spec.node_name).metadata.labels[rack] for p in pods}
    assert len(racks) == 1, racks
