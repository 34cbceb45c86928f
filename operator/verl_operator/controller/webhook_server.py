"""The validating webhook's HTTPS server: kopf's configuration, served on a thread and event loop of its own.

kopf runs its webhook server in the event loop that also processes every watch event, so during a batch of
creates an AdmissionReview waits behind the events of the jobs created before it. This server keeps kopf's
part (TLS from the given or generated certificate, the client configuration kopf writes into the managed
ValidatingWebhookConfiguration, a restart when the certificate files change) but listens in a thread with
its own event loop and answers the reviews it has a function for (:data:`Review`, by webhook id) in a small
thread pool; a review for any other id goes to kopf's own machinery in kopf's loop. Hardening for hostile
admission requests:

- aiohttp reads at most 1 MiB of a request body by default and answers a larger AdmissionReview with 413,
  which the API server turns into a failed ``kubectl apply``; the API server itself accepts bodies of 3 MiB,
  and a review carries the object twice on UPDATE, so the limit here is 8 MiB.
- JSON nested deeper than Python's recursion limit (the API server accepts up to 10000 levels) makes
  ``json.loads`` raise ``RecursionError``: here it is a denial, not an HTTP 500.
- Any other body that is not an AdmissionReview (not UTF-8, not JSON, an integer of more digits than Python
  converts, not an object, a request whose object, old object, metadata or spec is not an object) is an
  HTTP 400 or a denial naming the part: never an HTTP 500.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import re
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp.web
import kopf

from verl_operator.controller import kopf_private, metrics

log = logging.getLogger("verl_operator.webhook")

#: The largest AdmissionReview body read (two 3 MiB objects plus the review's own fields).
MAX_REVIEW_BYTES = 8 * 1024 * 1024
#: Reviews answered at once (each plans on the cached node facts and may make two API calls).
REVIEW_THREADS = 4
_UID = re.compile(r'"uid"\s*:\s*"([^"]{1,128})"')

#: The readiness probe's path (GET): answered by this server's own thread and loop, so a replica whose
#: webhook server cannot answer leaves the webhook's Service, whatever kopf's loop does.
READY_PATH = "/readyz"

#: Test hook: seconds the server holds each review of its own webhooks before it answers (the cluster tests
#: use it to have reviews in flight on a replica they kill or pause); unset or 0 in production.
REVIEW_DELAY_ENV = "VERL_OPERATOR_REVIEW_DELAY_SECONDS"

#: An AdmissionReview in, the AdmissionReview response out (called in a worker thread).
Review = Callable[[Mapping[str, Any]], dict[str, Any]]


class BadReview(ValueError):
    """The request is not a usable AdmissionReview (HTTP 400, as kopf answers it)."""


def too_deep_review(text: str) -> dict[str, Any]:
    """The AdmissionReview that denies a request nested too deeply to parse (its uid read by a regex)."""
    match = _UID.search(text)
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": match.group(1) if match else "",
            "allowed": False,
            "status": {
                "code": 422,
                "message": "VerlJob rejected:\n- spec: nests lists or mappings too deeply to check",
            },
        },
    }


class _Listener:
    """An aiohttp site on a thread with its own event loop."""

    def __init__(
        self, addr: str | None, port: int, context: ssl.SSLContext | None, app: aiohttp.web.Application
    ):
        self.addr, self.port, self.context, self.app = addr, port, context, app
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="webhook", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        runner = aiohttp.web.AppRunner(self.app, handle_signals=False)
        try:
            self.loop.run_until_complete(runner.setup())
            site = aiohttp.web.TCPSite(
                runner, self.addr, self.port, ssl_context=self.context, reuse_port=True, reuse_address=True
            )
            self.loop.run_until_complete(site.start())
            self.port = int(runner.addresses[0][1])  # the bound port (the kernel's pick when 0 was asked)
        except BaseException as exc:  # reported to the starting coroutine
            self.error = exc
            self.started.set()
            self.loop.run_until_complete(runner.cleanup())
            self.loop.close()
            return
        self.started.set()
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(runner.cleanup())
            self.loop.close()

    async def start(self) -> None:
        self.thread.start()
        await asyncio.to_thread(self.started.wait)
        if self.error is not None:
            raise self.error

    async def stop(self) -> None:
        if self.thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop closed already
                self.loop.call_soon_threadsafe(self.loop.stop)
            await asyncio.to_thread(self.thread.join, 10.0)


class WebhookServer(kopf.WebhookServer):
    """``kopf.WebhookServer`` served on its own thread (see the module docstring).

    Args:
        reviews: The review function of each webhook id (kopf's handler id, the last segment of the URL
            path); the other ids go to kopf.
        **kwargs: ``kopf.WebhookServer``'s (address, port, host, certificate files, ...).
    """

    def __init__(self, *, reviews: Mapping[str, Review] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reviews = dict(reviews or {})

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        kopf_loop = asyncio.get_running_loop()
        pool = ThreadPoolExecutor(max_workers=REVIEW_THREADS, thread_name_prefix="review")
        try:
            while True:
                cadata, context = kopf_private.server_ssl(self)
                path = self.path.rstrip("/") if self.path else ""
                app = aiohttp.web.Application(client_max_size=MAX_REVIEW_BYTES)
                app.add_routes(
                    [
                        aiohttp.web.post(f"{path}/{{id:.*}}", self._handler(fn, kopf_loop, pool)),
                        aiohttp.web.get(READY_PATH, _ready),
                    ]
                )
                addr = self.addr or None  # None is aiohttp's "any interface"
                listener = _Listener(addr, self.port or 0, context, app)  # 0: the kernel picks a free port
                await listener.start()
                try:
                    schema = "http" if context is None else "https"
                    client_config: dict[str, Any] = {
                        "url": kopf_private.server_url(self, schema, listener.port)
                    }
                    if cadata is not None:
                        client_config["caBundle"] = base64.b64encode(cadata).decode("ascii")
                    log.debug("webhooks at %s (own thread)", client_config["url"])
                    yield client_config
                    await self._until_files_change()
                    log.info("restarting the webhook server with the renewed certificate files")
                finally:
                    await listener.stop()
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _handler(
        self, fn: Any, kopf_loop: asyncio.AbstractEventLoop, pool: ThreadPoolExecutor
    ) -> Callable[[aiohttp.web.Request], Any]:
        reviews = self.reviews
        delay = float(os.environ.get(REVIEW_DELAY_ENV, "0") or 0)

        async def serve(request: aiohttp.web.Request) -> aiohttp.web.Response:
            started = time.perf_counter()
            metrics.WEBHOOK_REVIEWS_IN_FLIGHT.inc()
            try:
                if delay > 0:
                    await asyncio.sleep(delay)
                return await answer(request)
            finally:
                metrics.WEBHOOK_REVIEWS_IN_FLIGHT.dec()
                metrics.WEBHOOK_REQUEST_SECONDS.observe(time.perf_counter() - started)

        async def answer(request: aiohttp.web.Request) -> aiohttp.web.Response:
            try:
                text = (await request.read()).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise aiohttp.web.HTTPBadRequest(reason="the AdmissionReview is not UTF-8") from exc
            try:
                data = json.loads(text)
            except RecursionError:
                return aiohttp.web.json_response(too_deep_review(text), dumps=json.dumps)
            except ValueError as exc:  # JSONDecodeError, or an integer past Python's digit limit
                raise aiohttp.web.HTTPBadRequest(reason=_reason(exc)) from exc
            if not isinstance(data, dict):
                raise aiohttp.web.HTTPBadRequest(reason="the AdmissionReview is not a JSON object")
            webhook = request.match_info.get("id")
            review = reviews.get(str(webhook))
            if review is None:  # not ours: kopf's own admission machinery, in kopf's loop
                return await _kopf_serve(fn, kopf_loop, data, webhook, request)
            try:
                response = await asyncio.get_running_loop().run_in_executor(pool, review, data)
            except BadReview as exc:
                raise aiohttp.web.HTTPBadRequest(reason=_reason(exc)) from exc
            except Exception as exc:  # never an HTTP 500: the review could not be read
                log.exception("the AdmissionReview could not be answered")
                raise aiohttp.web.HTTPBadRequest(reason=_reason(exc)) from exc
            return aiohttp.web.json_response(response, dumps=json.dumps)

        return serve

    async def _until_files_change(self) -> None:
        """Return when the certificate or key file changes (cert-manager renews them in place)."""
        files = [Path(str(p)) for p in (self.certfile, self.pkeyfile) if p is not None]

        def stamps() -> list[float | None]:
            out: list[float | None] = []
            for path in files:
                try:
                    out.append(path.stat().st_mtime)
                except OSError:
                    out.append(None)
            return out

        first = stamps()
        while True:
            await asyncio.sleep(self.file_check_interval)
            if files and stamps() != first:
                return


async def _ready(request: aiohttp.web.Request) -> aiohttp.web.Response:
    """The readiness probe: 200 from the thread and loop that answer the reviews."""
    return aiohttp.web.Response(text="ok")


def _reason(exc: BaseException) -> str:
    """An HTTP reason phrase for ``exc``: one line, ASCII, short (aiohttp refuses a reason with a newline)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text.encode("ascii", "replace").decode()[:200]


