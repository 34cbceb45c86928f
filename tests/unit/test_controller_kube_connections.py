"""The operator's API calls reuse their connection: every response is read to its end (an unread raw
response keeps its connection out of the pool, and the next call opens a new one: over TLS, a handshake).

A real HTTP server on loopback answers every request with a small JSON object and counts connections.
"""

from __future__ import annotations

import json
import socketserver
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from kubernetes import client

from verl_operator.controller.cache import CachedKube, WatchCache
from verl_operator.controller.dryrun import dry_run_problems
from verl_operator.controller.kube import Kube


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        sent = json.loads(self.rfile.read(length) or b"{}")
        meta = dict(sent.get("metadata") or {"name": self.path.rsplit("/", 1)[-1]})
        meta.setdefault("namespace", "team")
        meta.update(uid=f"uid-{meta['name']}", resourceVersion="7")
        body = json.dumps({**sent, "kind": sent.get("kind", "Pod"), "metadata": meta}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_PATCH = _answer

    def log_message(self, *args: Any) -> None:
        return None


class _Server(socketserver.ThreadingMixIn, HTTPServer):
    daemon_threads = True
    connections = 0

    def get_request(self) -> Any:
        self.connections += 1
        return super().get_request()


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _api(srv: _Server) -> client.ApiClient:
    configuration = client.Configuration(host=f"http://127.0.0.1:{srv.server_address[1]}")
    return client.ApiClient(configuration)


def _child(kind: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": "team"}}


JOB = {"metadata": {"name": "j", "namespace": "team", "uid": "u"}}
CALLS: list[tuple[str, Callable[[client.ApiClient, int], object]]] = [
    (
        "create-child",
        lambda api, i: Kube(api).create(_child(("ServiceAccount", "ConfigMap", "Service")[i % 3], f"c{i}")),
    ),
    ("create-pod", lambda api, i: Kube(api).create(_child("Pod", f"p{i}"))),
    ("event", lambda api, i: Kube(api).event(JOB, "Normal", "Placed", "m")),
    ("cached-pod-create", lambda api, i: CachedKube(api, WatchCache()).create(_child("Pod", f"p{i}"))),
    ("cached-ungate", lambda api, i: CachedKube(api, WatchCache()).ungate("team", f"p{i}")),
    ("dry-run", lambda api, i: dry_run_problems(api, _child("Pod", f"d{i}"))),
]


@pytest.mark.parametrize(("what", "call"), CALLS, ids=[c[0] for c in CALLS])
def test_calls_one_after_the_other_share_one_connection(
    server: _Server, what: str, call: Callable[[client.ApiClient, int], object]
) -> None:
    with _api(server) as api:
        for i in range(6):
            call(api, i)
    assert server.connections == 1, f"{what}: {server.connections} connections for 6 calls"
