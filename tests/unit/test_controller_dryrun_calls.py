"""Admission's dry runs made at once: the same problems, in the same order, as one after the other.

A real HTTP server on loopback answers each create after a pause, refuses the children whose name holds
``bad`` with a 422 Status (as the API server's validation does) and records how many requests it held at the
same moment.
"""

from __future__ import annotations

import json
import socketserver
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from kubernetes import client

from verl_operator.controller.dryrun import dry_run_problems


class _Server(socketserver.ThreadingMixIn, HTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0
        self.dry_runs: list[str] = []


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        srv = self.server
        with srv.lock:
            srv.in_flight += 1
            srv.most_in_flight = max(srv.most_in_flight, srv.in_flight)
        try:
            sent = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            name = str(sent["metadata"]["name"])
            with srv.lock:
                srv.dry_runs.append(self.path)
            time.sleep(0.05)  # long enough for the other requests of the review to arrive meanwhile
            if "bad" in name:
                status, body = (
                    422,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "message": f'{sent["kind"]} "{name}" is invalid: spec: Invalid value',
                        "reason": "Invalid",
                        "code": 422,
                    },
                )
            else:
                status, body = 201, sent
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        finally:
            with srv.lock:
                srv.in_flight -= 1

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _child(kind: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": "team"}}


CASES = {
    "all-created": ["sa", "cm", "svc", "head", "worker"],
    "configmap-and-pods-refused": ["sa", "bad-cm", "svc", "bad-head", "bad-worker"],
    "worker-only-refused": ["sa", "cm", "svc", "head", "bad-worker"],
}
KINDS = ["ServiceAccount", "ConfigMap", "Service", "Pod", "Pod"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_at_once_the_same_problems_in_the_same_order(server: _Server, case: str) -> None:
    children = [_child(k, n) for k, n in zip(KINDS, CASES[case], strict=True)]
    configuration = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    configuration.connection_pool_maxsize = 8
    with client.ApiClient(configuration) as api:
        alone = dry_run_problems(api, children)
        server.most_in_flight = 0
        with ThreadPoolExecutor(max_workers=8) as calls:
            together = dry_run_problems(api, children, calls)
    assert together == alone
    assert server.most_in_flight >= 2, "the dry runs were made one after the other"
    assert all("dryRun=All" in path for path in server.dry_runs)
    refused = [n for n in CASES[case] if "bad" in n]
    pods_refused = [n for n in refused if n in ("bad-head", "bad-worker")]
    # one line per refused child, the pods' refusal once (the worker would repeat the head's)
    assert len(together) == len(refused) - max(0, len(pods_refused) - 1)
    if refused:
        assert "is invalid" in together[0]
