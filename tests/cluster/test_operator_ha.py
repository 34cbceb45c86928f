"""High availability: two operator processes with leader election on one Lease, the leader killed mid-creation.

Both processes watch the cluster and serve the validating webhook; only the holder of the Lease reconciles.
The leader creates pods slowly (``VERL_OPERATOR_CREATE_DELAY_SECONDS``) and is killed with SIGKILL while it
is creating a job's pods; a second job is created while no replica leads. The standby must take the Lease
over within the lease's duration plus a few seconds, finish the first job with exactly its pods (the ones
already created kept, where the placement said) and place the second; its webhook answers throughout.

Admission is tested through the standby's own webhook server (AdmissionReviews posted to it over HTTPS, with
its certificate): in local mode each process would manage a webhook configuration of its own pointing at
itself, and in a cluster the chart's one configuration points at a Service in front of both pods, which a
local process has no equivalent of. What is tested is what the Service relies on: the surviving replica
answers reviews whatever happens to the leader.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cluster.polling import wait_for
from verl_devtools.devcluster import DevCluster
from verl_devtools.devcluster.jobs import verljob
from verl_devtools.devcluster.localrun import LocalOperator
from verl_operator.clusters.labels import PROFILE
from verl_operator.controller.reconcile import CREATE_DELAY_ENV
from verl_operator.manifests.names import GANG_GATE

GROUP, VERSION, PLURAL = "verl-operator.io", "v1alpha1", "verljobs"
#: The election's defaults (client-go's): the standby takes over this long after it last saw a renew.
LEASE_DURATION, RETRY_PERIOD = 15.0, 2.0

pytestmark = pytest.mark.timeout(150)


def make_job(name: str, gpus: int, **spec: Any) -> dict[str, Any]:
    return verljob(name, gpus, resources={"nodeSelector": {PROFILE: "dgx-h100"}}, **spec)


#: Short durations for the tests that are about what the standby does, not how soon: lease, renew, retry.
QUICK = (
    "--leader-election-lease-duration=4",
    "--leader-election-renew-deadline=2",
    "--leader-election-retry-period=0.5",
)


def replica(
    devcluster: DevCluster,
    workdir: Path,
    name: str,
    namespace: str,
    lease: str,
    durations: tuple[str, ...] = (),
    **env: str,
) -> LocalOperator:
    """One replica: leader election on ``namespace/lease`` (default durations unless ``durations`` names
    others), the webhook served."""
    return LocalOperator(
        devcluster.kubeconfig,
        workdir,
        webhook_name=None,
        serve_webhook=True,
        env={"POD_NAME": name, **env},  # the holder identity starts with it
        extra_args=(
            "--leader-elect",
            f"--leader-election-namespace={namespace}",
            f"--leader-election-id={lease}",
            *durations,
        ),
    )


def holder(kube: client.ApiClient, namespace: str, lease: str) -> str:
    try:
        obj = client.CoordinationV1Api(kube).read_namespaced_lease(lease, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return ""
        raise
    return str(obj.spec.holder_identity or "")


def _delete(custom: client.CustomObjectsApi, namespace: str, *names: str) -> None:
    """Delete the VerlJobs ``names`` (one already gone is fine)."""
    for name in names:
        try:
            custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def review(operator: LocalOperator, namespace: str, job: dict[str, Any]) -> dict[str, Any]:
    """POST a CREATE AdmissionReview of ``job`` to the operator's webhook server; its response."""
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": GROUP, "version": VERSION, "kind": "VerlJob"},
            "resource": {"group": GROUP, "version": VERSION, "resource": PLURAL},
            "operation": "CREATE",
            "namespace": namespace,
            "name": job["metadata"]["name"],
            "userInfo": {"username": "admin", "groups": ["system:masters", "system:authenticated"]},
            "object": {**job, "metadata": {**job["metadata"], "namespace": namespace}},
        },
    }
    tls = ssl.create_default_context(cafile=str(operator.ca_path))
    request = urllib.request.Request(
        f"https://127.0.0.1:{operator.webhook_port}/verljob",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, context=tls, timeout=5) as answer:
        return dict(json.loads(answer.read())["response"])


