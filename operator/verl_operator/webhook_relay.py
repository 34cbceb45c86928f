"""The webhook relay: the API server's connection survives the replica that evaluates its review.

The kube-apiserver sends an AdmissionReview once and never retries it (docs/helm.md, "Admission through a
lost replica"): a review in flight on a replica that is killed (EOF) or paused (no answer) fails. The relay
is a small process next to each replica (a second container of the operator's pod) that terminates the API
server's TLS with the webhook's own serving certificate and forwards each review, body unchanged, to a
backend: its own replica first, then the other replicas. A review is validation only (idempotent), so it is
sent again, to the next backend, when the one it went to

- refuses or resets the connection, or closes it without an answer (kill -9, a restart),
- answers with an HTTP 5xx,
- has not answered within ``backend_timeout`` (a paused process, a node that stopped answering): the next
  backend gets the review while the slow one may still answer; the first answer wins.

Any other answer (an AdmissionReview allowing or denying, an HTTP 4xx for a malformed review) is the answer
and is returned as it is. Everything happens within ``deadline`` (shorter than the webhook's
``timeoutSeconds``, and than the ``timeout`` the API server puts in the request's query), after which the
relay answers 504 (the API server then applies the failure policy, as it would have without the relay). A
backend that failed is tried after the others for ``demote_seconds``, so a paused replica delays the first
review it holds and not every one after it.

The relay has no Kubernetes client, no planner and no state but that hint: it is small enough not to be
what dies. It reads at most :data:`MAX_BODY_BYTES` of a request, sends no header of the request but its
content type, and never logs a review's body. ``GET /readyz`` answers 200 while at least one backend's
``/readyz`` does; ``GET /healthz`` is its own liveness.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import aiohttp.web

log = logging.getLogger("verl_operator.webhook_relay")

#: The largest request body read: the webhook server's own limit (two 3 MiB objects on UPDATE plus the
#: review's fields; ``webhook_server.MAX_REVIEW_BYTES``).
MAX_BODY_BYTES = 8 * 1024 * 1024
#: The relay's readiness and liveness paths (GET); the backends' readiness path is the same.
READY_PATH, HEALTH_PATH = "/readyz", "/healthz"
#: Seconds a backend's ``/readyz`` may take when the relay's own readiness asks it.
READY_TIMEOUT = 1.0
#: The API server's ``timeout`` query parameter (a Go duration; it sends whole seconds: ``10s``).
_TIMEOUT_QUERY = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m)$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0}


@dataclass(frozen=True)
class RelaySettings:
    """What the relay forwards to and how long it waits.

    Attributes:
        backends: Base URLs (``https://127.0.0.1:9443``) tried first and in this order: the own replica.
        peers: ``host:port`` whose addresses (a headless Service's ready pods) are the other backends,
            resolved at most every ``peers_ttl`` seconds; None: the static ``backends`` only.
        exclude: Addresses left out of ``peers`` (the own pod's IP: the own replica is a static backend).
        backend_timeout: Seconds without an answer after which the next backend gets the review too.
        deadline: Seconds after which the relay gives up on a review (504).
        peers_ttl: Seconds a resolution of ``peers`` is reused.
        demote_seconds: Seconds a backend that failed is tried after the others.
        scheme: The backends' scheme (``https``; ``http`` for a backend without TLS).
    """

    backends: tuple[str, ...]
    peers: str | None = None
    exclude: frozenset[str] = frozenset()
    backend_timeout: float = 3.0
    deadline: float = 9.0
    peers_ttl: float = 2.0
    demote_seconds: float = 10.0
    scheme: str = "https"

    def problems(self) -> list[str]:
        """Why these settings cannot work (empty: fine)."""
        out = []
        if not self.backends and not self.peers:
            out.append("no backend: give --backend or --peers")
        if self.backend_timeout <= 0 or self.deadline <= 0:
            out.append("--backend-timeout and --deadline must be positive")
        elif self.backend_timeout >= self.deadline:
            out.append(
                f"--backend-timeout ({self.backend_timeout}) must be less than --deadline ({self.deadline}): "
                "the next backend needs time to answer"
            )
        for url in self.backends:
            if not re.match(r"^https?://[^/?#]+$", url):
                out.append(f"--backend {url!r}: a base URL such as https://127.0.0.1:9443 (no path)")
        if self.peers is not None and not re.match(r"^[A-Za-z0-9.:\[\]-]+:\d+$", self.peers):
            out.append(f"--peers {self.peers!r}: HOST:PORT")
        return out


@dataclass(frozen=True)
class Answer:
    """A backend's answer, returned to the API server as it is."""

    status: int
    content_type: str
    body: bytes


@dataclass(frozen=True)
class Failure:
    """Why a backend gave no answer (logged without the review)."""

    backend: str
    reason: str


@dataclass
class _Peers:
    urls: tuple[str, ...] = ()
    at: float = float("-inf")
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def timeout_query(value: str | None) -> float | None:
    """Seconds of the API server's ``timeout`` query parameter (``10s``); None when absent or unreadable."""
    match = _TIMEOUT_QUERY.match(value or "")
    return float(match.group(1)) * _UNITS[match.group(2)] if match else None


def _url(scheme: str, address: str, port: int) -> str:
    host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    return f"{scheme}://{host}:{port}"


class Relay:
    """Forwards reviews to the backends by the rules of the module docstring.

    Args:
        settings: The backends and the timeouts.
        client_tls: The TLS context for the backends (None: the backends' scheme is ``http``).
        clock: A monotonic clock in seconds (the demotions' and the peers cache's).
    """

    def __init__(
        self,
        settings: RelaySettings,
        client_tls: ssl.SSLContext | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.client_tls = client_tls
        self._clock = clock
        self._failed: dict[str, float] = {}
        self._peers = _Peers()
        self._session: aiohttp.ClientSession | None = None

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                ssl=self.client_tls if self.client_tls is not None else False,
                limit=0,  # no pool limit: a review never waits for a connection
                keepalive_timeout=15,  # shorter than the backend's own idle timeout (aiohttp's 75 s)
            )
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def peer_urls(self) -> tuple[str, ...]:
        """The other replicas' base URLs (from ``peers``, cached ``peers_ttl`` seconds)."""
        if not self.settings.peers:
            return ()
        peers = self._peers
        async with peers.lock:
            if self._clock() - peers.at < self.settings.peers_ttl:
                return peers.urls
            host, _, port = self.settings.peers.rpartition(":")
            host = host.strip("[]")
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
            except OSError as exc:
                log.warning("the peers %s did not resolve: %s", self.settings.peers, exc)
                infos = []
            addresses = sorted({str(info[4][0]) for info in infos} - self.settings.exclude)
            peers.urls = tuple(_url(self.settings.scheme, a, int(port)) for a in addresses)
            peers.at = self._clock()
            return peers.urls

    async def backends(self) -> list[str]:
        """The backends in the order a review tries them: the static ones, then the peers; a backend that
        failed within ``demote_seconds`` after every other."""
        urls = list(dict.fromkeys((*self.settings.backends, *await self.peer_urls())))
        now = self._clock()
        self._failed = {u: at for u, at in self._failed.items() if now - at < self.settings.demote_seconds}
        recent = set(self._failed)
        return [u for u in urls if u not in recent] + [u for u in urls if u in recent]

    def _demote(self, failure: Failure) -> None:
        self._failed[failure.backend] = self._clock()
        log.warning("webhook backend %s gave no answer: %s", failure.backend, failure.reason)

    async def _attempt(
        self, backend: str, path: str, body: bytes, content_type: str, seconds: float
    ) -> Answer | Failure:
        session = await self.session()
        try:
            async with session.post(
                backend + path,
                data=body,
                headers={"Content-Type": content_type},
                timeout=aiohttp.ClientTimeout(total=max(seconds, 0.001)),
                allow_redirects=False,
            ) as response:
                if response.status >= 500:
                    return Failure(backend, f"HTTP {response.status}")
                chunks, size = [], 0
                async for chunk in response.content.iter_any():  # the whole answer, however it arrives
                    size += len(chunk)
                    if size > MAX_BODY_BYTES:
                        return Failure(backend, "an answer larger than the relay reads")
                    chunks.append(chunk)
                return Answer(response.status, response.headers.get("Content-Type", ""), b"".join(chunks))
        except TimeoutError:
            return Failure(backend, f"no answer within the review's remaining {seconds:.1f} s")
        except (aiohttp.ClientError, OSError) as exc:
            return Failure(backend, f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")

    async def forward(self, path: str, body: bytes, content_type: str, deadline: float) -> Answer | None:
        """The first answer of a backend to the review ``body`` POSTed at ``path`` (its query included), or
        None when none answered within ``deadline`` seconds."""
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline
        queue = await self.backends()
        pending: dict[asyncio.Task[Answer | Failure], str] = {}

        def launch() -> None:
            backend = queue.pop(0)
            task = loop.create_task(self._attempt(backend, path, body, content_type, end - loop.time()))
            pending[task] = backend

        try:
            if queue:
                launch()
            while pending:
                remaining = end - loop.time()
                if remaining <= 0:
                    break
                wait = min(self.settings.backend_timeout, remaining) if queue else remaining
                done, _ = await asyncio.wait(pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                if not done:  # the latest backend is slow: the next one gets the review too
                    if queue:
                        latest = list(pending.values())[-1]
                        self._demote(Failure(latest, f"no answer within {self.settings.backend_timeout:g} s"))
                        launch()
                    continue
                for task in done:
                    pending.pop(task)
                    result = task.result()
                    if isinstance(result, Answer):
                        return result
                    self._demote(result)
                    if queue:
                        launch()
            return None
        finally:
            for task in pending:
                task.cancel()
            for task in pending:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def ready(self) -> bool:
        """True when at least one backend answers its ``/readyz`` with 200."""
        backends = list(dict.fromkeys((*self.settings.backends, *await self.peer_urls())))
        session = await self.session()

        async def one(url: str) -> bool:
            try:
                async with session.get(
                    url + READY_PATH, timeout=aiohttp.ClientTimeout(total=READY_TIMEOUT)
                ) as response:
                    return response.status == 200
            except (TimeoutError, aiohttp.ClientError, OSError):
                return False

        tasks = [asyncio.ensure_future(one(u)) for u in backends]
        try:
            for next_done in asyncio.as_completed(tasks):
                if await next_done:
                    return True
            return False
        finally:
            for task in tasks:
                task.cancel()

    def deadline_for(self, request: aiohttp.web.Request) -> float:
        """The review's deadline: the relay's, or less when the API server's ``timeout`` query is shorter
        (half a second kept for the answer's way back)."""
        asked = timeout_query(request.query.get("timeout"))
        if asked is None:
            return self.settings.deadline
        return max(0.1, min(self.settings.deadline, asked - 0.5))

    def app(self) -> aiohttp.web.Application:
        """The relay's HTTP application: POST any path (a review), GET /readyz and /healthz."""
        app = aiohttp.web.Application(client_max_size=MAX_BODY_BYTES)

        async def review(request: aiohttp.web.Request) -> aiohttp.web.Response:
            body = await request.read()  # 413 past client_max_size
            answer = await self.forward(
                request.path_qs,
                body,
                request.headers.get("Content-Type", "application/json"),
                self.deadline_for(request),
            )
            if answer is None:
                log.error("no webhook backend answered a review (each one failed, or the deadline passed)")
                return aiohttp.web.Response(status=504, text="no webhook backend answered")
            response = aiohttp.web.Response(status=answer.status, body=answer.body)
            if answer.content_type:
                response.headers["Content-Type"] = answer.content_type
            return response

        async def ready(request: aiohttp.web.Request) -> aiohttp.web.Response:
            if await self.ready():
                return aiohttp.web.Response(text="ok")
            return aiohttp.web.Response(status=503, text="no webhook backend is ready")

        async def healthy(request: aiohttp.web.Request) -> aiohttp.web.Response:
            return aiohttp.web.Response(text="ok")

        async def closing(app: aiohttp.web.Application) -> None:
            await self.close()

        app.add_routes(
            [
                aiohttp.web.get(READY_PATH, ready),
                aiohttp.web.get(HEALTH_PATH, healthy),
                aiohttp.web.post("/{tail:.*}", review),
            ]
        )
        app.on_cleanup.append(closing)
        return app


def server_tls(cert: Path, key: Path) -> ssl.SSLContext:
    """The TLS context the relay serves with (the webhook's own certificate and key)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    return context


def client_tls(trusted: Sequence[Path]) -> ssl.SSLContext:
    """The TLS context for the backends: their certificate must chain to one of ``trusted`` (the webhook's CA
    or its serving certificate itself, as a trust anchor of its own). Backends are reached by IP address, which
    the certificate (issued for the Service's names) does not name: the host name is not checked."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    loaded = 0
    for path in trusted:
        if path.is_file():
            context.load_verify_locations(cafile=str(path))
            loaded += 1
    if not loaded:
        raise FileNotFoundError(f"none of the backend CA files exists: {', '.join(map(str, trusted))}")
    return context


def _stamps(paths: Sequence[Path]) -> list[float | None]:
    out: list[float | None] = []
    for path in paths:
        try:
            out.append(path.stat().st_mtime)
        except OSError:
            out.append(None)
    return out


async def serve(
    settings: RelaySettings,
    *,
    address: str,
    port: int,
    cert: Path,
    key: Path,
    trusted: Sequence[Path],
    stop: asyncio.Event | None = None,
    drain_seconds: float = 0.0,
    check_interval: float = 10.0,
    started: Callable[[int], None] | None = None,
) -> None:
    """Serve the relay until ``stop`` is set (or the task is cancelled); reload the certificate, key and CA
    files when they change (a renewed certificate, as cert-manager writes it in place).

    Once ``stop`` is set the relay goes on serving for ``drain_seconds`` (the API server may still open
    connections to a pod until the Service's endpoints drop it), then stops listening and finishes the
    reviews in flight. ``started`` is called with the bound port (the kernel's pick when ``port`` is 0)."""
    stop = stop or asyncio.Event()
    tls = server_tls(cert, key)
    relay = Relay(settings, client_tls(trusted) if settings.scheme == "https" else None)
    runner = aiohttp.web.AppRunner(relay.app(), handle_signals=False, access_log=None, shutdown_timeout=15)
    await runner.setup()
    try:
        site = aiohttp.web.TCPSite(runner, address, port, ssl_context=tls, reuse_address=True)
        await site.start()
        log.info(
            "webhook relay on %s:%d to %s%s",
            address,
            port,
            ", ".join(settings.backends) or "-",
            f" and the peers {settings.peers}" if settings.peers else "",
        )
        if started is not None:
            started(int(runner.addresses[0][1]))
        files = [cert, key, *trusted]
        first = _stamps(files)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), check_interval)
            now = _stamps(files)
            if now == first:
                continue
            try:
                tls.load_cert_chain(str(cert), str(key))  # new connections get the new certificate
                if settings.scheme == "https":
                    relay.client_tls = client_tls(trusted)
                    await relay.close()  # new connections to the backends trust the new CA
            except (OSError, ssl.SSLError) as exc:
                log.warning("the renewed certificate files could not be read yet: %s", exc)
                continue
            log.info("reloaded the renewed certificate files")
            first = now
        log.info("stopping: serving %g s more, then finishing the reviews in flight", drain_seconds)
        await asyncio.sleep(drain_seconds)
    finally:
        await runner.cleanup()
