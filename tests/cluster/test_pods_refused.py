"""Pods the API server refuses or cannot take now, seen by an operator without its webhook (the dry run at
admission is in ``test_admission_hostile.py`` and ``test_operator_jobs.py``).

Refused for good (Pod Security): the job is ``Invalid`` with Pod Security's own message and frees its GPUs.
Not now (a missing ServiceAccount or PriorityClass, a ResourceQuota below the job's GPUs, a child's name taken
by an object the job does not own): the job is ``Pending`` naming the object and the cause, holds no GPUs,
and runs by itself once the cause is gone; the other object is never changed, adopted or deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from cluster.polling import wait_for
from verl_devtools.devcluster import DevCluster
from verl_devtools.devcluster.jobs import verljob
from verl_devtools.devcluster.localrun import LocalOperator, install_crd

GROUP, VERSION, PLURAL = "verl-operator.io", "v1alpha1", "verljobs"
H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-PCIE-40GB"

pytestmark = pytest.mark.timeout(180)


def job(name: str, **security: Any) -> dict[str, Any]:
    # Both mixed-h100 nodes: the second job can only run once the first frees them.
    return verljob(
        name,
        16,
        model="Qwen/Qwen2.5-0.5B-Instruct",
        train_batch_size=64,
        resources={"gpuProduct": H100},
        security=security,
    )


@pytest.fixture
def restricted(kube: client.ApiClient) -> Iterator[str]:
    name = f"t-refused-{os.urandom(3).hex()}"
    core = client.CoreV1Api(kube)
    labels = {"pod-security.kubernetes.io/enforce": "restricted", "verl-operator.io/test": "true"}
    core.create_namespace({"metadata": {"name": name, "labels": labels}})
    yield name
    custom = client.CustomObjectsApi(kube)
    for item in custom.list_namespaced_custom_object(GROUP, VERSION, name, PLURAL)["items"]:
        custom.delete_namespaced_custom_object(GROUP, VERSION, name, PLURAL, item["metadata"]["name"])
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(name).items or None, "pods gone", 30)
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="module")
def operator(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalOperator]:
    """One operator process without a webhook, shared by the module."""
    install_crd(devcluster.kubeconfig)
    op = LocalOperator(devcluster.kubeconfig, tmp_path_factory.mktemp("operator"), webhook_name=None)
    op.start()
    yield op
    op.stop()
    print(op.log_tail(60))


def test_refused_pods_make_the_job_invalid_and_release_its_gpus(
    operator: LocalOperator, kube: client.ApiClient, kubectl: Any, restricted: str
) -> None:
    custom, core = client.CustomObjectsApi(kube), client.CoreV1Api(kube)

    def status(name: str) -> dict[str, Any]:
        obj: Any = custom.get_namespaced_custom_object(GROUP, VERSION, restricted, PLURAL, name)
        return dict(obj.get("status") or {})

    applied = kubectl(["apply", "-n", restricted, "-f", "-"], input=json.dumps(job("rootful")))
    assert applied.returncode == 0, "no webhook: the API server admits the job"
    refused = wait_for(
        lambda: status("rootful") if status("rootful").get("reason") == "PodsRefused" else None,
        "rootful PodsRefused",
        60,
    )
    assert refused["phase"] == "Invalid" and "violates PodSecurity" in refused["message"]
    assert "runAsNonRoot" in refused["message"] and "placement" not in refused
    events = [e for e in core.list_namespaced_event(restricted).items if e.involved_object.name == "rootful"]
    assert any(e.type == "Warning" and e.reason == "PodsRefused" for e in events)
    # Its GPUs are free: a job that passes Pod Security takes the same nodes.
    nonroot = job("nonroot", podSecurityContext={"runAsNonRoot": True, "runAsUser": 1000})
    assert kubectl(["apply", "-n", restricted, "-f", "-"], input=json.dumps(nonroot)).returncode == 0
    wait_for(lambda: status("nonroot").get("phase") == "Running", "nonroot Running", 60)
    assert status("rootful")["phase"] == "Invalid", "a refused job is not retried for the same spec"


class Jobs:
    """Apply, read and delete VerlJobs of one namespace."""

    def __init__(self, kube: client.ApiClient, kubectl: Any, namespace: str) -> None:
        self.custom, self.core, self.kubectl, self.ns = (
            client.CustomObjectsApi(kube),
            client.CoreV1Api(kube),
            kubectl,
            namespace,
        )

    def apply(self, manifest: dict[str, Any]) -> None:
        applied = self.kubectl(["apply", "-n", self.ns, "-f", "-"], input=json.dumps(manifest))
        assert applied.returncode == 0, applied.stderr

    def status(self, name: str) -> dict[str, Any]:
        obj: Any = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)
        return dict(obj.get("status") or {})

    def wait(self, name: str, phase: str, reason: str | None = None, timeout: float = 60) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            now = self.status(name)
            ok = now.get("phase") == phase and (reason is None or now.get("reason") == reason)
            return now if ok else None

        return wait_for(probe, f"{self.ns}/{name} {phase}/{reason} (now {self.status(name)})", timeout)

    def owned_pods(self, name: str) -> list[client.V1Pod]:
        items = self.core.list_namespaced_pod(self.ns, label_selector=f"verl-operator.io/job={name}").items
        return [p for p in items if p.metadata.owner_references and not p.metadata.deletion_timestamp]

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)
        self.core.delete_collection_namespaced_pod(
            self.ns, label_selector=f"verl-operator.io/job={name}", grace_period_seconds=0
        )
        wait_for(lambda: not self.owned_pods(name) or None, f"pods of {name} gone", 30)


def small(name: str, gpus: int = 8, product: str = H100, **spec: Any) -> dict[str, Any]:
    body = job(name)
    body["spec"].pop("security")
    body["spec"]["resources"] = {"gpus": gpus, "gpusPerNode": 8, "gpuProduct": product}
    body["spec"].update(spec)
    return body


@pytest.fixture
def quota_namespace(kube: client.ApiClient) -> Iterator[str]:
    """A namespace whose ResourceQuota allows 4 GPUs."""
    name = f"t-quota-{os.urandom(3).hex()}"
    core = client.CoreV1Api(kube)
    core.create_namespace({"metadata": {"name": name, "labels": {"verl-operator.io/test": "true"}}})
    quota = {"metadata": {"name": "gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "4"}}}
    core.create_namespaced_resource_quota(name, quota)
    yield name
    custom = client.CustomObjectsApi(kube)
    for item in custom.list_namespaced_custom_object(GROUP, VERSION, name, PLURAL)["items"]:
        custom.delete_namespaced_custom_object(GROUP, VERSION, name, PLURAL, item["metadata"]["name"])
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(name).items or None, "pods gone", 30)
    core.delete_namespace(name, propagation_policy="Background")


def test_pods_that_cannot_be_created_now_free_the_gpus_and_run_once_the_cause_is_gone(
    operator: LocalOperator, kube: client.ApiClient, kubectl: Any, namespace: str, quota_namespace: str
) -> None:
    """A missing ServiceAccount, a missing PriorityClass, a quota below the job's GPUs: each job is Pending
    naming the object, holds no GPUs (a job needing every H100 runs meanwhile), and runs once it is fixed."""
    jobs, quoted = Jobs(kube, kubectl, namespace), Jobs(kube, kubectl, quota_namespace)
    core = client.CoreV1Api(kube)
    scheduling = client.SchedulingV1Api(kube)
    urgent = f"urgent-{os.urandom(3).hex()}"
    jobs.apply(small("nosa", security={"serviceAccountName": "trainer"}))
    jobs.apply(small("nopc", scheduling={"priorityClassName": urgent}))
    quoted.apply(small("quota", product=A100))
    try:
        blocked = {
            "nosa": (jobs, "ServiceAccountNotFound", f"ServiceAccount {namespace}/trainer does not exist"),
            "nopc": (jobs, "PriorityClassNotFound", f"PriorityClass {urgent} does not exist"),
            "quota": (quoted, "QuotaExceeded", f"ResourceQuota {quota_namespace}/gpus is exceeded"),
        }
        for name, (where, reason, names) in blocked.items():
            status = where.wait(name, "Pending", reason)
            assert names in status["message"] and "placement" not in status, status
            conditions = {c["type"]: c for c in status["conditions"]}
            assert (
                conditions["PodsCreatable"]["reason"] == reason and names in conditions["Placed"]["message"]
            )
            assert where.owned_pods(name) == [], "no pod of a blocked job holds GPUs"
        # Nothing holds the H100s: a job that needs both nodes runs.
        jobs.apply(small("everything", gpus=16))
        jobs.wait("everything", "Running")
        jobs.delete("everything")
        # The causes go: each job runs by itself.
        core.create_namespaced_service_account(namespace, {"metadata": {"name": "trainer"}})
        scheduling.create_priority_class({"metadata": {"name": urgent}, "value": 100})
        core.delete_namespaced_resource_quota("gpus", quota_namespace)
        for name, (where, _, _) in blocked.items():
            status = where.wait(name, "Running", timeout=60)
            assert "PodsCreatable" not in {c["type"] for c in status["conditions"]}
    finally:
        with contextlib.suppress(client.ApiException):
            scheduling.delete_priority_class(urgent)


def test_children_never_take_over_objects_the_job_does_not_own(
    operator: LocalOperator, kube: client.ApiClient, kubectl: Any, namespace: str
) -> None:
    """A ServiceAccount, a ConfigMap, a Service and a pod holding the names of a job's children (and a pod
    that carries a job's label): each job is Pending ``NameTaken`` naming the object and holds no GPUs; the
    objects stay as they were."""
    jobs, core = Jobs(kube, kubectl, namespace), client.CoreV1Api(kube)
    plain = {"containers": [{"name": "c", "image": "example.com/app:1"}]}
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "sa-ray"}})
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "cm-launch"}, "data": {"mine": "keep"}}
    )
    web = {"selector": {"app": "web"}, "ports": [{"port": 80}]}
    core.create_namespaced_service(namespace, {"metadata": {"name": "svc-ray"}, "spec": web})
    core.create_namespaced_pod(namespace, {"metadata": {"name": "pod-r0-head"}, "spec": plain})
    lookalike = {
        "name": "lookalike",
        "labels": {"verl-operator.io/job": "pod", "verl-operator.io/attempt": "7"},
    }
    core.create_namespaced_pod(namespace, {"metadata": lookalike, "spec": plain})
    taken = {
        "sa": f"ServiceAccount {namespace}/sa-ray",
        "cm": f"ConfigMap {namespace}/cm-launch",
        "svc": f"Service {namespace}/svc-ray",
        "pod": f"Pod {namespace}/pod-r0-head",
    }
    for name in taken:
        jobs.apply(small(name, product=H100 if name != "svc" else A100))
    seen: dict[str, dict[str, Any]] = {}  # each is NameTaken at least until its retry, 10 s later

    def all_taken() -> bool:
        for name in set(taken) - set(seen):
            now = jobs.status(name)
            if (now.get("phase"), now.get("reason")) == ("Pending", "NameTaken"):
                seen[name] = now
        return len(seen) == len(taken)

    wait_for(all_taken, f"every job NameTaken (seen {sorted(seen)})", 60)
    for name, what in taken.items():
        message = seen[name]["message"]
        assert f"{what} exists and is not owned by the job" in message and "placement" not in seen[name]
    for name in taken:
        assert "placement" not in jobs.status(name) and jobs.owned_pods(name) == []
    assert not core.read_namespaced_service_account("sa-ray", namespace).metadata.owner_references
    config = core.read_namespaced_config_map("cm-launch", namespace)
    assert config.data == {"mine": "keep"} and not config.metadata.owner_references
    service = core.read_namespaced_service("svc-ray", namespace)
    assert service.spec.selector == {"app": "web"} and service.spec.cluster_ip != "None"
    assert not service.metadata.owner_references
    head = core.read_namespaced_pod("pod-r0-head", namespace)
    assert not head.metadata.owner_references and not head.metadata.labels
    # The user removes the pod that held the head pod's name, and the ConfigMap: those jobs run by themselves.
    core.delete_namespaced_pod("pod-r0-head", namespace, grace_period_seconds=0)
    jobs.wait("pod", "Running")
    assert [p.metadata.name for p in jobs.owned_pods("pod")] == ["pod-r0-head"], "the name, now the job's own"
    assert core.read_namespaced_pod("lookalike", namespace).metadata.deletion_timestamp is None
    core.delete_namespaced_config_map("cm-launch", namespace)
    jobs.wait("cm", "Running")


def test_the_status_of_a_job_with_huge_user_input_stays_small(
    operator: LocalOperator, kube: client.ApiClient, kubectl: Any, namespace: str
) -> None:
    """128 + 128 data paths of 1,000 characters and 256 pass-through overrides of 2,000: the job runs, its
    status stays under 8 KB, and the launch ConfigMap carries every override."""
    jobs, core = Jobs(kube, kubectl, namespace), client.CoreV1Api(kube)
    body = small("huge")
    body["spec"]["data"] = {
        "trainBatchSize": 64,
        "trainFiles": [f"/data/train/{i:03d}/" + "x" * 970 + ".parquet" for i in range(128)],
        "valFiles": [f"/data/val/{i:03d}/" + "v" * 970 + ".parquet" for i in range(128)],
    }
    body["spec"]["overrides"] = [f"+trainer.custom_{i}=" + "y" * 1980 for i in range(256)]
    # Created, not applied: kubectl apply would keep the whole spec again in an annotation (256 KB at most).
    jobs.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    status = jobs.wait("huge", "Running")
    assert len(json.dumps(status)) < 8192
    launch = json.loads(core.read_namespaced_config_map("huge-launch", namespace).data["launch.json"])
    assert launch["overrides"][-256:] == [o for o in body["spec"]["overrides"]]
    assert any(o.startswith("data.train_files=") and len(o) > 120_000 for o in launch["overrides"])


def test_objects_lost_after_admission_block_the_job_until_they_are_back(
    operator: LocalOperator, kube: client.ApiClient, kubectl: Any, namespace: str
) -> None:
    """A suspended job whose ServiceAccount is deleted, then resumed; a waiting job patched to a PriorityClass
    that does not exist: each is Pending naming the object once it is placed, and runs when it is back."""
    jobs, core = Jobs(kube, kubectl, namespace), client.CoreV1Api(kube)
    scheduling = client.SchedulingV1Api(kube)
    later = f"later-{os.urandom(3).hex()}"
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "runner"}})
    jobs.apply(small("resumed", suspend=True, security={"serviceAccountName": "runner"}))
    jobs.wait("resumed", "Suspended")
    core.delete_namespaced_service_account("runner", namespace)
    jobs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "resumed", {"spec": {"suspend": False}}
    )
    status = jobs.wait("resumed", "Pending", "ServiceAccountNotFound")
    assert f"ServiceAccount {namespace}/runner does not exist" in status["message"]
    # Both H100 nodes are busy (the hog and the first job's retries free one of them): "waiting" waits.
    jobs.apply(small("hog", gpus=8))
    jobs.wait("hog", "Running")
    jobs.apply(small("waiting", gpus=16))
    jobs.wait("waiting", "Pending", "InsufficientCapacity")
    jobs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "waiting", {"spec": {"scheduling": {"priorityClassName": later}}}
    )
    jobs.delete("hog")
    try:
        status = jobs.wait("waiting", "Pending", "PriorityClassNotFound")
        assert f"PriorityClass {later} does not exist" in status["message"] and "placement" not in status
        scheduling.create_priority_class({"metadata": {"name": later}, "value": 10})
        jobs.wait("waiting", "Running")  # at once: the PriorityClass event retries it
        jobs.delete("waiting")
        core.create_namespaced_service_account(namespace, {"metadata": {"name": "runner"}})
        jobs.wait("resumed", "Running")
    finally:
        with contextlib.suppress(client.ApiException):
            scheduling.delete_priority_class(later)


def test_a_job_handed_to_kueue_without_kueue_gets_no_pods(
    operator: LocalOperator, kube: client.ApiClient, kubectl: Any, namespace: str
) -> None:
    """No webhook to deny ``queueName`` and no Kueue: nothing would gate the pods, so none is created (they
    would be bound at once, ahead of the queue); the job says why."""
    jobs = Jobs(kube, kubectl, namespace)
    jobs.apply(small("queued", scheduling={"queueName": "gpu-queue"}))
    status = jobs.wait("queued", "Pending", "SchedulerUnavailable")
    assert "kueue.x-k8s.io" in status["message"] and "is Kueue installed?" in status["message"]
    assert jobs.owned_pods("queued") == []