def webhook_up(operator: LocalOperator, namespace: str) -> bool:
    """The webhook server answers (it starts a moment after the health endpoint)."""
    try:
        review(operator, namespace, make_job("probe-bad", 16, data={"trainBatchSize": 100}))
    except OSError:
        return False
    return True


class Reviewer(threading.Thread):
    """Posts a denied and an allowed review to one webhook server, one after the other, until stopped."""

    def __init__(self, operator: LocalOperator, namespace: str) -> None:
        super().__init__(daemon=True)
        self.operator, self.namespace = operator, namespace
        self.answers: list[float] = []
        self.failures: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        bad = make_job("probe-bad", 16, data={"trainBatchSize": 100}, rollout={"responsesPerPrompt": 1})
        good = make_job("probe-good", 8)
        while not self.halt.is_set():
            for job, allowed in ((bad, False), (good, True)):
                try:
                    answer = review(self.operator, self.namespace, job)
                except Exception as exc:  # every failure is recorded and asserted on
                    self.failures.append(f"{time.monotonic():.1f}: {exc!r}")
                    continue
                if answer.get("allowed") is not allowed:
                    self.failures.append(f"{job['metadata']['name']}: {answer}")
                elif not allowed and "use trainBatchSize 96 or 112" not in answer["status"]["message"]:
                    self.failures.append(f"denied for another reason: {answer}")
                else:
                    self.answers.append(time.monotonic())
            self.halt.wait(0.2)


def test_killed_leader_the_standby_takes_over_without_duplicates_and_admission_answers(
    devcluster: DevCluster, dgx: None, kube: client.ApiClient, kubectl: Any, namespace: str, tmp_path: Path
) -> None:
    core, custom = client.CoreV1Api(kube), client.CustomObjectsApi(kube)
    lease = f"ha-{uuid.uuid4().hex[:6]}"

    def pods(job: str | None = None) -> list[client.V1Pod]:
        selector = f"verl-operator.io/job={job}" if job else "verl-operator.io/job"
        return core.list_namespaced_pod(namespace, label_selector=selector).items

    def job_status(name: str) -> dict[str, Any]:
        obj: Any = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        return dict(obj.get("status") or {})

    leader = replica(devcluster, tmp_path / "a", "op-a", namespace, lease, **{CREATE_DELAY_ENV: "2"})
    standby = replica(devcluster, tmp_path / "b", "op-b", namespace, lease)
    reviewer = Reviewer(standby, namespace)
    try:
        leader.start()
        wait_for(lambda: holder(kube, namespace, lease).startswith("op-a_"), "op-a holds the lease", 20, 0.1)
        standby.start()
        assert "verl_operator_leader 0.0" in standby.metrics()
        assert "verl_operator_leader 1.0" in leader.metrics()
        wait_for(lambda: webhook_up(standby, namespace), "the standby's webhook server", 20, 0.1)
        reviewer.start()

        applied = kubectl(["apply", "-n", namespace, "-f", "-"], input=json.dumps(make_job("big", 24)))
        assert applied.returncode == 0, applied.stderr
        wait_for(lambda: len(pods("big")) >= 1 or None, "the leader's first pod", 30, 0.05)
        leader.kill()
        killed = time.monotonic()
        before = pods("big")
        assert 1 <= len(before) < 3, "killed in the middle of creating the 3 pods"
        placement = job_status("big")["placement"]
        assert "verl_operator_reconciles_total 0.0" in standby.metrics(), "the standby reconciled nothing"

        # Created while no replica leads: the standby must place it once it takes over.
        applied = kubectl(["apply", "-n", namespace, "-f", "-"], input=json.dumps(make_job("small", 8)))
        assert applied.returncode == 0, applied.stderr
        time.sleep(1)
        assert job_status("small").get("phase") is None, (
            "no replica reconciles while the lease is held by a dead one"
        )

        wait_for(
            lambda: holder(kube, namespace, lease).startswith("op-b_"),
            "op-b takes the lease over",
            LEASE_DURATION + 3 * RETRY_PERIOD + 5,
            0.05,
        )
        failover = time.monotonic() - killed
        assert failover < LEASE_DURATION + 3 * RETRY_PERIOD, f"took over after {failover:.1f}s"
        for name in ("big", "small"):
            wait_for(lambda n=name: job_status(n).get("phase") == "Running" or None, f"{name} Running", 30)
        assert "verl_operator_leader 1.0" in standby.metrics()

        # No duplicate, no orphan: exactly the jobs' pods, the ones created before the kill kept, each where
        # the placement written before the first pod said; and nothing more after a few passes.
        for _ in range(4):
            everything = sorted(p.metadata.name for p in pods())
            assert everything == ["big-r0-head", "big-r0-worker-1", "big-r0-worker-2", "small-r0-head"]
            time.sleep(0.25)
        final = pods("big")
        assert {p.metadata.uid for p in before} <= {p.metadata.uid for p in final}, "existing pods were kept"
        by_index = {int(p.metadata.labels["verl-operator.io/node-index"]): p.spec.node_name for p in final}
        assert [by_index[i] for i in range(3)] == placement["nodes"], "pods sit where the placement said"
        assert job_status("big")["placement"]["nodes"] == placement["nodes"]
        small_nodes = job_status("small")["placement"]["nodes"]
        assert not set(small_nodes) & set(placement["nodes"]), "the two jobs never share a node's GPUs"

        # No spurious write: with nothing changing, the new leader leaves both jobs as they are.
        versions = {
            n: custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, n)["metadata"][
                "resourceVersion"
            ]
            for n in ("big", "small")
        }
        time.sleep(2)
        for name, version in versions.items():
            obj: Any = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            assert obj["metadata"]["resourceVersion"] == version, f"{name} was written with nothing changed"
    finally:
        reviewer.halt.set()
        reviewer.join(timeout=10)
        leader.stop()
        standby.stop()
        _delete(custom, namespace, "big", "small")
    assert not reviewer.failures, f"the standby's webhook failed to answer: {reviewer.failures[:5]}"
    answered_after = [t for t in reviewer.answers if t > killed]
    assert len(answered_after) >= 10, "the standby's webhook answered all through the failover"
    gaps = [b - a for a, b in zip(reviewer.answers, reviewer.answers[1:], strict=False)]
    assert max(gaps) < 3, f"the longest wait between two answers: {max(gaps):.1f}s"
    print(f"failover (kill -> standby holds the lease): {failover:.1f}s")


