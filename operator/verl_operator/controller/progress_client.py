"""Reads a running job's progress from its head pod (the shell of :mod:`verl_operator.controller.progress`).

``GET http://<head pod IP>:8270/progress`` (the launcher's endpoint, :mod:`verl_contract.progress`), the way
KubeRay reads the Ray dashboard: the Ray pods need no right on the Kubernetes API. Bounded: one request per job
at most every ``min_interval`` seconds (a pass in between reuses the last reading), a short timeout, and at
most :data:`~verl_contract.progress.MAX_BYTES` read of the answer.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from verl_contract.progress import MAX_BYTES, PROGRESS_PATH, PROGRESS_PORT, ProgressDocument
from verl_operator.controller.progress import ProgressReading
from verl_operator.manifests.names import LABEL_ATTEMPT, LABEL_ROLE

#: Seconds one read may take (the reconcile pass waits for it).
TIMEOUT_SECONDS = 2.0


def head_pod_ip(pods: Sequence[Mapping[str, Any]], attempt: int) -> str | None:
    """The IP of the current attempt's head pod, None when it has none yet."""
    for pod in pods:
        labels = pod.get("metadata", {}).get("labels") or {}
        if labels.get(LABEL_ROLE) == "head" and labels.get(LABEL_ATTEMPT) == str(attempt):
            ip = (pod.get("status") or {}).get("podIP")
            return str(ip) if ip else None
    return None


def fetch(url: str, timeout: float = TIMEOUT_SECONDS) -> ProgressReading:
    """One GET of a progress endpoint, never raising: the document, or why there is none."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            body = answer.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as exc:
        return ProgressReading(None, f"HTTP {exc.code} from {url}")
    except (OSError, ValueError) as exc:
        return ProgressReading(None, f"{url}: {getattr(exc, 'reason', None) or exc}")
    if len(body) > MAX_BYTES:
        return ProgressReading(None, f"{url} answered more than {MAX_BYTES} bytes")
    try:
        return ProgressReading(ProgressDocument.model_validate_json(body))
    except ValidationError as exc:
        return ProgressReading(None, f"{url} answered an invalid document: {exc.errors()[0]['msg']}")


class ProgressClient:
    """Reads each running job's progress at most every ``min_interval`` seconds.

    Args:
        port: The head pod's progress port.
        min_interval: Seconds between two reads of one job.
        clock: A monotonic clock.
        get: The reader of one URL (tests pass their own).
    """

    def __init__(
        self,
        port: int = PROGRESS_PORT,
        min_interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        get: Callable[[str], ProgressReading] = fetch,
    ) -> None:
        self.port = port
        self.min_interval = min_interval
        self.clock = clock
        self.get = get
        self._last: dict[tuple[str, str], tuple[float, int, ProgressReading]] = {}
        self._lock = threading.Lock()

    def read(
        self, job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], attempt: int
    ) -> ProgressReading | None:
        """The job's reading (None: monitoring is off); a cached one within ``min_interval``."""
        monitoring = (job.get("spec") or {}).get("monitoring") or {}
        if monitoring.get("enabled") is False:
            return None
        key = (str(job["metadata"].get("namespace")), str(job["metadata"].get("name")))
        now = self.clock()
        with self._lock:
            cached = self._last.get(key)
        if cached is not None and cached[1] == attempt and now - cached[0] < self.min_interval:
            return cached[2]
        ip = head_pod_ip(pods, attempt)
        if ip is None:
            reading = ProgressReading(None, "the head pod has no IP yet")
        else:
            host = f"[{ip}]" if ":" in ip else ip
            reading = self.get(f"http://{host}:{self.port}{PROGRESS_PATH}")
        with self._lock:
            self._last[key] = (now, attempt, reading)
        return reading

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted job's last reading."""
        with self._lock:
            self._last.pop((namespace, name), None)
