"""Leader election on a ``coordination.k8s.io/v1`` Lease: only the replica that holds it reconciles.

The state machine is client-go's ``leaderelection`` (``tryAcquireOrRenew``): a replica creates the Lease when
there is none; renews it while it holds it; takes it over only when the record it last saw has not changed for
the lease's duration by its own clock (so two replicas' clocks need not agree); and every write carries the
``resourceVersion`` it read, so of two replicas that try at once one wins and the other gets a conflict.

A leader that finds the Lease held by another (taken over by hand, or deleted and re-created), or whose
renew meets a conflict, stops leading at that attempt, not at its renew deadline; a standby that finds the
Lease deleted waits until the last record it saw would have expired (its holder may still lead until then)
before it creates one, while the leader re-creates it at its next renew. So a Lease deleted or stolen by hand
never yields two writers.

A leader that has not renewed for the renew deadline stops leading at once (:meth:`LeaderElector.is_leader`
turns false at that instant, and :class:`FencedKube` refuses every write after it), which is before another
replica can take the lease over: that one waits the lease's duration from when it last saw a change, and the
renew deadline is shorter than the duration. The defaults are client-go's: 15 s / 10 s / 2 s.

The fence, what it guarantees and what it assumes. Every write the reconciler makes goes through
:class:`FencedKube`, which checks :meth:`LeaderElector.may_write` right before the call: this replica's last
attempt succeeded, the Lease it last observed (at the ``resourceVersion`` its own renew returned) names it,
and that attempt *began* less than the renew deadline ago by this process's monotonic clock. A standby takes
over no earlier than the lease's duration after it observed that same record (which it can only have read
after the attempt began), so the margin between the last write the fence lets through and the earliest
take-over is ``lease_duration - renew_deadline`` (5 s by default). As with client-go, this holds when

* the two replicas' clocks run at the same rate within that margin over one lease duration (no agreement on
  the time of day is needed: nothing compares the wall-clock times written in the Lease); and
* a write the fence let through reaches the API server within that margin. The API server applies a request
  when it arrives and checks no fencing token, so a request held longer (a process paused between the check
  and the send, a connection stalled for seconds) can still land after a take-over. What can land late is
  bounded by the requests already sent when the fence closed (each request is checked on its own, so at
  most one per API thread); nothing is sent after.

One window stays open, as in client-go: a replica that starts while the Lease is deleted has seen no record
to wait out and creates it at once; an earlier leader stops at its next attempt (or its renew deadline).

A renew that fails (no answer, a timeout) closes the fence at once, though leadership (the reconcile loop)
lasts to the renew deadline as in client-go; a conflict or another holder ends leadership itself at once.

Nothing here imports kopf; the clock and the API calls are passed in (unit tests use a fake clock and an
in-memory store).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

log = logging.getLogger("verl_operator.leader")

#: client-go's leaderelection defaults (controller-runtime's too).
LEASE_DURATION_SECONDS = 15.0
RENEW_DEADLINE_SECONDS = 10.0
RETRY_PERIOD_SECONDS = 2.0
#: client-go's JitterFactor: a standby retries every retry period times [1, 1.2).
JITTER_FACTOR = 1.2

#: The service account's namespace file in a pod (the default namespace of the Lease there).
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class ElectionTiming:
    """The three durations of client-go's election, in seconds.

    Attributes:
        lease_duration: How long a standby waits, from the last change of the Lease it saw, before it takes
            the Lease over.
        renew_deadline: How long the leader keeps leading without a successful renew.
        retry_period: Seconds between two attempts to acquire or renew.
    """

    lease_duration: float = LEASE_DURATION_SECONDS
    renew_deadline: float = RENEW_DEADLINE_SECONDS
    retry_period: float = RETRY_PERIOD_SECONDS

    def problems(self) -> list[str]:
        """Why these durations cannot work (client-go's checks), each naming the flag and the numbers."""
        out = []
        if self.retry_period <= 0:
            out.append(f"--leader-election-retry-period must be > 0 (got {self.retry_period:g})")
        if self.lease_duration <= self.renew_deadline:
            out.append(
                f"--leader-election-lease-duration ({self.lease_duration:g}) must be greater than "
                f"--leader-election-renew-deadline ({self.renew_deadline:g}): a leader must stop before "
                f"another can take over; for example {self.renew_deadline + 5:g} and {self.renew_deadline:g}"
            )
        if self.renew_deadline <= JITTER_FACTOR * self.retry_period:
            out.append(
                f"--leader-election-renew-deadline ({self.renew_deadline:g}) must be greater than "
                f"{JITTER_FACTOR:g} x --leader-election-retry-period ({self.retry_period:g}) = "
                f"{JITTER_FACTOR * self.retry_period:g}: at least one renew must fit in the deadline"
            )
        return out


@dataclass(frozen=True)
class LeaseRecord:
    """What the Lease says (its spec) and the ``resourceVersion`` it was read at."""

    holder: str | None = None
    lease_duration_seconds: int | None = None
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0
    resource_version: str | None = None

    def same_record(self, other: LeaseRecord | None) -> bool:
        """The same holder and times (the resource version aside): the lease has not changed."""
        return other is not None and replace(self, resource_version=None) == replace(
            other, resource_version=None
        )


class LeaseConflict(Exception):
    """The Lease changed since it was read (409), or it exists already on create."""


class LeaseStore(Protocol):
    """The Lease's three calls."""

    def get(self) -> LeaseRecord | None:
        """The Lease, or None when there is none."""

    def create(self, record: LeaseRecord) -> LeaseRecord:
        """Create it; raises :class:`LeaseConflict` when it exists."""

    def update(self, record: LeaseRecord) -> LeaseRecord:
        """Replace it at ``record.resource_version``; raises :class:`LeaseConflict` when it changed since."""


def micro_time(wall: datetime) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return wall.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One replica's view of the election.

    Args:
        store: The Lease's API calls.
        identity: This replica's holder identity (unique per process).
        timing: The durations.
        clock: Monotonic seconds (``time.monotonic``; a fake clock in tests).
        wall: The wall-clock time written into the Lease (``acquireTime``, ``renewTime``).
    """

    def __init__(
        self,
        store: LeaseStore,
        identity: str,
        timing: ElectionTiming,
        clock: Callable[[], float],
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        self.identity = identity
        self.timing = timing
        self.clock = clock
        self.wall = wall
        self.observed: LeaseRecord | None = None
        self.observed_at: float | None = None  # when (by self.clock) the observed record last changed
        self.renewed_at: float | None = None  # the start of the last successful acquire or renew
        self.released = False
        self.renew_failed = False  # the last attempt raised (no answer from the API server)

    # -- the state machine ---------------------------------------------------------------------------------

    def is_leader(self, now: float | None = None) -> bool:
        """True while the last successful acquire or renew began less than the renew deadline ago (and
        :meth:`stop_leading` was not called)."""
        return not self.released and self._held(now)

    def _held(self, now: float | None = None) -> bool:
        if self.renewed_at is None:
            return False
        at = self.clock() if now is None else now
        return at - self.renewed_at < self.timing.renew_deadline

    def may_write(self, now: float | None = None) -> bool:
        """The fence (:class:`FencedKube`): True only while this replica leads (:meth:`is_leader`), its last
        attempt to renew succeeded, and the Lease it last observed (at its ``resourceVersion``) names it.

        A renew that fails (an API error, a timeout) closes the fence at once, before the renew deadline ends
        leadership; the next successful renew opens it again. A pass in flight meanwhile meets
        :class:`NotLeading` at its next write and is retried later.
        """
        return (
            self.is_leader(now)
            and not self.renew_failed
            and self.observed is not None
            and self.observed.holder == self.identity
        )

    def stop_leading(self) -> None:
        """Lead no more from now on (shutdown): :meth:`is_leader` is False, so the fence refuses every write;
        the Lease stays held until :meth:`release` hands it back (after the passes in flight finished)."""
        self.released = True

    def deadline(self) -> float | None:
        """The clock reading at which this replica stops leading unless it renews first."""
        return None if self.renewed_at is None else self.renewed_at + self.timing.renew_deadline

    def try_acquire_or_renew(self) -> bool:
        """One attempt (client-go's ``tryAcquireOrRenew``); True when this replica holds the Lease after it.

        An API error other than a conflict propagates; the caller counts it as a failed attempt. Until the
        next attempt that succeeds, :meth:`may_write` is False (leadership itself lasts to the renew deadline).
        """
        try:
            held = self._try_acquire_or_renew()
        except BaseException:
            self.renew_failed = True
            raise
        self.renew_failed = False
        return held

    def _try_acquire_or_renew(self) -> bool:
        started = self.clock()
        if self.released:
            return False
        stamp = micro_time(self.wall())
        duration = max(1, round(self.timing.lease_duration))
        current = self.store.get()
        if current is None:
            seen = self.observed
            if (
                seen is not None
                and seen.holder not in (None, self.identity)
                and not self._expired(seen, started)
            ):
                return False  # a deleted Lease: its last holder may lead until the record it wrote expires
            mine = LeaseRecord(self.identity, duration, stamp, stamp, 0)
            try:
                self._observe(self.store.create(mine), started)
            except LeaseConflict:
                self.renewed_at = None  # another created it first: it leads
                return False
            self.renewed_at = started
            return True
        if not current.same_record(self.observed):
            self._observe(current, started)
        elif self.observed is not None and current.resource_version != self.observed.resource_version:
            self.observed = current  # the same record at a newer version: keep when it last changed
        holder = current.holder or None
        if holder is not None and holder != self.identity and not self._expired(current, started):
            self.renewed_at = None  # another holds it (taken by hand, or re-created): stop leading at once
            return False
        if holder == self.identity:
            mine = replace(current, lease_duration_seconds=duration, renew_time=stamp)
        else:
            mine = LeaseRecord(
                self.identity, duration, stamp, stamp, current.transitions + 1, current.resource_version
            )
        try:
            self._observe(self.store.update(mine), started)
        except LeaseConflict:
            self.renewed_at = None  # the Lease changed under this write: someone else wrote it
            return False
        self.renewed_at = started
        return True

    def _observe(self, record: LeaseRecord, at: float) -> None:
        self.observed, self.observed_at = record, at

    def _expired(self, record: LeaseRecord, now: float) -> bool:
        """The record has not changed for its lease duration (the holder's own, else ours) by our clock."""
        assert self.observed_at is not None
        duration = record.lease_duration_seconds or self.timing.lease_duration
        return self.observed_at + duration <= now

    def release(self) -> bool:
        """Stop leading now and hand the Lease back (an empty holder), so a standby takes over at its next
        retry instead of after the lease's duration. Call after the reconciles stopped; True when released."""
        was_leader = self._held()
        self.released = True
        if not was_leader or self.observed is None or self.observed.holder != self.identity:
            return False
        stamp = micro_time(self.wall())
        empty = LeaseRecord(None, 1, stamp, stamp, self.observed.transitions, self.observed.resource_version)
        try:
            self.store.update(empty)
        except Exception:  # the lease then expires on its own
            log.warning("could not release the lease; a standby takes over when it expires", exc_info=True)
            return False
        return True

    # -- the loop ------------------------------------------------------------------------------------------

    async def run(
        self,
        on_started: Callable[[], Awaitable[None]],
        on_stopped: Callable[[], Awaitable[None]],
        rng: random.Random | None = None,
    ) -> None:
        """Acquire, renew, and call ``on_started`` / ``on_stopped`` as leadership begins and ends (forever;
        cancelled at shutdown). ``on_stopped`` is called the moment the renew deadline passes, even while
        a renew call is still waiting for the API server."""
        loop = asyncio.get_running_loop()
        rng = rng or random.Random()
        calls = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lease")
        leading = False
        try:
            while True:
                attempt = loop.run_in_executor(calls, self._attempt)
                while True:
                    timeout = None
                    deadline = self.deadline()
                    if leading and deadline is not None:
                        timeout = max(0.0, deadline - self.clock())
                    done, _ = await asyncio.wait({attempt}, timeout=timeout)
                    if leading and not self.is_leader():
                        leading = False
                        log.warning(
                            "%s lost the lease (no renew for %gs): reconciling stops",
                            self.identity,
                            self.timing.renew_deadline,
                        )
                        await on_stopped()
                    if done:
                        break
                if self.is_leader() and not leading:
                    leading = True
                    log.info("%s holds the lease: reconciling starts", self.identity)
                    await on_started()
                pause = self.timing.retry_period
                if not leading:
                    pause *= 1 + rng.random() * (JITTER_FACTOR - 1)  # client-go's jitter for acquiring
                wake = self.clock() + pause
                deadline = self.deadline()
                while True:
                    now = self.clock()
                    horizon = wake - now
                    if leading and deadline is not None:
                        horizon = min(horizon, deadline - now)
                    if horizon > 0:
                        await asyncio.sleep(horizon)
                    if leading and not self.is_leader():
                        leading = False
                        log.warning("%s lost the lease: reconciling stops", self.identity)
                        await on_stopped()
                    if self.clock() >= wake:
                        break
        finally:
            calls.shutdown(wait=False, cancel_futures=True)

    def _attempt(self) -> bool:
        try:
            return self.try_acquire_or_renew()
        except Exception:  # an unreachable API server: the attempt failed, the loop goes on
            log.warning("lease %s: acquire/renew failed", self.identity, exc_info=True)
            return False


class NotLeading(RuntimeError):
    """A write refused because this replica does not hold the Lease (any more)."""


#: The calls of :class:`~verl_operator.controller.kube.KubeAPI` that change the cluster.
WRITES = frozenset(
    {"patch_status", "create", "patch_configmap_data", "ungate", "delete_pod", "delete_job", "event"}
)


class FencedKube:
    """The reconciler's API calls, each write refused unless ``leading()`` (:meth:`LeaderElector.may_write`)
    says this replica holds an unexpired Lease, checked right before every write.

    A pass that began while leading and is still running in its thread when the lease is lost makes no
    further write: the loop is cancelled at that moment, and this fence stops the pass already in flight.
    """

    def __init__(self, kube: Any, leading: Callable[[], bool]) -> None:
        self._kube = kube
        self._leading = leading

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._kube, name)
        if name not in WRITES:
            return attr

        def fenced(*args: Any, **kwargs: Any) -> Any:
            if not self._leading():
                raise NotLeading(f"{name}: this replica does not hold the lease")
            return attr(*args, **kwargs)

        return fenced


# -- the Kubernetes Lease ----------------------------------------------------------------------------------


def _record(obj: Mapping[str, Any]) -> LeaseRecord:
    spec = obj.get("spec") or {}
    return LeaseRecord(
        holder=spec.get("holderIdentity") or None,
        lease_duration_seconds=spec.get("leaseDurationSeconds"),
        acquire_time=spec.get("acquireTime"),
        renew_time=spec.get("renewTime"),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=(obj.get("metadata") or {}).get("resourceVersion"),
    )


class KubeLeaseStore:
    """A ``coordination.k8s.io/v1`` Lease through the API client (raw JSON, no model conversion).

    Args:
        api: A ``kubernetes.client.ApiClient``.
        namespace: The Lease's namespace.
        name: The Lease's name.
        timeout: Seconds each call may take.
    """

    def __init__(self, api: Any, namespace: str, name: str, timeout: float) -> None:
        from kubernetes import client

        self.coordination = client.CoordinationV1Api(api)
        self.namespace, self.name, self.timeout = namespace, name, timeout

    def _body(self, record: LeaseRecord) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if record.resource_version:
            meta["resourceVersion"] = record.resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": record.holder,
                "leaseDurationSeconds": record.lease_duration_seconds,
                "acquireTime": record.acquire_time,
                "renewTime": record.renew_time,
                "leaseTransitions": record.transitions,
            },
        }

    def _json(self, response: Any) -> LeaseRecord:
        from verl_operator.controller.kube import response_json

        return _record(response_json(response))

    def get(self) -> LeaseRecord | None:
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.coordination.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=self.timeout
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return self._json(response)

    def create(self, record: LeaseRecord) -> LeaseRecord:
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.coordination.create_namespaced_lease(
                self.namespace,
                self._body(record),  # type: ignore[arg-type]  # a plain dict serialises as it is
                _preload_content=False,
                _request_timeout=self.timeout,
            )
        except ApiException as exc:
            if exc.status == 409:
                raise LeaseConflict(str(exc.reason)) from exc
            raise
        return self._json(response)

    def update(self, record: LeaseRecord) -> LeaseRecord:
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.coordination.replace_namespaced_lease(
                self.name,
                self.namespace,
                self._body(record),  # type: ignore[arg-type]  # a plain dict serialises as it is
                _preload_content=False,
                _request_timeout=self.timeout,
            )
        except ApiException as exc:
            if exc.status == 409:
                raise LeaseConflict(str(exc.reason)) from exc
            raise
        return self._json(response)


def default_identity() -> str:
    """client-go's convention: the host name (the pod's name in a pod) and a random suffix, unique per
    process, so a restarted pod never mistakes its predecessor's lease for its own."""
    host = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{host}_{uuid.uuid4().hex[:12]}"


def default_namespace() -> str | None:
    """The Lease's namespace when no flag names one: the pod's (``POD_NAMESPACE``, else the service
    account's namespace file); None outside a pod."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as fh:
            return fh.read().strip() or None
    except OSError:
        return None