def test_a_leader_that_loses_the_lease_stops_reconciling_and_resumes_when_it_leads_again(
    devcluster: DevCluster, dgx: None, kube: client.ApiClient, kubectl: Any, namespace: str, tmp_path: Path
) -> None:
    """The Lease taken by another holder (a replica this process cannot see): the operator stops reconciling
    within its renew deadline, before the other could have taken over; once the other stops renewing it
    takes the Lease back and reconciles what was created meanwhile. Short durations keep it quick."""
    custom, coordination = client.CustomObjectsApi(kube), client.CoordinationV1Api(kube)
    lease = f"ha-{uuid.uuid4().hex[:6]}"
    operator = LocalOperator(
        devcluster.kubeconfig,
        tmp_path,
        webhook_name=None,
        env={"POD_NAME": "op-solo"},
        extra_args=(
            "--leader-elect",
            f"--leader-election-namespace={namespace}",
            f"--leader-election-id={lease}",
            "--leader-election-lease-duration=4",
            "--leader-election-renew-deadline=2",
            "--leader-election-retry-period=0.5",
        ),
    )

    def phase(name: str) -> str | None:
        obj: Any = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        return (obj.get("status") or {}).get("phase")

    try:
        operator.start()
        wait_for(lambda: holder(kube, namespace, lease).startswith("op-solo_"), "op-solo leads", 20, 0.1)
        wait_for(lambda: "verl_operator_leader 1.0" in operator.metrics(), "the leader gauge", 10, 0.1)
        current = coordination.read_namespaced_lease(lease, namespace)
        current.spec.holder_identity = "intruder"
        current.spec.renew_time = datetime.now(UTC)
        current.spec.lease_transitions = (current.spec.lease_transitions or 0) + 1
        coordination.replace_namespaced_lease(lease, namespace, current)
        stolen = time.monotonic()
        wait_for(lambda: "verl_operator_leader 0.0" in operator.metrics(), "reconciling stops", 5, 0.05)
        stopped = time.monotonic() - stolen
        assert stopped < 2 + 1, f"stopped {stopped:.1f}s after the lease was lost (renew deadline 2 s)"
        applied = kubectl(["apply", "-n", namespace, "-f", "-"], input=json.dumps(make_job("meanwhile", 8)))
        assert applied.returncode == 0, applied.stderr
        time.sleep(0.3)
        assert holder(kube, namespace, lease) == "intruder"
        assert phase("meanwhile") is None, "a replica without the lease reconciles nothing"
        wait_for(
            lambda: holder(kube, namespace, lease).startswith("op-solo_"), "the lease taken back", 10, 0.1
        )
        wait_for(lambda: phase("meanwhile") == "Running" or None, "the job Running after the take-back", 30)
        assert "verl_operator_leader 1.0" in operator.metrics()
    finally:
        operator.stop()
        _delete(custom, namespace, "meanwhile")


