"""The webhook server: AdmissionReview responses as kopf builds them, served on a thread of its own over TLS.

The server tests run the real server (aiohttp, TLS with the operator's self-signed certificate) on loopback
and post reviews to it with the standard library's HTTPS client.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kopf
import pytest

from verl_operator.controller.webhook import write_self_signed
from verl_operator.controller.webhook_server import (
    MAX_REVIEW_BYTES,
    READY_PATH,
    REVIEW_DELAY_ENV,
    BadReview,
    WebhookServer,
    admission_response,
)

USER = {"username": "alice", "groups": ["system:authenticated"]}


def review(operation: str = "CREATE", **request: Any) -> dict[str, Any]:
    body = {"metadata": {"name": "j", "namespace": "team"}, "spec": {"suspend": False}}
    req = {"uid": "u-1", "operation": operation, "userInfo": USER, "object": body, **request}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def deny(body: Mapping[str, Any], old: Mapping[str, Any] | None, user: Mapping[str, Any]) -> None:
    raise kopf.AdmissionError(f"VerlJob rejected:\n- spec: no ({body['metadata']['name']})", code=422)


def broken(body: Mapping[str, Any], old: Mapping[str, Any] | None, user: Mapping[str, Any]) -> None:
    raise KeyError("surprise")


def admit(body: Mapping[str, Any], old: Mapping[str, Any] | None, user: Mapping[str, Any]) -> None:
    return None


@pytest.mark.parametrize(
    ("req", "check", "allowed", "status"),
    [
        pytest.param(review(), admit, True, None, id="admitted"),
        pytest.param(
            review(), deny, False, {"code": 422, "message": "VerlJob rejected:\n- spec: no (j)"}, id="denied"
        ),
        pytest.param(review(), broken, False, {"code": 500, "message": "'surprise'"}, id="handler-error-500"),
        pytest.param(review("UPDATE", oldObject={"spec": {}}), deny, False, None, id="update-checked"),
        pytest.param(
            review("DELETE", object=None, oldObject={"spec": {}}), deny, True, None, id="delete-allowed"
        ),
        pytest.param(review("CONNECT"), deny, True, None, id="connect-allowed"),
    ],
)
def test_admission_response(
    req: dict[str, Any], check: Any, allowed: bool, status: dict[str, Any] | None
) -> None:
    response = admission_response(req, check)
    assert response["apiVersion"] == "admission.k8s.io/v1" and response["kind"] == "AdmissionReview"
    assert response["response"]["uid"] == "u-1"
    assert response["response"]["allowed"] is allowed
    if status is not None:
        assert response["response"]["status"] == status
    assert ("status" in response["response"]) is (not allowed)


def test_the_check_sees_the_object_the_old_object_and_the_user() -> None:
    seen: list[Any] = []
    old = {"metadata": {"name": "j"}, "spec": {"suspend": True}}
    admission_response(review("UPDATE", oldObject=old), lambda b, o, u: seen.append((b["spec"], o, u)))
    assert seen == [({"suspend": False}, old, USER)]


@pytest.mark.parametrize(
    "req",
    [
        pytest.param({"apiVersion": "admission.k8s.io/v1"}, id="no-request"),
        pytest.param(review(userInfo=None), id="no-user"),
        pytest.param(review(object=None), id="no-object"),
    ],
)
def test_an_unusable_review_is_a_bad_request(req: dict[str, Any]) -> None:
    with pytest.raises(BadReview):
        admission_response(req, admit)


class Served:
    """A WebhookServer started in an event loop of the test's own (standing in for kopf's)."""

    def __init__(self, tmp: Path, reviews: dict[str, Any], fn: Any = None) -> None:
        cert, key = write_self_signed(tmp / "tls")
        self.server = WebhookServer(reviews=reviews, addr="127.0.0.1", certfile=str(cert), pkeyfile=str(key))
        self.ctx = ssl.create_default_context(cafile=str(cert))
        self.fn = fn

    def post(self, url: str, payload: bytes) -> tuple[int, Any]:
        req = urllib.request.Request(url, data=payload, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=20) as rsp:
                return rsp.status, json.loads(rsp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, None


def run_loop(body: Any) -> Any:
    return asyncio.run(body())


def test_a_review_is_answered_while_the_operators_event_loop_is_busy(tmp_path: Path) -> None:
    """kopf's loop is blocked (as by a burst of watch events) until the review has its answer: the server
    answers on its own thread, so the review does not wait for the loop."""
    served = Served(tmp_path, {"verljob": lambda r: admission_response(r, deny)})
    answers: list[tuple[int, Any]] = []
    answered = threading.Event()
    before = _served_count()

    async def body() -> None:
        gen = served.server(served.fn)
        config = await gen.__anext__()
        assert config["url"].startswith("https://127.0.0.1:") and config["caBundle"]

        def client() -> None:
            answers.append(served.post(config["url"] + "/verljob", json.dumps(review()).encode()))
            answered.set()

        threading.Thread(target=client, daemon=True).start()
        answered.wait(15)  # blocks this event loop: nothing in it runs until the answer came
        await gen.aclose()

    run_loop(body)
    assert answers and answers[0][0] == 200
    assert answers[0][1]["response"]["allowed"] is False
    assert answers[0][1]["response"]["status"]["code"] == 422
    assert _served_count() == before + 1  # the server's request histogram counted it


def _served_count() -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("verl_operator_webhook_request_seconds_count") or 0.0


def _in_flight() -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("verl_operator_webhook_reviews_in_flight") or 0.0


def test_a_review_held_by_the_server_counts_as_in_flight_until_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-flight gauge (what the cluster tests watch to stop or kill a replica holding reviews) counts
    a review from its arrival to its answer; the test hook holds it before the answer."""
    monkeypatch.setenv(REVIEW_DELAY_ENV, "1.5")
    served = Served(tmp_path, {"verljob": lambda r: admission_response(r, deny)})
    seen: list[float] = []
    answers: list[tuple[int, Any]] = []
    before = _in_flight()

    async def body() -> None:
        gen = served.server(served.fn)
        config = await gen.__anext__()
        post = asyncio.create_task(
            asyncio.to_thread(served.post, config["url"] + "/verljob", json.dumps(review()).encode())
        )
        while not post.done() and not seen:
            if _in_flight() == before + 1:
                seen.append(_in_flight())
            await asyncio.sleep(0.01)
        answers.append(await post)
        await gen.aclose()

    run_loop(body)
    assert seen, "the held review was counted in flight"
    assert answers[0][0] == 200 and answers[0][1]["response"]["allowed"] is False
    assert _in_flight() == before


