"""The webhook relay's rules against real loopback HTTPS servers: a backend that closes the connection after
reading the review (as after kill -9), one that never answers (as under SIGSTOP), one that answers HTTP 500,
a port nothing listens on, and healthy ones. The relay itself runs as it does in the pod (aiohttp, TLS with the
webhook's certificate) on a thread of its own; the API server is played by the standard library's HTTPS
client."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from verl_operator.controller.webhook import write_self_signed
from verl_operator.controller.webhook_server import MAX_REVIEW_BYTES
from verl_operator.webhook_relay import MAX_BODY_BYTES, RelaySettings, serve, timeout_query

#: Short enough that the tests do not wait long for a hanging backend; what is asserted is who answered.
BACKEND_TIMEOUT = 0.5


class Backend(threading.Thread):
    """A webhook server stand-in on loopback, HTTP/1.1 with keep-alive over TLS.

    Modes: ``eof`` reads a request whole and closes the connection; ``hang`` reads it and never answers;
    ``status:N`` answers every request with HTTP N and a small JSON body; ``review`` answers a review with an
    AdmissionReview response naming the digest of the body it received (and ``/readyz`` with 200). ``bodies``
    holds every request body received (POST), ``paths`` their paths.
    """

    def __init__(self, cert: Path, key: Path, mode: str) -> None:
        super().__init__(daemon=True)
        self.mode = mode
        self.bodies: list[bytes] = []
        self.paths: list[str] = []
        self.held: list[ssl.SSLSocket] = []
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(str(cert), str(key))
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"https://127.0.0.1:{self.sock.getsockname()[1]}"
        self.lock = threading.Lock()
        self.start()

    def run(self) -> None:
        while True:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(raw,), daemon=True).start()

    def _connection(self, raw: socket.socket) -> None:
        try:
            conn = self.tls.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            raw.close()
            return
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                while len(buffer) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                body, buffer = buffer[:length], buffer[length:]
                if method == "POST":
                    with self.lock:
                        self.bodies.append(body)
                        self.paths.append(path)
                if self.mode == "eof":
                    return
                if self.mode == "hang":
                    self.held.append(conn)
                    conn = None  # type: ignore[assignment]
                    return
                answer = self._answer(method, path, body)
                if self.mode == "pieces":  # the answer in small writes, a pause between: several TLS records
                    for start in range(0, len(answer), 16384):
                        conn.sendall(answer[start : start + 16384])
                        time.sleep(0.002)
                else:
                    conn.sendall(answer)
        except (OSError, ssl.SSLError):
            return
        finally:
            if conn is not None:
                conn.close()

    def _answer(self, method: str, path: str, body: bytes) -> bytes:
        if self.mode.startswith("status:"):
            status = int(self.mode.split(":")[1])
            payload = json.dumps({"status": status, "backend": self.url}).encode()
        elif method == "GET":
            status, payload = 200, b"ok"
        elif self.mode == "pieces":
            status = 200
            payload = json.dumps({"backend": self.url, "echo": body.decode()}).encode()
        else:
            status = 200
            review = json.loads(body)
            payload = json.dumps(
                {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "response": {
                        "uid": review["request"]["uid"],
                        "allowed": False,
                        "status": {"code": 422, "message": hashlib.sha256(body).hexdigest()},
                    },
                    "backend": self.url,
                }
            ).encode()
        head = (
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        return head.encode() + payload

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


class RelayThread(threading.Thread):
    """The relay served on a thread with its own event loop, as ``verl-operator webhook-relay`` serves it."""

    def __init__(self, settings: RelaySettings, cert: Path, key: Path, trusted: list[Path]) -> None:
        super().__init__(daemon=True)
        self.settings, self.cert, self.key, self.trusted = settings, cert, key, trusted
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self.ready = threading.Event()
        self.stop_event: asyncio.Event | None = None
        self.start()
        assert self.ready.wait(15), "the relay did not start"

    def run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def main() -> None:
            self.stop_event = asyncio.Event()

            def started(port: int) -> None:
                self.port = port
                self.ready.set()

            await serve(
                self.settings,
                address="127.0.0.1",
                port=0,
                cert=self.cert,
                key=self.key,
                trusted=self.trusted,
                stop=self.stop_event,
                started=started,
            )

        self.loop.run_until_complete(main())

    def stop(self) -> None:
        if self.stop_event is not None:
            self.loop.call_soon_threadsafe(self.stop_event.set)
        self.join(20)


@pytest.fixture
def tls(tmp_path: Path) -> tuple[Path, Path]:
    return write_self_signed(tmp_path / "tls", hosts=("127.0.0.1",))


@pytest.fixture
def backends(tls: tuple[Path, Path]) -> Iterator[Any]:
    made: list[Backend] = []

    def make(mode: str) -> Backend:
        made.append(Backend(*tls, mode))
        return made[-1]

    yield make
    for backend in made:
        backend.close()


@pytest.fixture
def relay(tls: tuple[Path, Path]) -> Iterator[Any]:
    made: list[RelayThread] = []

    def make(*urls: str, **settings: Any) -> RelayThread:
        options = {"backend_timeout": BACKEND_TIMEOUT, "deadline": 8.0, "demote_seconds": 600.0, **settings}
        made.append(RelayThread(RelaySettings(backends=urls, **options), *tls, [tls[0]]))
        return made[-1]

    yield make
    for thread in made:
        thread.stop()


def free_port() -> int:
    """A loopback port nothing listens on (bound and released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def review_body(uid: str = "u-1", padding: int = 0) -> bytes:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": uid, "operation": "CREATE", "object": {"spec": {"note": "x" * padding}}},
    }
    # Key order and spacing a JSON parser would not keep: the relay must pass the bytes as they are.
    return json.dumps(body, indent=3, sort_keys=False).encode() + b"  \n"


