"""The reconcile loop: an event-driven, de-duplicating work queue of jobs with a few workers and timers.

A job is queued when its object or one of its pods changes, when capacity it may be waiting for appears (a Node
fact changes, GPUs are freed), when its TTL or active deadline comes due (a scheduled wake-up), when the retry
of a job whose pods could not be created comes due (or a PriorityClass changes), and at the safety resync (every job, every ``resync`` seconds; minutes by default). Nothing is polled.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import threading
import time
from concurrent.futures import Executor, ThreadPoolExecutor

from verl_operator.controller import metrics
from verl_operator.controller.cache import JobKey, WatchCache
from verl_operator.controller.decide import blocked_retry_due
from verl_operator.controller.kueue import poll_due
from verl_operator.controller.reconcile import JobReconciler
from verl_operator.controller.timers import next_due, progress_due

log = logging.getLogger("verl_operator.runtime")

#: Seconds between two refreshes of the jobs-by-phase gauge while jobs change.
PHASE_GAUGE_SECONDS = 1.0


class Runtime:
    """Owns the watch cache and runs the reconciler for queued jobs.

    Handlers (which kopf calls only once every index, and so the cache, is populated) call :meth:`mark_ready`
    and :meth:`enqueue`; :meth:`run` hands queued jobs to up to ``workers`` worker threads. One job is never
    reconciled twice at once (a job queued while it runs is run again afterwards); placements are serialised
    by the reconciler's placement lock.
    """

    def __init__(self) -> None:
        self.cache = WatchCache()
        self.pending: set[JobKey] = set()
        self.running: set[JobKey] = set()
        self.again: set[JobKey] = set()
        self.timers: list[tuple[float, JobKey]] = []
        self.due: dict[JobKey, float] = {}
        self.wakeup: asyncio.Event | None = None
        self.ready: asyncio.Event | None = None
        self._is_ready = False
        #: Set with :meth:`mark_ready`, for the admission reviews' threads (:meth:`await_loaded`).
        self.loaded = threading.Event()
        #: ``time.monotonic()`` when this replica's kopf started (None: not started).
        self.started_at: float | None = None
        self.phases_dirty = True
        self._previous: ThreadPoolExecutor | None = None  # the workers of the last run, until they finish

    def depth(self) -> int:
        """Jobs queued or being reconciled (read when ``/metrics`` is scraped)."""
        return len(self.pending) + len(self.running)

    def mark_ready(self) -> None:
        """Called by every handler: kopf runs handlers only after the initial listing filled the cache."""
        if not self._is_ready:
            self._is_ready = True
            self.loaded.set()
            if self.ready is not None:
                self.ready.set()

    def await_loaded(self, window: float) -> bool:
        """Block the calling thread (an admission review's) until the initial listing filled the cache, for
        at most the first ``window`` seconds after this replica started: a review planned on the empty cache
        of a replica that has just started would refuse a valid job for want of nodes. A cluster that gives
        no handler an object (no nodes, no jobs) never marks the cache ready, so later reviews do not wait.
        True when the cache is loaded."""
        if self.started_at is not None and not self.loaded.is_set():
            self.loaded.wait(max(0.0, self.started_at + window - time.monotonic()))
        return self.loaded.is_set()

    def enqueue(self, key: JobKey) -> None:
        """Reconcile ``(namespace, name)`` soon (call from the event loop)."""
        self.phases_dirty = True
        if key in self.running:
            self.again.add(key)
        else:
            self.pending.add(key)
        if self.wakeup is not None:
            self.wakeup.set()

    def capacity_changed(self) -> None:
        """Capacity appeared or changed: queue every job still waiting to be placed."""
        for key in self.cache.waiting_for_capacity():
            self.enqueue(key)

    def retry_blocked(self) -> None:
        """Something that may keep jobs' pods from being created changed: try those jobs at once."""
        for key in self.cache.retry_blocked():
            self.enqueue(key)

    def schedule(self, key: JobKey, epoch: float) -> None:
        """Queue the job at ``epoch`` (seconds since the epoch); a time already past is not scheduled again.

        One wake-up per job: a new time replaces the old one.
        """
        if epoch <= time.time() or self.due.get(key) == epoch:
            return
        self.due[key] = epoch
        heapq.heappush(self.timers, (epoch, key))
        if self.wakeup is not None:
            self.wakeup.set()

    async def _one(self, reconciler: JobReconciler, key: JobKey, executor: Executor) -> None:
        ns, name = key
        metrics.RECONCILES.inc()
        try:
            await asyncio.get_running_loop().run_in_executor(executor, reconciler.reconcile, ns, name)
        except Exception:
            metrics.RECONCILE_ERRORS.inc()
            log.exception("reconcile of %s/%s failed; retrying at the next change or resync", ns, name)
        finally:
            self.running.discard(key)
            job = self.cache.job_view(ns, name)  # read only: no copy
            dues = (
                [
                    next_due(job),
                    blocked_retry_due(job),
                    poll_due(job, time.time()),
                    progress_due(job, time.time()),
                ]
                if job is not None
                else []
            )
            due = min((d for d in dues if d is not None), default=None)
            if due is not None:
                self.schedule(key, due)
            if key in self.again:
                self.again.discard(key)
                self.pending.add(key)
            if self.wakeup is not None:
                self.wakeup.set()

    async def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the passes still running in the threads of a cancelled
        :meth:`run`; True when none is left."""
        if self._previous is None:
            return True
        previous = self._previous
        try:
            await asyncio.wait_for(
                asyncio.get_running_loop().run_in_executor(None, previous.shutdown, True), timeout
            )
        except TimeoutError:
            return False
        if self._previous is previous:
            self._previous = None
        return True

    async def run(self, reconciler: JobReconciler, resync: float, workers: int = 4) -> None:
        """Process the queue until cancelled (at operator shutdown, or when this replica loses the leader
        Lease: then it runs again once the replica leads again, after the passes still running in the
        threads of the cancelled run have finished; the cache and the queue stay filled in between).

        Args:
            reconciler: Reconciles one job per call (in a worker thread).
            resync: Seconds between two safety resyncs of every job.
            workers: Jobs reconciled at once.
        """
        self.wakeup = asyncio.Event()
        self.ready = asyncio.Event()
        if self._is_ready:
            self.ready.set()
        await self.ready.wait()
        loop = asyncio.get_running_loop()
        if self._previous is not None:  # never two passes of one job at once across two runs
            previous, self._previous = self._previous, None
            await loop.run_in_executor(None, previous.shutdown, True)
        # Threads of their own: kopf's executor (sync handlers, the webhook) never waits behind a reconcile.
        executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reconcile")
        tasks: set[asyncio.Task[None]] = set()
        next_resync = 0.0
        last_gauge = 0.0
        try:
            while True:
                now = loop.time()
                if now >= next_resync:
                    for key in self.cache.job_keys():
                        self.enqueue(key)
                    next_resync = now + resync
                epoch = time.time()
                while self.timers and self.timers[0][0] <= epoch:
                    at, key = heapq.heappop(self.timers)
                    if self.due.get(key) == at:
                        del self.due[key]
                        self.enqueue(key)
                if self.phases_dirty and now - last_gauge >= PHASE_GAUGE_SECONDS:
                    metrics.set_job_phases(self.cache.phases())
                    self.phases_dirty, last_gauge = False, now
                free = workers - len(self.running)
                # the queue's order, for the free workers only: with every worker busy nothing is ordered (a
                # batch queues hundreds of jobs, and each event would sort them all again)
                ready = self.pending - self.running if free > 0 else set()
                for key in heapq.nsmallest(free, ready, key=self.cache.order) if ready else ():
                    self.pending.discard(key)
                    self.running.add(key)
                    task = asyncio.create_task(self._one(reconciler, key, executor))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                self.wakeup.clear()
                if self.pending - self.running and len(self.running) < workers:
                    continue
                horizon = next_resync - loop.time()
                if self.timers:
                    horizon = min(horizon, self.timers[0][0] - time.time())
                if self.phases_dirty:
                    horizon = min(horizon, PHASE_GAUGE_SECONDS)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wakeup.wait(), timeout=max(0.01, horizon))
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            executor.shutdown(wait=False, cancel_futures=True)
            self._previous = executor


RUNTIME = Runtime()
metrics.QUEUE_DEPTH.set_function(RUNTIME.depth)
