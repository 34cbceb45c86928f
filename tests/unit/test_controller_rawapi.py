"""The reconciler's raw API path (``controller/rawapi.py``) against a real HTTP server on loopback: what reaches
the server (method, path, query, content type, credentials, body) and what comes back (JSON, or the client's
``ApiException`` with the server's status and body), and the JSON helpers' fallbacks."""

from __future__ import annotations

import json
import socketserver
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from verl_operator.controller import kopf_private
from verl_operator.controller.kube import Kube
from verl_operator.controller.rawapi import RawAPI, core_path, dumps, group_path, loads


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[dict[str, Any]] = []
    answer: tuple[int, bytes] = (200, b'{"ok": true}')

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        type(self).seen.append(
            {
                "method": self.command,
                "path": self.path,
                "content_type": self.headers.get("Content-Type"),
                "authorization": self.headers.get("Authorization"),
                "body": json.loads(body) if body else None,
            }
        )
        status, payload = type(self).answer
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PATCH = do_DELETE = _handle

    def log_message(self, *args: Any) -> None:
        return None


class _Server(socketserver.ThreadingMixIn, HTTPServer):
    daemon_threads = True  # a kept-alive connection does not hold up the shutdown


@pytest.fixture
def server() -> Iterator[tuple[HTTPServer, type[_Recorder]]]:
    handler = type("Handler", (_Recorder,), {"seen": [], "answer": (200, b'{"ok": true}')})
    srv = _Server(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv, handler
    srv.shutdown()
    srv.server_close()


def _api(srv: HTTPServer, token: str | None = None) -> client.ApiClient:
    configuration = client.Configuration(host=f"http://127.0.0.1:{srv.server_address[1]}")
    if token is not None:
        configuration.api_key = {"authorization": token}
        configuration.api_key_prefix = {"authorization": "Bearer"}
    return client.ApiClient(configuration)


def test_a_request_carries_method_path_query_type_credentials_and_body(server: Any) -> None:
    srv, handler = server
    with _api(srv, token="t0k3n") as api:
        got = RawAPI(api).request(
            "PATCH",
            group_path("verl.io", "v1alpha1", "team", "verljobs", "j", "status"),
            {"status": {"phase": "Running", "n": 2**70}},
            query={"fieldManager": "verl operator"},
            content_type="application/merge-patch+json",
        )
    assert got == {"ok": True}
    (seen,) = handler.seen
    assert seen == {
        "method": "PATCH",
        "path": "/apis/verl.io/v1alpha1/namespaces/team/verljobs/j/status?fieldManager=verl+operator",
        "content_type": "application/merge-patch+json",
        "authorization": "Bearer t0k3n",
        "body": {"status": {"phase": "Running", "n": 2**70}},
    }


def test_an_answer_outside_2xx_is_the_clients_api_exception_with_status_and_body(server: Any) -> None:
    srv, handler = server
    handler.answer = (409, b'{"kind":"Status","reason":"AlreadyExists","code":409}')
    with _api(srv) as api, pytest.raises(ApiException) as raised:
        RawAPI(api).request("POST", core_path("team", "pods"), {"metadata": {"name": "p"}})
    assert raised.value.status == 409
    assert json.loads(raised.value.body)["reason"] == "AlreadyExists"


def test_kube_calls_go_to_the_paths_the_generated_client_used(server: Any) -> None:
    srv, handler = server
    handler.answer = (200, b'{"metadata": {"resourceVersion": "42"}, "items": []}')
    with _api(srv) as api:
        kube = Kube(api)
        assert kube.patch_status("team", "j", {"phase": None}) == "42"
        kube.ungate("team", "p-0")
        kube.delete_job("team", "j")
        kube.delete_pod("team", "p-0")
        assert kube.job_pods("team", "j") == []
    assert [(s["method"], s["path"], s["content_type"], s["body"]) for s in handler.seen] == [
        (
            "PATCH",
            "/apis/verl-operator.io/v1alpha1/namespaces/team/verljobs/j/status",
            "application/merge-patch+json",
            {"status": {"phase": None}},
        ),
        (
            "PATCH",
            "/api/v1/namespaces/team/pods/p-0",
            "application/strategic-merge-patch+json",
            {"spec": {"schedulingGates": None}},
        ),
        (
            "DELETE",
            "/apis/verl-operator.io/v1alpha1/namespaces/team/verljobs/j?propagationPolicy=Background",
            None,
            None,
        ),
        ("DELETE", "/api/v1/namespaces/team/pods/p-0", None, None),
        ("GET", "/api/v1/namespaces/team/pods?labelSelector=verl-operator.io%2Fjob%3Dj", None, None),
    ]


def test_a_name_is_quoted_into_its_path_segment() -> None:
    assert core_path("team", "pods", "a/b") == "/api/v1/namespaces/team/pods/a%2Fb"


@pytest.mark.parametrize(
    "value", [{"a": [1, 2.5, True, None, "x"]}, [{"nested": {"deep": "é"}}], {"i": -(2**63)}]
)
def test_dumps_and_loads_round_trip_what_the_standard_library_does(value: Any) -> None:
    assert loads(dumps(value)) == value == json.loads(json.dumps(value))


def test_dumps_sends_an_integer_beyond_64_bits_exactly() -> None:
    assert json.loads(dumps({"big": 2**70 + 1})) == {"big": 2**70 + 1}


def test_loads_takes_what_orjson_refuses_from_the_standard_library() -> None:
    assert loads('"\\ud800"') == "\ud800"  # a lone surrogate escape: orjson refuses it, JSON allows it
    with pytest.raises(json.JSONDecodeError):
        loads(b"{not json")


def test_kopf_decodes_its_watch_events_with_the_fast_loads() -> None:
    from kopf._cogs.clients import api

    assert kopf_private.install_fast_json() and kopf_private.install_fast_json()
    assert api.json.loads is loads
    assert api.json.dumps is json.dumps  # everything else is the standard library's
    assert api.json.loads('{"type": "ADDED", "object": {"n": 1}}') == {"type": "ADDED", "object": {"n": 1}}