def post(cert: Path, port: int, body: bytes, path: str = "/verljob?timeout=10s") -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(cert))
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}{path}", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get(cert: Path, port: int, path: str) -> int:
    context = ssl.create_default_context(cafile=str(cert))
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=context, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.parametrize("failing", ["eof", "hang", "status:500", "status:503", "refused"])
def test_a_review_a_backend_loses_reaches_the_next_one_unchanged(
    tls: tuple[Path, Path], backends: Any, relay: Any, failing: str
) -> None:
    cert, _ = tls
    lost = None if failing == "refused" else backends(failing)
    healthy = backends("review")
    first = lost.url if lost else f"https://127.0.0.1:{free_port()}"
    served = relay(first, healthy.url)
    body = review_body("u-lost")
    status, answer = post(cert, served.port, body)
    assert status == 200, answer
    response = json.loads(answer)
    assert response["backend"] == healthy.url, "the healthy backend answered"
    assert response["response"]["uid"] == "u-lost"
    assert response["response"]["status"]["message"] == hashlib.sha256(body).hexdigest(), "body unchanged"
    assert healthy.bodies == [body] and healthy.paths == ["/verljob?timeout=10s"]
    if lost is not None:
        assert lost.bodies == [body], "the lost backend received the review once, first"


@pytest.mark.parametrize(
    ("mode", "status"),
    [("review", 200), ("status:400", 400), ("status:403", 403), ("status:413", 413), ("status:422", 422)],
)
def test_an_answer_is_not_retried_deny_or_4xx(
    tls: tuple[Path, Path], backends: Any, relay: Any, mode: str, status: int
) -> None:
    """A denial (200 with allowed false) and an HTTP 4xx are answers: returned as they are, byte for byte,
    and the review goes nowhere else."""
    cert, _ = tls
    answering, other = backends(mode), backends("review")
    served = relay(answering.url, other.url)
    body = review_body("u-answer")
    got, answer = post(cert, served.port, body)
    assert got == status
    assert json.loads(answer)["backend"] == answering.url
    assert answering.bodies == [body]
    assert other.bodies == [], "an answer is not sent on"