def _gated(pod: client.V1Pod) -> bool:
    return any(g.name == GANG_GATE for g in pod.spec.scheduling_gates or [])


def test_leader_killed_mid_gang_the_standby_releases_the_same_pods(
    devcluster: DevCluster, dgx: None, kube: client.ApiClient, kubectl: Any, namespace: str, tmp_path: Path
) -> None:
    """Killed after every pod of the gang exists but before any is released from the gang's scheduling
    gate: the standby releases exactly those pods (same UIDs, nothing recreated) and the job runs."""
    core, custom = client.CoreV1Api(kube), client.CustomObjectsApi(kube)
    lease = f"ha-{uuid.uuid4().hex[:6]}"

    def pods() -> list[client.V1Pod]:
        return core.list_namespaced_pod(namespace, label_selector="verl-operator.io/job=gang").items

    # The test hook pauses 3 s after each created pod, the last one included, before the gates are removed.
    leader = replica(devcluster, tmp_path / "a", "op-a", namespace, lease, QUICK, **{CREATE_DELAY_ENV: "3"})
    standby = replica(devcluster, tmp_path / "b", "op-b", namespace, lease, QUICK)
    try:
        leader.start()
        wait_for(lambda: holder(kube, namespace, lease).startswith("op-a_"), "op-a holds the lease", 20, 0.1)
        standby.start()
        applied = kubectl(["apply", "-n", namespace, "-f", "-"], input=json.dumps(make_job("gang", 24)))
        assert applied.returncode == 0, applied.stderr
        gang = wait_for(lambda: (p := pods()) and len(p) == 3 and p, "the whole gang created", 40, 0.05)
        leader.kill()
        assert all(_gated(p) for p in gang), "killed while every pod still waits at the gang's gate"
        uids = {p.metadata.uid for p in gang}

        wait_for(lambda: holder(kube, namespace, lease).startswith("op-b_"), "op-b takes over", 15, 0.05)
        wait_for(lambda: not any(_gated(p) for p in pods()) or None, "the gang released", 30, 0.1)
        obj: Any = wait_for(
            lambda: (
                (o := custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "gang"))
                and (o.get("status") or {}).get("phase") == "Running"
                and o
            ),
            "gang Running",
            30,
        )
        final = pods()
        assert {p.metadata.uid for p in final} == uids, "the same pods, none recreated"
        by_index = {int(p.metadata.labels["verl-operator.io/node-index"]): p.spec.node_name for p in final}
        assert [by_index[i] for i in range(3)] == obj["status"]["placement"]["nodes"]
    finally:
        leader.stop()
        standby.stop()
        _delete(custom, namespace, "gang")


