"""Polling for the cluster tier: wait until the real control plane shows what a test expects."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = 30.0, interval: float = 0.2) -> T:
    """Poll ``probe`` until it returns something truthy and return it.

    Raises:
        AssertionError: after ``timeout`` seconds, naming ``what`` and the last value seen.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