def test_a_backend_that_failed_is_tried_last_for_a_while(
    tls: tuple[Path, Path], backends: Any, relay: Any
) -> None:
    """A paused backend delays the first review it holds, not the ones after it: they go to the live one
    first."""
    cert, _ = tls
    paused, live = backends("hang"), backends("review")
    served = relay(paused.url, live.url)
    for uid in ("u-1", "u-2", "u-3"):
        status, _ = post(cert, served.port, review_body(uid))
        assert status == 200
    assert len(paused.bodies) == 1, "only the first review went to the paused backend"
    assert len(live.bodies) == 3


def test_a_slow_backend_that_answers_after_the_next_one_started_still_counts(
    tls: tuple[Path, Path], backends: Any, relay: Any
) -> None:
    """Both backends get the review (the first one did not answer within the backend timeout); the first
    answer is returned, whichever it is: here the only one there is, from a backend tried after a hang."""
    cert, _ = tls
    hang_a, hang_b, live = backends("hang"), backends("hang"), backends("review")
    served = relay(hang_a.url, hang_b.url, live.url)
    status, answer = post(cert, served.port, review_body("u-slow"))
    assert status == 200 and json.loads(answer)["backend"] == live.url
    assert len(hang_a.bodies) == len(hang_b.bodies) == 1


def test_no_backend_answers_504_within_the_deadline(
    tls: tuple[Path, Path], backends: Any, relay: Any
) -> None:
    cert, _ = tls
    eof, error = backends("eof"), backends("status:500")
    served = relay(eof.url, error.url, f"https://127.0.0.1:{free_port()}")
    status, answer = post(cert, served.port, review_body())
    assert status == 504, answer
    assert len(eof.bodies) == 1 and len(error.bodies) == 1


def test_the_relays_deadline_follows_the_api_servers_timeout(
    tls: tuple[Path, Path], backends: Any, relay: Any
) -> None:
    """The API server's ``timeout`` query shorter than the relay's deadline: the relay gives up before the
    API server does (504), having tried only what fits."""
    cert, _ = tls
    first, second = backends("hang"), backends("review")
    served = relay(first.url, second.url, backend_timeout=3.0, deadline=8.0)
    status, _ = post(cert, served.port, review_body(), path="/verljob?timeout=1s")
    assert status == 504
    assert second.bodies == [], "0.5 s of the 1 s were left: no time to reach the next backend at 3 s"


def test_a_backend_with_a_certificate_the_relay_does_not_trust_is_skipped(
    tmp_path: Path, tls: tuple[Path, Path], backends: Any, relay: Any
) -> None:
    cert, _ = tls
    stranger = Backend(*write_self_signed(tmp_path / "other", hosts=("127.0.0.1",)), "review")
    try:
        trusted = backends("review")
        served = relay(stranger.url, trusted.url)
        status, answer = post(cert, served.port, review_body())
        assert status == 200 and json.loads(answer)["backend"] == trusted.url
        assert stranger.bodies == [], "nothing is sent over a connection the relay does not trust"
    finally:
        stranger.close()


def test_a_body_over_the_limit_is_refused_and_not_forwarded(
    tls: tuple[Path, Path], backends: Any, relay: Any
) -> None:
    cert, _ = tls
    healthy = backends("review")
    served = relay(healthy.url)
    status, _ = post(cert, served.port, review_body(padding=MAX_BODY_BYTES))
    assert status == 413
    assert healthy.bodies == []
    big = review_body(padding=MAX_BODY_BYTES - 4096)
    assert len(big) <= MAX_BODY_BYTES
    status, answer = post(cert, served.port, big)
    assert (
        status == 200
        and json.loads(answer)["response"]["status"]["message"] == hashlib.sha256(big).hexdigest()
    )


def test_an_answer_arriving_in_pieces_is_returned_whole(
    tls: tuple[Path, Path], backends: Any, relay: Any
) -> None:
    cert, _ = tls
    slow = backends("pieces")
    body = review_body(padding=1_000_000)
    status, answer = post(cert, relay(slow.url).port, body)
    assert status == 200
    assert json.loads(answer) == {"backend": slow.url, "echo": body.decode()}


