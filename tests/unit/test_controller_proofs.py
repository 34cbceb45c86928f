"""Admission's reuse of passed API checks (``controller/proofs.py``): kept for the policy's window, never a
refusal, per namespace, bounded; and the review's requests to a real HTTP server on loopback that answers
SubjectAccessReviews and dry runs as the API server does (a pod whose image holds ``bad`` is refused with a
422, a user named ``mallory`` may not create pods)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socketserver
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from conftest import make_nodes
from kubernetes import client

from verl_operator.controller import handlers
from verl_operator.controller.proofs import PROOFS, Proofs, children_key, permission_key
from verl_operator.controller.webhook import check_admission
from verl_operator.manifests import LaunchPlan
from verl_operator.policy import AdminPolicy


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_pass_is_reused_within_the_window_and_asked_again_after_it() -> None:
    clock = Clock()
    proofs = Proofs(clock=clock)
    assert not proofs.proved("team", "k", 30)
    proofs.passed("team", "k", 30)
    clock.now += 29.9
    assert proofs.proved("team", "k", 30)
    assert not proofs.proved("other", "k", 30)  # per namespace
    clock.now += 0.1
    assert not proofs.proved("team", "k", 30)
    assert len(proofs) == 0  # an expired proof is dropped when met


def test_a_zero_window_keeps_and_reuses_nothing() -> None:
    proofs = Proofs(clock=Clock())
    proofs.passed("team", "k", 0)
    assert len(proofs) == 0 and not proofs.proved("team", "k", 30)
    proofs.passed("team", "k", 30)
    assert not proofs.proved("team", "k", 0)


def test_the_oldest_proofs_go_first_and_forget_drops_one_namespace() -> None:
    proofs = Proofs(size=3, clock=Clock())
    for key in ("a", "b", "c"):
        proofs.passed("team", key, 30)
    proofs.proved("team", "a", 30)
    proofs.passed("team", "d", 30)  # "a" is the oldest recorded: it goes
    assert [proofs.proved("team", k, 30) for k in "abcd"] == [False, True, True, True]
    proofs.passed("other", "b", 30)
    proofs.forget("team")
    assert [proofs.proved("team", k, 30) for k in "bcd"] == [False, False, False]
    assert proofs.proved("other", "b", 30)


SPEC = {
    "verl": {"image": "registry.example/verl:0.9.1"},
    "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
    "resources": {"gpus": 16, "gpusPerNode": 8},
}


def _launch(nodes: int = 2, launcher: str | None = None, **spec: Any) -> tuple[dict[str, Any], LaunchPlan]:
    """A spec (``SPEC`` with ``spec`` merged in) and its launch plan, planned on ``nodes`` 8-GPU nodes."""
    doc = {**SPEC, **spec}
    checked = check_admission(doc, None, make_nodes(nodes, gpus=8))
    assert checked.spec is not None and checked.plan is not None
    return doc, LaunchPlan.from_plan_json(checked.plan, checked.spec, launcher_image=launcher)


def test_children_keys_differ_where_the_children_can_differ_but_in_the_name() -> None:
    spec, launch = _launch()
    key = children_key("team-run-1", spec, launch)
    assert children_key("team-run-2", spec, launch) == key  # the batch of one template
    assert children_key("team-run-10", spec, launch) != key  # a longer name
    assert children_key("team.run-1", spec, launch) != key  # same length, a dot: another stem
    assert children_key("team-run-1", *_launch(verl={"image": "registry.example/verl:0.9.2"})) != key
    assert children_key("team-run-1", *_launch(resources={"gpus": 8, "gpusPerNode": 8})) != key
    assert children_key("team-run-1", *_launch(launcher="operator:1")) != key
    # the nodes a review saw (how many are eligible, which ones first) do not make another key; the pool's
    # product does
    assert children_key("team-run-1", *_launch(nodes=12)) == key
    assert children_key("team-run-1", spec, dataclasses.replace(launch, gpu_product="H200")) != key
    alice = {"username": "alice", "groups": ["b", "a"]}
    assert permission_key(alice) == permission_key({"username": "alice", "groups": ["a", "b"]})
    assert permission_key(alice) != permission_key({**alice, "groups": ["a"]})


class _Server(socketserver.ThreadingMixIn, HTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.requests: list[str] = []
        self.quotas: list[dict[str, Any]] = []


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        sent = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        with self.server.lock:
            self.server.requests.append(self.path.split("?")[0])
        status, body = 201, sent
        if "subjectaccessreviews" in self.path:
            allowed = sent["spec"].get("user") != "mallory"
            body = {**sent, "status": {"allowed": allowed}}
        elif sent.get("kind") == "Pod" and "bad" in json.dumps(sent["spec"]):
            status = 422
            body = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "message": f'Pod "{sent["metadata"].get("name")}" is invalid: spec.containers[0].image: bad',
                "reason": "Invalid",
                "code": 422,
            }
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        """The namespace's ResourceQuotas (the job-wide quota check lists them)."""
        with self.server.lock:
            self.server.requests.append(self.path.split("?")[0])
        data = json.dumps({"kind": "ResourceQuotaList", "items": self.server.quotas}).encode()
        self.send_response(200 if self.path.split("?")[0].endswith("/resourcequotas") else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    configuration = client.Configuration(host=f"http://127.0.0.1:{srv.server_address[1]}")
    configuration.connection_pool_maxsize = 16
    api = client.ApiClient(configuration)
    saved = list(handlers._API)
    handlers._API[:] = [api]
    PROOFS.forget("team")
    try:
        yield srv
    finally:
        handlers._API[:] = saved
        PROOFS.forget("team")
        api.close()
        srv.shutdown()
        srv.server_close()


def _review(srv: _Server, name: str, spec: dict[str, Any], user: str, window: float) -> tuple[list[str], int]:
    """The API problems of one review of a new job and the requests it sent."""
    checked = check_admission(spec, None, make_nodes(2, gpus=8))
    assert not checked.problems and checked.plan is not None
    before = len(srv.requests)
    policy = AdminPolicy(reuse_verdict_seconds=window)
    userinfo = {"username": user, "groups": ["system:authenticated"]}
    problems = handlers._api_problems(checked, None, True, name, "team", userinfo, policy)
    return problems, len(srv.requests) - before


def test_the_second_job_of_a_batch_sends_no_request(server: _Server) -> None:
    problems, first = _review(server, "run-1", SPEC, "alice", 30)
    # the permission, the ServiceAccount, ConfigMap, Service, head and worker pods, the namespace's quotas
    assert problems == [] and first == 7, server.requests
    assert _review(server, "run-2", SPEC, "alice", 30) == ([], 0)
    # another author asks for their own permission only
    assert _review(server, "run-3", SPEC, "bob", 30) == ([], 1)
    assert server.requests[-1].endswith("/subjectaccessreviews")
    # the operator met a refusal in the namespace: its proofs are gone
    PROOFS.forget("team")
    assert _review(server, "run-4", SPEC, "alice", 30) == ([], 7)


def test_without_a_window_every_review_asks(server: _Server) -> None:
    assert _review(server, "run-1", SPEC, "alice", 0) == ([], 7)
    assert _review(server, "run-2", SPEC, "alice", 0) == ([], 7)


def test_refusals_are_never_reused(server: _Server) -> None:
    bad = {**SPEC, "verl": {"image": "registry.example/bad:1"}}
    for name, expected in (("run-1", 7), ("run-2", 5)):  # the permission and the quota passed: reused
        problems, sent = _review(server, name, bad, "alice", 30)
        assert len(problems) == 1 and "is invalid" in problems[0] and sent == expected
    for name in ("run-3", "run-4"):
        problems, sent = _review(server, name, SPEC, "mallory", 30)
        assert len(problems) == 1 and "may not create pods" in problems[0]
        # run-3: the permission and the children (the quota check passed for run-1); run-4: the children
        # passed in run-3, the denied permission is asked again
        assert sent == (6 if name == "run-3" else 1)


def test_a_quota_limit_range_or_namespace_change_asks_again(server: _Server) -> None:
    assert _review(server, "run-1", SPEC, "alice", 30) == ([], 7)
    for event in (
        handlers.namespace_limits_event(namespace="team"),  # a ResourceQuota or LimitRange event
        handlers.namespace_event(name="team"),  # the Namespace's own (its Pod Security labels)
        handlers.priority_class_event(type="DELETED", name="gone"),  # any namespace's pods may name it
    ):
        asyncio.run(event)
        assert _review(server, "run-2", SPEC, "alice", 30) == ([], 7)
    asyncio.run(handlers.namespace_limits_event(namespace="elsewhere"))
    assert _review(server, "run-3", SPEC, "alice", 30) == ([], 0)


def test_a_quota_below_the_whole_job_denies_it(server: _Server) -> None:
    """Each pod fits ``pods: 1``; the job's two do not: denied at admission, naming the field and the quota."""
    server.quotas = [{"metadata": {"name": "one", "namespace": "team"}, "spec": {"hard": {"pods": "1"}}}]
    problems, _ = _review(server, "run-1", SPEC, "alice", 30)
    assert problems == [
        "spec.resources.gpusPerNode: the job's 2 Ray pods in all exceed ResourceQuota team/one (pods: 1 < 2); "
        "raise the quota or use more GPUs per pod (fewer pods)"
    ]
    server.quotas = [{"metadata": {"name": "one", "namespace": "team"}, "spec": {"hard": {"pods": "2"}}}]
    asyncio.run(handlers.namespace_limits_event(namespace="team"))  # the quota's change is seen
    assert _review(server, "run-2", SPEC, "alice", 30)[0] == []
