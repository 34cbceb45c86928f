"""The reconcile loop: a de-duplicating work queue of jobs, a periodic resync, one pass at a time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from verl_operator.controller import metrics
from verl_operator.controller.reconcile import JobReconciler
from verl_operator.controller.snapshot import Snapshot

log = logging.getLogger("verl_operator.runtime")
JobKey = tuple[str, str]


def _values(index: Mapping[Any, Any]) -> list[Any]:
    out: list[Any] = []
    for store in list(index.values()):
        out.extend(list(store))
    return out


class Runtime:
    """Holds the kopf indices and runs the reconciler for queued jobs.

    Handlers (which kopf calls only once every index is populated) bind the live indices and enqueue jobs;
    :meth:`run` processes them one by one, so two placements never race, and re-queues every job each
    ``resync`` seconds.
    """

    def __init__(self) -> None:
        self.nodes: Mapping[Any, Any] | None = None
        self.pods: Mapping[Any, Any] | None = None
        self.jobs: Mapping[Any, Any] | None = None
        self.pending: set[JobKey] = set()
        self.wakeup: asyncio.Event | None = None
        self.ready: asyncio.Event | None = None

    def bind(self, nodes: Mapping[Any, Any], pods: Mapping[Any, Any], jobs: Mapping[Any, Any]) -> None:
        """Remember the live kopf indices (they are complete when the first handler runs)."""
        self.nodes, self.pods, self.jobs = nodes, pods, jobs
        if self.ready is not None:
            self.ready.set()

    def enqueue(self, key: JobKey) -> None:
        """Reconcile ``(namespace, name)`` soon."""
        self.pending.add(key)
        if self.wakeup is not None:
            self.wakeup.set()

    def snapshot(self) -> Snapshot:
        """Nodes, GPU pods and placed jobs, copied from the indices (called in the event loop thread)."""
        assert self.nodes is not None and self.pods is not None and self.jobs is not None
        jobs = _values(self.jobs)
        return Snapshot(
            nodes=_values(self.nodes),
            pod_entries=_values(self.pods),
            reservations=[j[2] for j in jobs if j[2] is not None],
            live_uids=frozenset(j[0] for j in jobs),
            live_jobs=frozenset(f"{ns}/{name}" for ns, name in list(self.jobs.keys())),
        )

    async def run(self, reconciler: JobReconciler, resync: float) -> None:
        """Process the queue forever (cancelled at operator shutdown)."""
        self.wakeup = asyncio.Event()
        self.ready = asyncio.Event()
        if self.nodes is not None:
            self.ready.set()
        await self.ready.wait()
        loop = asyncio.get_running_loop()
        next_resync = 0.0
        while True:
            if loop.time() >= next_resync:
                assert self.jobs is not None
                for key in list(self.jobs.keys()):
                    self.pending.add(key)
                metrics.set_job_phases(j[1] for j in _values(self.jobs))
                next_resync = loop.time() + resync
            keys, self.pending = sorted(self.pending), set()
            for ns, name in keys:
                snap = self.snapshot()
                reconciler.snapshot = lambda snap=snap: snap  # type: ignore[misc]
                metrics.RECONCILES.inc()
                try:
                    await asyncio.to_thread(reconciler.reconcile, ns, name)
                except Exception:
                    metrics.RECONCILE_ERRORS.inc()
                    log.exception("reconcile of %s/%s failed; retrying at the next resync", ns, name)
            self.wakeup.clear()
            if not self.pending:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wakeup.wait(), timeout=max(0.05, next_resync - loop.time()))


RUNTIME = Runtime()