def test_the_relay_reads_what_the_webhook_server_reads() -> None:
    assert MAX_BODY_BYTES == MAX_REVIEW_BYTES


def test_readiness_follows_the_backends(tls: tuple[Path, Path], backends: Any, relay: Any) -> None:
    cert, _ = tls
    dead, error = f"https://127.0.0.1:{free_port()}", backends("status:503")
    assert get(cert, relay(dead, error.url).port, "/readyz") == 503
    live = backends("review")
    served = relay(dead, error.url, live.url)
    assert get(cert, served.port, "/readyz") == 200
    assert get(cert, relay(dead).port, "/healthz") == 200, "liveness is the relay's own"


def test_the_peers_are_resolved_and_the_own_address_left_out(
    tls: tuple[Path, Path], backends: Any, relay: Any
) -> None:
    cert, _ = tls
    peer = backends("review")
    port = peer.url.rsplit(":", 1)[1]
    served = relay(peers=f"127.0.0.1:{port}")
    status, answer = post(cert, served.port, review_body())
    assert status == 200 and json.loads(answer)["backend"] == peer.url
    alone = relay(peers=f"127.0.0.1:{port}", exclude=frozenset({"127.0.0.1"}))
    status, _ = post(cert, alone.port, review_body())
    assert status == 504
    assert len(peer.bodies) == 1


def test_the_relay_logs_no_review_body(
    tls: tuple[Path, Path], backends: Any, relay: Any, caplog: pytest.LogCaptureFixture
) -> None:
    cert, _ = tls
    eof, healthy = backends("eof"), backends("review")
    served = relay(eof.url, healthy.url)
    secret = "s3cr3t-in-the-spec"
    body = json.dumps({"request": {"uid": "u", "object": {"spec": {"token": secret}}}}).encode()
    with caplog.at_level(logging.DEBUG, logger="verl_operator.webhook_relay"):
        status, _ = post(cert, served.port, body)
    assert status == 200
    assert any(eof.url in r.getMessage() for r in caplog.records), "the lost backend is logged"
    assert not any(secret in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        (RelaySettings(backends=()), "no backend"),
        (RelaySettings(backends=("https://a:1",), backend_timeout=9, deadline=9), "less than --deadline"),
        (RelaySettings(backends=("https://a:1/verljob",)), "no path"),
        (RelaySettings(backends=(), peers="svc; rm -rf /"), "HOST:PORT"),
    ],
)
def test_settings_problems(settings: RelaySettings, problem: str) -> None:
    assert any(problem in p for p in settings.problems())
    assert RelaySettings(backends=("https://127.0.0.1:9443",), peers="x.ns.svc:9443").problems() == []


@pytest.mark.parametrize(
    ("query", "seconds"),
    [("10s", 10.0), ("1.5s", 1.5), ("500ms", 0.5), ("1m", 60.0), ("", None), ("x", None)],
)
def test_timeout_query(query: str, seconds: float | None) -> None:
    assert timeout_query(query) == seconds


def test_the_relay_process_loads_no_client_no_planner_no_api_models() -> None:
    """``verl-operator webhook-relay`` imports its own module only: not kopf, the kubernetes client, the
    planner or the API models the other subcommands load (the import contract covers the relay's code; this
    covers the process the CLI starts). A command line without a backend stops before serving."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from verl_operator.cli import main\n"
        "try:\n"
        "    main(['webhook-relay', '--port=1', '--cert=c.pem', '--key=k.pem'])\n"
        "except SystemExit as exc:\n"
        "    print('exit:', exc.code)\n"
        "heavy = ('kopf', 'kubernetes', 'pydantic', 'verl_operator.planner', 'verl_operator.api', "
        "'verl_operator.controller')\n"
        "print('loaded:', sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "exit: error: no backend" in out.stdout
    assert "loaded: []" in out.stdout, out.stdout
