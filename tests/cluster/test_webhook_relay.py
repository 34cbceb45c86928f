"""Admission through a lost replica: the API server's webhook URL points at the webhook relay
(``verl-operator webhook-relay``) in front of two local replicas, and one replica is killed with SIGKILL or
paused with SIGSTOP in the middle of a batch of 50 concurrent creates. Every create gets its answer: the
valid jobs exist, each once, the invalid ones are denied by the webhook's own checks, no create fails.

The kube-apiserver sends a review once and never retries it (``test_operator_ha.py``,
``test_the_api_server_sends_a_review_once_to_a_lost_replica``): without the relay the reviews in flight on
the lost replica fail. The moment is made certain, not left to chance: the doomed replica holds each review
2 s before it answers (``REVIEW_DELAY_ENV``), and it is killed or paused as soon as its in-flight gauge shows
the first review of the batch; the relay's log then shows the review it lost there. The relay tries the doomed
replica first (its static backend order), as a relay tries its own replica first in the chart's pods.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from base64 import b64encode
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from cluster.polling import wait_for
from verl_devtools.devcluster import DevCluster
from verl_devtools.devcluster.jobs import verljob
from verl_devtools.devcluster.localrun import LocalOperator, LocalRelay
from verl_operator.clusters.labels import PROFILE
from verl_operator.controller.webhook import write_self_signed
from verl_operator.controller.webhook_server import REVIEW_DELAY_ENV

GROUP, VERSION, PLURAL = "verl-operator.io", "v1alpha1", "verljobs"
#: Creates in the batch, of which every tenth is invalid (denied with the planner's suggestion).
CREATES = 50
DENIED_MESSAGE = "use trainBatchSize 96 or 112"

pytestmark = pytest.mark.timeout(240)


def job(name: str, valid: bool) -> dict[str, Any]:
    resources = {"nodeSelector": {PROFILE: "dgx-h100"}}
    if valid:  # suspended: the leader records it and places nothing (the test is about admission)
        return verljob(name, 8, resources=resources, suspend=True)
    return verljob(
        name,
        16,
        resources=resources,
        suspend=True,
        data={"trainBatchSize": 100},
        rollout={"responsesPerPrompt": 1},
    )


def in_flight(operator: LocalOperator) -> float:
    for line in operator.metrics().splitlines():
        if line.startswith("verl_operator_webhook_reviews_in_flight "):
            return float(line.split()[1])
    return 0.0


@pytest.fixture
def pool_client(devcluster: DevCluster) -> Iterator[client.ApiClient]:
    """An admin client whose connection pool holds the whole batch's connections."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(devcluster.kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = CREATES + 4
    with client.ApiClient(configuration) as api:
        yield api


class Doom(threading.Thread):
    """Sends ``signum`` to the replica once its in-flight gauge shows a review; ``held`` is what it showed."""

    def __init__(self, operator: LocalOperator, signum: int) -> None:
        super().__init__(daemon=True)
        self.operator, self.signum = operator, signum
        self.held = 0.0
        self.sent = threading.Event()
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            held = in_flight(self.operator)
            if held >= 1:
                assert self.operator.proc is not None
                os.kill(self.operator.proc.pid, self.signum)
                self.held = held
                self.sent.set()
                return
            time.sleep(0.01)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSTOP], ids=["kill-9", "sigstop"])
