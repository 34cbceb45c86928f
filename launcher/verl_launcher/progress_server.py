"""The head's progress endpoint: ``GET /progress`` answers the tracker's :class:`ProgressDocument` (bounded).

The operator reads it from the head pod's IP (docs/launch-contract.md). The server answers nothing else,
reads no request body, sends at most ``MAX_BYTES`` and serves at most :data:`MAX_CONCURRENT` requests at once
(one more is answered 503), each with a socket timeout, so a slow or hostile client cannot hold the head.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from verl_contract.progress import MAX_BYTES, PROGRESS_PATH, ProgressDocument

MAX_CONCURRENT = 4
TIMEOUT_SECONDS = 5.0


class ProgressServer:
    """A small HTTP server of one document; :meth:`start` runs it in a daemon thread."""

    def __init__(
        self, document: Callable[[], ProgressDocument], host: str = "0.0.0.0", port: int = 0
    ) -> None:
        slots = threading.BoundedSemaphore(MAX_CONCURRENT)

        class Handler(BaseHTTPRequestHandler):
            timeout = TIMEOUT_SECONDS

            def do_GET(self) -> None:
                if not slots.acquire(blocking=False):
                    self._answer(503, b'{"error":"busy"}')
                    return
                try:
                    if self.path.split("?", 1)[0] != PROGRESS_PATH:
                        self._answer(404, b'{"error":"not found"}')
                        return
                    body = document().to_json().encode()
                    if len(body) > MAX_BYTES:
                        self._answer(500, b'{"error":"document too large"}')
                        return
                    self._answer(200, body)
                finally:
                    slots.release()

            def _answer(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> ProgressServer:
        self._thread = threading.Thread(target=self._server.serve_forever, name="progress", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