def test_leader_killed_mid_deletion_leaves_no_pod_behind(
    devcluster: DevCluster, dgx: None, kube: client.ApiClient, kubectl: Any, namespace: str, tmp_path: Path
) -> None:
    """The VerlJob deleted while the leader is creating its pods, then the leader killed: the standby
    creates nothing for the deleted job, its pods are collected (owner references), and a job created
    meanwhile gets the GPUs the deleted one had."""
    core, custom = client.CoreV1Api(kube), client.CustomObjectsApi(kube)
    lease = f"ha-{uuid.uuid4().hex[:6]}"

    def pods(job: str) -> list[client.V1Pod]:
        return core.list_namespaced_pod(namespace, label_selector=f"verl-operator.io/job={job}").items

    leader = replica(devcluster, tmp_path / "a", "op-a", namespace, lease, QUICK, **{CREATE_DELAY_ENV: "2"})
    standby = replica(devcluster, tmp_path / "b", "op-b", namespace, lease, QUICK)
    try:
        leader.start()
        wait_for(lambda: holder(kube, namespace, lease).startswith("op-a_"), "op-a holds the lease", 20, 0.1)
        standby.start()
        # 32 GPUs of the profile's 32: the next job can only run once the deleted one's pods are gone.
        applied = kubectl(["apply", "-n", namespace, "-f", "-"], input=json.dumps(make_job("gone", 32)))
        assert applied.returncode == 0, applied.stderr
        wait_for(lambda: len(pods("gone")) >= 1 or None, "the leader's first pod", 30, 0.05)
        _delete(custom, namespace, "gone")
        leader.kill()
        # Read after the kill: a pod that appears later and is not here was created by the standby. The
        # collector may already have removed some (or all) of the dead leader's pods.
        seen = {p.metadata.name for p in pods("gone")}
        assert len(seen) < 4, "killed in the middle of creating the 4 pods"
        applied = kubectl(["apply", "-n", namespace, "-f", "-"], input=json.dumps(make_job("after", 32)))
        assert applied.returncode == 0, applied.stderr

        wait_for(lambda: holder(kube, namespace, lease).startswith("op-b_"), "op-b takes over", 15, 0.05)

        def settled() -> bool:
            left = {p.metadata.name for p in pods("gone")}
            assert left <= seen, f"a pod created for the deleted job after the kill: {left - seen}"
            return not left

        wait_for(settled, "the deleted job's pods collected", 60, 0.2)
        wait_for(
            lambda: (
                (
                    custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "after").get(
                        "status"
                    )
                    or {}
                ).get("phase")
                == "Running"
                or None
            ),
            "the next job Running on the freed GPUs",
            60,
        )
        assert len(pods("after")) == 4
        listed: Any = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        assert [o["metadata"]["name"] for o in listed["items"]] == ["after"]
    finally:
        leader.stop()
        standby.stop()
        _delete(custom, namespace, "gone", "after")


#: The deleted-Lease race made one-sided: the standby looks every 0.2 s, the leader renews every 1.5 s, so
#: the standby is (almost always) the first to find the Lease gone. The fixed election makes it wait until the
#: record it last saw (renewed at most 1.5 s before) expires, 8 s on: at least 6.5 s, while the leader
#: re-creates the Lease within 1.5 s. Without that wait the standby creates the Lease at once and leads
#: while the leader goes on until its 4 s renew deadline.
SLOW_LEADER = (
    "--leader-election-lease-duration=8",
    "--leader-election-renew-deadline=4",
    "--leader-election-retry-period=1.5",
)
EAGER_STANDBY = (
    "--leader-election-lease-duration=8",
    "--leader-election-renew-deadline=4",
    "--leader-election-retry-period=0.2",
)