def test_other_webhook_ids_go_to_kopf_in_its_loop(tmp_path: Path) -> None:
    calls: list[tuple[Any, Any, bool]] = []

    async def body() -> None:
        kopf_loop = asyncio.get_running_loop()

        async def fn(data: Any, *, webhook: Any, sslpeer: Any, headers: Any) -> dict[str, Any]:
            calls.append((data["request"]["uid"], webhook, asyncio.get_running_loop() is kopf_loop))
            return {"response": {"uid": data["request"]["uid"], "allowed": True}}

        served = Served(tmp_path, {"verljob": lambda r: admission_response(r, deny)}, fn)
        gen = served.server(fn)
        config = await gen.__anext__()
        status, answer = await asyncio.to_thread(
            served.post, config["url"] + "/other", json.dumps(review()).encode()
        )
        await gen.aclose()
        assert status == 200 and answer["response"]["allowed"] is True

    run_loop(body)
    assert calls == [("u-1", "other", True)]


@pytest.mark.parametrize(
    ("payload", "status", "allowed"),
    [
        pytest.param(b"{not json", 400, None, id="not-json-400"),
        pytest.param(
            b'{"apiVersion":"admission.k8s.io/v1","request":{"uid":"d","object":' + b"[" * 100000,
            200,
            False,
            id="too-deep-denied",
        ),
        pytest.param(json.dumps(review(userInfo=None)).encode(), 400, None, id="no-user-400"),
        pytest.param(
            json.dumps(review(padding="x" * (2 * 1024 * 1024))).encode(),
            200,
            False,
            id="2MiB-read-and-checked",
        ),
        pytest.param(b"{" + b" " * (MAX_REVIEW_BYTES + 1) + b"}", 413, None, id="over-the-limit-413"),
    ],
)
def test_hostile_requests(tmp_path: Path, payload: bytes, status: int, allowed: bool | None) -> None:
    served = Served(tmp_path, {"verljob": lambda r: admission_response(r, deny)})
    results: list[tuple[int, Any]] = []

    async def body() -> None:
        gen = served.server(None)
        config = await gen.__anext__()
        results.append(await asyncio.to_thread(served.post, config["url"] + "/verljob", payload))
        await gen.aclose()

    run_loop(body)
    code, answer = results[0]
    assert code == status
    if allowed is not None:
        assert answer["response"]["allowed"] is allowed


def _raw(request: Any) -> bytes:
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


def _job(spec: Any = None, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "j", "namespace": "team", **meta}, "spec": {} if spec is None else spec}


def _req(operation: str = "CREATE", **fields: Any) -> dict[str, Any]:
    return {"uid": "m-1", "operation": operation, "userInfo": USER, "object": _job(), **fields}