def test_a_batch_of_creates_is_admitted_through_a_replica_lost_mid_batch(
    devcluster: DevCluster,
    dgx: None,
    kube: client.ApiClient,
    pool_client: client.ApiClient,
    namespace: str,
    tmp_path: Path,
    signum: int,
) -> None:
    custom = client.CustomObjectsApi(pool_client)
    admission = client.AdmissionregistrationV1Api(kube)
    cert = write_self_signed(tmp_path / "tls", hosts=("127.0.0.1",))
    lease = f"relay-{uuid.uuid4().hex[:6]}"

    def replica(name: str, **env: str) -> LocalOperator:
        return LocalOperator(
            devcluster.kubeconfig,
            tmp_path / name,
            webhook_name=None,
            serve_webhook=True,
            webhook_cert=cert,
            env={"POD_NAME": name, **env},
            extra_args=(
                "--leader-elect",
                f"--leader-election-namespace={namespace}",
                f"--leader-election-id={lease}",
            ),
        )

    # The survivor leads (started first): the doomed replica's loss costs no failover, only its reviews.
    survivor = replica("op-survivor")
    doomed = replica("op-doomed", **{REVIEW_DELAY_ENV: "2"})
    relay = LocalRelay(tmp_path / "relay", cert, ())
    hook = f"relay-{uuid.uuid4().hex[:6]}"
    doom = Doom(doomed, signum)
    try:
        survivor.start()
        wait_for(
            lambda: "verl_operator_leader 1.0" in survivor.metrics() or None, "the survivor leads", 30, 0.1
        )
        doomed.start()
        # The relay's order: the doomed replica first (ports are final once both have started).
        relay.backends = (
            f"https://127.0.0.1:{doomed.webhook_port}",
            f"https://127.0.0.1:{survivor.webhook_port}",
        )
        relay.start()
        admission.create_validating_webhook_configuration(
            {  # type: ignore[arg-type]
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": hook},
                "webhooks": [
                    {
                        "name": "relay.verljob.verl-operator.io",
                        "admissionReviewVersions": ["v1"],
                        "sideEffects": "None",
                        "failurePolicy": "Fail",
                        "timeoutSeconds": 10,
                        "clientConfig": {
                            "url": f"{relay.url}/verljob",
                            "caBundle": b64encode(cert[0].read_bytes()).decode(),
                        },
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                        "rules": [
                            {
                                "apiGroups": [GROUP],
                                "apiVersions": [VERSION],
                                "resources": [PLURAL],
                                "operations": ["CREATE", "UPDATE"],
                            }
                        ],
                    }
                ],
            }
        )

        # The API server picks the configuration up from its watch: until then a create is not reviewed.
        probes = iter(range(1000))

        def reviewed() -> bool | None:
            name = f"probe-{next(probes)}"
            try:
                custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job(name, False))
            except ApiException as exc:
                assert DENIED_MESSAGE in str(exc.body), exc.body
                return True
            custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            return None

        wait_for(reviewed, "the webhook configuration in effect", 30, 0.3)
        wait_for(lambda: in_flight(doomed) == 0 or None, "the doomed replica idle", 10, 0.1)
        assert doomed.proc is not None and doomed.proc.poll() is None

        doom.start()
        names = [f"batch-{i:02d}" for i in range(CREATES)]
        valid = {n for i, n in enumerate(names) if i % 10 != 9}

        def create(name: str) -> str:
            try:
                custom.create_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, job(name, name in valid)
                )
            except ApiException as exc:
                if exc.status == 422 and name not in valid and DENIED_MESSAGE in str(exc.body):
                    return "denied"
                return f"HTTP {exc.status}: {str(exc.body)[:300]}"
            return "created"

        with ThreadPoolExecutor(max_workers=CREATES) as pool:
            outcomes = dict(zip(names, pool.map(create, names), strict=True))
        assert doom.sent.wait(1), "the doomed replica received no review of the batch"

        errors = {n: o for n, o in outcomes.items() if o != ("created" if n in valid else "denied")}
        assert errors == {}, f"{len(errors)} of {CREATES} creates failed: {errors}"
        listed: Any = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        existing = [o["metadata"]["name"] for o in listed["items"]]
        assert sorted(existing) == sorted(valid), "every valid job exists once, no invalid one"
        assert doom.held >= 1
        lost = f"webhook backend https://127.0.0.1:{doomed.webhook_port}"
        assert lost in relay.log_path.read_text(), (
            "the relay lost a review on the doomed replica and sent it on"
        )
        if signum == signal.SIGKILL:
            assert doomed.proc.wait(5) == -signal.SIGKILL
        print(
            f"{signal.Signals(signum).name} with {doom.held:.0f} review(s) held: {CREATES} creates, 0 errors"
        )
    finally:
        doom.halt.set()
        if doomed.proc is not None and doomed.proc.poll() is None:
            os.kill(doomed.proc.pid, signal.SIGCONT)
        try:
            admission.delete_validating_webhook_configuration(hook)
        except ApiException as exc:
            if exc.status != 404:
                raise
        relay.stop()
        doomed.stop()
        survivor.stop()