def _shape_problem(body: Mapping[str, Any], where: str) -> str | None:
    """Why the object ``body`` of a review is not one a VerlJob check can read (None: readable)."""
    for key in ("metadata", "spec"):
        value = body.get(key)
        if value is not None and not isinstance(value, Mapping):
            return f"{where}{key}: must be an object, not {type(value).__name__}"
    meta = body.get("metadata") or {}
    for key in ("name", "namespace"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            return f"{where}metadata.{key}: must be a string, not {type(meta[key]).__name__}"
    return None


async def _kopf_serve(
    fn: Any, kopf_loop: asyncio.AbstractEventLoop, data: Any, webhook: Any, request: aiohttp.web.Request
) -> aiohttp.web.Response:
    ambiguous, unknown, webhook_error = kopf_private.admission_errors()
    headers = dict(request.headers)
    sslpeer = request.transport.get_extra_info("peercert") if request.transport else None
    future = asyncio.run_coroutine_threadsafe(
        fn(data, webhook=webhook, sslpeer=sslpeer, headers=headers), kopf_loop
    )
    try:
        response = await asyncio.wrap_future(future)
    except ambiguous as exc:
        raise aiohttp.web.HTTPConflict(reason=str(exc) or None) from exc
    except unknown as exc:
        raise aiohttp.web.HTTPNotFound(reason=str(exc) or None) from exc
    except webhook_error as exc:
        raise aiohttp.web.HTTPBadRequest(reason=str(exc) or None) from exc
    return aiohttp.web.json_response(response)


def admission_response(
    review: Mapping[str, Any],
    check: Callable[[Mapping[str, Any], Mapping[str, Any] | None, Mapping[str, Any]], None],
) -> dict[str, Any]:
    """The AdmissionReview response to ``review``, as kopf builds it for a validating handler.

    Args:
        review: The AdmissionReview request.
        check: Called with the object (the old one when there is no new one), the old object (None on
            CREATE) and the request's ``userInfo``; raises ``kopf.AdmissionError`` to deny (its ``code``,
            422 here) or anything else (denied with code 500 and the error's text). Only CREATE and UPDATE
            are checked; other operations are allowed.

    Raises:
        BadReview: The request has no ``userInfo`` or no object (kopf answers HTTP 400).
    """
    request = review.get("request")
    if not isinstance(request, Mapping):
        raise BadReview("the AdmissionReview has no request")
    new, old, userinfo = request.get("object"), request.get("oldObject"), request.get("userInfo")
    if userinfo is None:
        raise BadReview("User info is missing from the admission request.")
    if not isinstance(userinfo, Mapping):
        raise BadReview("the admission request's userInfo is not an object")
    body = new if new is not None else old
    if not isinstance(body, Mapping):
        raise BadReview("Either old or new object is missing from the admission request.")
    uid = request.get("uid")
    payload: dict[str, Any] = {"uid": uid if isinstance(uid, str) else "", "allowed": True}
    if request.get("operation") in ("CREATE", "UPDATE"):
        shape = _shape_problem(body, "")
        if shape is None and old is not None:
            shape = (
                _shape_problem(old, "oldObject.")
                if isinstance(old, Mapping)
                else "oldObject: must be an object"
            )
        if shape is not None:
            payload["allowed"] = False
            payload["status"] = {"message": f"VerlJob rejected:\n- {shape}", "code": 400}
            return _answer(review, payload)
        try:
            check(body, old if isinstance(old, Mapping) else None, userinfo)
        except kopf.AdmissionError as exc:
            payload["allowed"] = False
            payload["status"] = {"message": str(exc) or repr(exc), "code": exc.code or 500}
        except Exception as exc:  # kopf's answer to a failing handler: denied, code 500, its text
            log.exception("the admission check failed")
            payload["allowed"] = False
            payload["status"] = {"message": str(exc) or repr(exc), "code": 500}
    return _answer(review, payload)


def _answer(review: Mapping[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    version, kind = review.get("apiVersion"), review.get("kind")
    return {
        "apiVersion": version if isinstance(version, str) else "admission.k8s.io/v1",
        "kind": kind if isinstance(kind, str) else "AdmissionReview",
        "response": payload,
    }