#: Bodies that are not AdmissionReviews a VerlJob check can read: each is an HTTP 400 or a denial naming the
#: part (``status`` of the HTTP answer, then the denial's code and a fragment of its message), never a 500.
MALFORMED = [
    pytest.param(b"\xff\xfe{}", 400, None, None, id="not-utf-8"),
    pytest.param(b'{"request": "\xc3\x28"}', 400, None, None, id="invalid-utf-8-in-a-string"),
    pytest.param(b"[1, 2]", 400, None, None, id="a-list"),
    pytest.param(b'"review"', 400, None, None, id="a-string"),
    pytest.param(b"null", 400, None, None, id="null"),
    pytest.param(b'{"request": {"uid": ' + b"9" * 5000 + b"}}", 400, None, None, id="5000-digit-integer"),
    pytest.param(_raw([1, 2]), 400, None, None, id="request-a-list"),
    pytest.param(_raw(_req(userInfo="alice")), 400, None, None, id="userinfo-a-string"),
    pytest.param(_raw(_req(object=[1, 2])), 400, None, None, id="object-a-list"),
    pytest.param(
        _raw(_req(object=_job([1, 2]))), 200, 400, "- spec: must be an object, not list", id="spec-list"
    ),
    pytest.param(
        _raw(_req(object=_job("x"))), 200, 400, "- spec: must be an object, not str", id="spec-string"
    ),
    pytest.param(
        _raw(_req(object={"metadata": [1], "spec": {}})),
        200,
        400,
        "- metadata: must be an object",
        id="meta-list",
    ),
    pytest.param(
        _raw(_req(object=_job(name=["j"]))), 200, 400, "- metadata.name: must be a string", id="name-a-list"
    ),
    pytest.param(
        _raw(_req("UPDATE", oldObject=_job("abc"))),
        200,
        400,
        "- oldObject.spec: must be an object, not str",
        id="update-old-spec-string",
    ),
    pytest.param(
        _raw(_req("UPDATE", oldObject="abc")),
        200,
        400,
        "- oldObject: must be an object",
        id="update-old-string",
    ),
    pytest.param(
        _raw(_req(object=_job({"verl": {"image": 5}}))),
        200,
        422,
        "spec.verl.image: Input should be",
        id="schema",
    ),
    pytest.param(_raw(_req(uid=[1], object=_job([]))), 200, 400, "spec: must be an object", id="uid-a-list"),
]


@pytest.mark.parametrize(("payload", "status", "code", "fragment"), MALFORMED)
def test_malformed_bodies_are_a_400_or_a_denial_never_a_500(
    tmp_path: Path, payload: bytes, status: int, code: int | None, fragment: str | None
) -> None:
    """The real review function of the operator (handlers.review_job: the API models, the policy and the
    planner, without a cluster) behind the real server."""
    from verl_operator.controller import handlers

    served = Served(tmp_path, {"verljob": handlers.review_job})
    results: list[tuple[int, Any]] = []

    async def body() -> None:
        gen = served.server(None)
        config = await gen.__anext__()
        results.append(await asyncio.to_thread(served.post, config["url"] + "/verljob", payload))
        await gen.aclose()

    run_loop(body)
    answer_status, answer = results[0]
    assert answer_status == status, answer
    if code is not None:
        response = answer["response"]
        assert response["allowed"] is False and response["status"]["code"] == code, response
        assert fragment is not None and fragment in response["status"]["message"], response
        assert isinstance(response["uid"], str)


def test_the_readiness_path_is_answered_by_the_review_thread_while_kopfs_loop_is_blocked(
    tmp_path: Path,
) -> None:
    """``GET /readyz`` (the chart's readiness probe) is answered by the server's own thread even while the
    loop standing in for kopf's is blocked, and stops being answered once the server stops."""
    served = Served(tmp_path, {"verljob": lambda r: admission_response(r, deny)})
    answers: list[tuple[int, bytes]] = []
    answered = threading.Event()
    url: list[str] = []

    def get(target: str) -> tuple[int, bytes]:
        with urllib.request.urlopen(target, context=served.ctx, timeout=5) as rsp:
            return rsp.status, rsp.read()

    async def body() -> None:
        gen = served.server(served.fn)
        config = await gen.__anext__()
        base = config["url"].split("/", 3)
        url.append(f"{base[0]}//{base[2]}{READY_PATH}")

        def client() -> None:
            answers.append(get(url[0]))
            answered.set()

        threading.Thread(target=client, daemon=True).start()
        answered.wait(15)  # blocks this event loop until the probe had its answer
        await gen.aclose()

    run_loop(body)
    assert answers == [(200, b"ok")]
    with pytest.raises(OSError):
        get(url[0])