def test_a_deleted_lease_never_makes_both_replicas_leaders(
    devcluster: DevCluster, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    """The Lease deleted by hand under two replicas: the leader re-creates it at its next renew and the
    standby, which waits out the record it last saw, never leads; the two leader gauges, read every 50 ms for
    two lease durations after the deletion, are never 1 together. No hand-over is legitimate in the window,
    so the two reads' small skew cannot make a true answer look false."""
    coordination = client.CoordinationV1Api(kube)
    lease = f"ha-{uuid.uuid4().hex[:6]}"
    first = replica(devcluster, tmp_path / "a", "op-a", namespace, lease, SLOW_LEADER)
    second = replica(devcluster, tmp_path / "b", "op-b", namespace, lease, EAGER_STANDBY)

    def leads(operator: LocalOperator) -> bool:
        return "verl_operator_leader 1.0" in operator.metrics()

    try:
        first.start()
        wait_for(lambda: holder(kube, namespace, lease).startswith("op-a_"), "op-a leads", 20, 0.1)
        wait_for(lambda: leads(first) or None, "op-a's leader gauge", 10, 0.1)
        second.start()
        wait_for(
            lambda: "verl_operator_leader 0.0" in second.metrics() or None, "op-b up, standing by", 20, 0.1
        )
        coordination.delete_namespaced_lease(lease, namespace)
        deleted = time.monotonic()
        both: list[float] = []
        while time.monotonic() - deleted < 2 * 8:  # two lease durations
            if leads(first) and leads(second):
                both.append(round(time.monotonic() - deleted, 2))
            time.sleep(0.05)
        assert both == [], f"both replicas led at {both} s after the Lease was deleted"
        assert holder(kube, namespace, lease).startswith("op-a_"), "the leader re-created the Lease"
        assert leads(first) and not leads(second)
    finally:
        second.stop()
        first.stop()


class LostReplica(threading.Thread):
    """An HTTPS listener that plays a replica lost mid-review: it reads each request whole and then closes
    the connection without an answer (``eof``, as after kill -9) or holds it open unanswered (``hang``, as
    under SIGSTOP). ``requests`` counts the reviews that reached it."""

    def __init__(self, cert: Path, key: Path, mode: str) -> None:
        super().__init__(daemon=True)
        self.mode, self.requests = mode, 0
        self.held: list[ssl.SSLSocket] = []
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(str(cert), str(key))
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]

    def run(self) -> None:
        while True:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            try:
                conn = self.tls.wrap_socket(raw, server_side=True)
                data = b""
                while b"\r\n\r\n" not in data:
                    data += _received(conn)
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                while len(body) < length:
                    body += _received(conn)
                self.requests += 1
                if self.mode == "eof":
                    conn.close()
                else:
                    self.held.append(conn)
            except (OSError, StopIteration):
                raw.close()

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()

    def settled(self, quiet: float = 3.0) -> int:
        """The count once no review has arrived for ``quiet`` seconds (longer than the webhook's timeout):
        on a loaded machine this thread may finish reading a review after the API server gave up on it."""
        while True:
            seen = self.requests
            time.sleep(quiet)
            if self.requests == seen:
                return seen


def _received(conn: ssl.SSLSocket) -> bytes:
    chunk = conn.recv(65536)
    if not chunk:
        raise OSError("the API server closed the connection mid-request")
    return chunk


@pytest.mark.parametrize(("mode", "status"), [("eof", 500), ("hang", 500)])
def test_the_api_server_sends_a_review_once_to_a_lost_replica(
    kube: client.ApiClient, namespace: str, tmp_path: Path, mode: str, status: int
) -> None:
    """What the chart's webhook settings rest on (docs/helm.md, "Admission through a lost replica"): the
    devcluster's kube-apiserver does not resend a review whose connection met EOF or its timeout; the create
    fails with an internal error after exactly one request to the webhook. A ConfigMap in this test's
    namespace only is reviewed, so nothing else in the cluster meets this webhook."""
    from base64 import b64encode

    from verl_operator.controller.webhook import write_self_signed

    cert, key = write_self_signed(tmp_path / "tls", hosts=("127.0.0.1",))
    lost = LostReplica(cert, key, mode)
    lost.start()
    admission, core = client.AdmissionregistrationV1Api(kube), client.CoreV1Api(kube)
    name = f"lost-replica-{uuid.uuid4().hex[:6]}"
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "lost.replica.verl-operator.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 2,
                "clientConfig": {
                    "url": f"https://127.0.0.1:{lost.port}/review",
                    "caBundle": b64encode(cert.read_bytes()).decode(),
                },
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["configmaps"],
                        "operations": ["CREATE"],
                    }
                ],
            }
        ],
    }
    admission.create_validating_webhook_configuration(config)  # type: ignore[arg-type]
    attempts = 0

    def create() -> int:
        nonlocal attempts
        attempts += 1
        body = {"metadata": {"name": f"probe-{attempts}"}}
        try:
            core.create_namespaced_config_map(namespace, body)  # type: ignore[arg-type]
        except ApiException as exc:
            return int(exc.status)
        return 201

    try:
        # The API server picks a new configuration up from its watch: until then a create is not reviewed.
        def reviewed() -> bool | None:
            create()
            return lost.requests > 0 or None

        wait_for(reviewed, "the webhook configuration in effect", 30, 0.2)
        before = lost.settled()
        started = time.monotonic()
        answer = create()
        took = time.monotonic() - started
        assert answer == status, f"the create answered {answer}"
        after = lost.settled()
        assert after - before == 1, f"{after - before} requests for one review"
        if mode == "hang":
            assert took >= 2, f"failed after {took:.1f}s, before the webhook's 2 s timeout"
    finally:
        admission.delete_validating_webhook_configuration(name)
        lost.close()
