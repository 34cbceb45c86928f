"""The leader election's state machine (controller/leader.py) against a fake clock and an in-memory Lease.

The store behaves like the API server: every write bumps the resource version, and a write at an older one
is a conflict. The loop (``LeaderElector.run``) runs on the real event loop with short durations.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from verl_operator.controller.leader import (
    ElectionTiming,
    FencedKube,
    LeaderElector,
    LeaseConflict,
    LeaseRecord,
    NotLeading,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class MemoryLease:
    """One Lease with optimistic concurrency; ``down`` makes every call fail like an unreachable server."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.versions = itertools.count(1)
        self.down = False
        self.writes = 0

    def _check(self) -> None:
        if self.down:
            raise ConnectionError("the API server is unreachable")

    def get(self) -> LeaseRecord | None:
        self._check()
        return self.record

    def create(self, record: LeaseRecord) -> LeaseRecord:
        self._check()
        if self.record is not None:
            raise LeaseConflict("exists")
        return self._store(record)

    def update(self, record: LeaseRecord) -> LeaseRecord:
        self._check()
        if self.record is None or record.resource_version != self.record.resource_version:
            raise LeaseConflict("changed")
        return self._store(record)

    def _store(self, record: LeaseRecord) -> LeaseRecord:
        self.writes += 1
        self.record = replace(record, resource_version=str(next(self.versions)))
        return self.record


DEFAULT = ElectionTiming()


def elector(
    store: MemoryLease, clock: Clock, identity: str, timing: ElectionTiming = DEFAULT
) -> LeaderElector:
    return LeaderElector(
        store, identity, timing, clock=clock, wall=lambda: datetime.fromtimestamp(clock(), UTC)
    )


def test_the_defaults_are_client_gos() -> None:
    assert (DEFAULT.lease_duration, DEFAULT.renew_deadline, DEFAULT.retry_period) == (15.0, 10.0, 2.0)
    assert DEFAULT.problems() == []


def test_durations_that_cannot_work_name_the_flags_and_the_numbers() -> None:
    problems = ElectionTiming(10, 10, 2).problems()
    assert len(problems) == 1
    assert (
        "--leader-election-lease-duration (10) must be greater than --leader-election-renew-deadline (10)"
        in (problems[0])
    )
    assert "for example 15 and 10" in problems[0]
    (short,) = ElectionTiming(15, 2, 2).problems()
    assert "1.2 x --leader-election-retry-period (2) = 2.4" in short


def test_acquire_creates_the_lease_and_leads() -> None:
    store, clock = MemoryLease(), Clock()
    a = elector(store, clock, "a")
    assert not a.is_leader()
    assert a.try_acquire_or_renew()
    assert a.is_leader()
    assert store.record is not None
    assert (store.record.holder, store.record.lease_duration_seconds, store.record.transitions) == (
        "a",
        15,
        0,
    )
    assert store.record.acquire_time == store.record.renew_time == "1970-01-01T00:16:40.000000Z"


def test_renew_keeps_the_acquire_time_and_moves_the_renew_time() -> None:
    store, clock = MemoryLease(), Clock()
    a = elector(store, clock, "a")
    assert a.try_acquire_or_renew()
    acquired = store.record
    for _ in range(10):  # 20 s of renews: longer than the lease, still leading
        clock.advance(2)
        assert a.try_acquire_or_renew()
        assert a.is_leader()
    assert store.record is not None and acquired is not None
    assert store.record.acquire_time == acquired.acquire_time
    assert store.record.renew_time == "1970-01-01T00:17:00.000000Z"
    assert store.record.transitions == 0 and store.record.holder == "a"


def test_a_missed_renew_deadline_stops_leading_before_another_can_take_over() -> None:
    store, clock = MemoryLease(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # b observes a's record now
    store.down = True  # a cannot renew any more (and b cannot reach the server either)
    for _ in range(4):
        clock.advance(2)
        assert a._attempt() is False
    assert a.is_leader(), "8 s without a renew: still inside the 10 s renew deadline"
    clock.advance(1.999)
    assert a.is_leader()
    clock.advance(0.002)
    assert not a.is_leader(), "10 s without a renew: a stops at once"
    assert a.deadline() == 1010.0
    store.down = False
    # b saw a's record change last at 1000: it may take over only at 1015, five seconds after a stopped.
    clock.now = 1014.9
    assert not b.try_acquire_or_renew()
    assert not b.is_leader() and not a.is_leader()
    clock.now = 1015.0
    assert b.try_acquire_or_renew()
    assert b.is_leader() and not a.is_leader()
    assert store.record is not None and store.record.holder == "b" and store.record.transitions == 1


def test_a_stale_lease_is_taken_over_after_its_duration() -> None:
    store, clock = MemoryLease(), Clock()
    store._store(LeaseRecord("gone", 15, "x", "x", 3))  # a crashed holder's lease, never renewed again
    b = elector(store, clock, "b")
    assert not b.try_acquire_or_renew(), "first sight: b starts its own count of the lease's duration"
    clock.advance(14.9)
    assert not b.try_acquire_or_renew()
    clock.advance(0.1)
    assert b.try_acquire_or_renew()
    assert store.record.holder == "b" and store.record.transitions == 4
    assert store.record.acquire_time == store.record.renew_time


def test_the_holders_own_lease_duration_counts() -> None:
    store, clock = MemoryLease(), Clock()
    store._store(LeaseRecord("gone", 40, "x", "x", 0))  # the holder runs with a longer lease
    b = elector(store, clock, "b")
    assert not b.try_acquire_or_renew()
    clock.advance(15)
    assert not b.try_acquire_or_renew(), "15 s is our default; the holder asked for 40 s"
    clock.advance(25)
    assert b.try_acquire_or_renew()


def test_a_lease_renewed_by_another_is_never_taken() -> None:
    store, clock = MemoryLease(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert a.try_acquire_or_renew()
    for _ in range(30):  # a minute: b keeps seeing a's renews, so the lease never expires for it
        clock.advance(2)
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
        assert not b.is_leader()
    assert store.record is not None and store.record.holder == "a" and store.record.transitions == 0


def test_two_at_once_one_wins_by_the_resource_version() -> None:
    store, clock = MemoryLease(), Clock()
    store._store(LeaseRecord("gone", 15, "x", "x", 0))
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert not a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    clock.advance(15)
    seen = store.record

    class Race(MemoryLease):  # b's update lands between a's read and a's write
        def get(self) -> LeaseRecord | None:
            return seen

    race = Race()
    race.record, race.versions = store.record, store.versions
    a.store = race
    assert b.try_acquire_or_renew()
    race.record = store.record
    assert not a.try_acquire_or_renew(), "a wrote at the version it read: a conflict"
    assert not a.is_leader() and b.is_leader()


def test_an_unreachable_server_on_create_is_a_failed_attempt() -> None:
    store, clock = MemoryLease(), Clock()
    store.down = True
    a = elector(store, clock, "a")
    assert a._attempt() is False
    assert not a.is_leader()


def test_release_hands_the_lease_back_for_an_immediate_take_over() -> None:
    store, clock = MemoryLease(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.release()
    assert not a.is_leader() and not a.try_acquire_or_renew(), "a released replica never leads again"
    assert store.record is not None and store.record.holder is None
    clock.advance(2)
    assert b.try_acquire_or_renew(), "an empty holder: no wait for the lease's duration"
    assert store.record.holder == "b" and store.record.transitions == 1


def test_release_by_a_standby_writes_nothing() -> None:
    store, clock = MemoryLease(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert a.try_acquire_or_renew()
    writes = store.writes
    assert not b.try_acquire_or_renew()
    assert not b.release()
    assert store.writes == writes and store.record is not None and store.record.holder == "a"


def test_the_fence_refuses_writes_and_passes_reads() -> None:
    calls: list[str] = []

    class Kube:
        def get_job(self, ns: str, name: str) -> str:
            calls.append("get_job")
            return "job"

        def create(self, manifest: dict[str, str]) -> bool:
            calls.append("create")
            return True

    leading = [True]
    fenced = FencedKube(Kube(), lambda: leading[0])
    assert fenced.create({}) is True
    leading[0] = False
    assert fenced.get_job("ns", "j") == "job"
    with pytest.raises(NotLeading, match="create: this replica does not hold the lease"):
        fenced.create({})
    assert calls == ["create", "get_job"]


def test_the_loop_starts_and_stops_at_the_deadline_even_while_a_renew_hangs() -> None:
    """The real loop on the real clock (short durations): started once, stopped at the renew deadline
    although the renew call it is waiting for never returns in time."""
    store = MemoryLease()
    timing = ElectionTiming(lease_duration=0.9, renew_deadline=0.6, retry_period=0.1)
    a = LeaderElector(store, "a", timing, clock=time.monotonic)
    events: list[tuple[str, float]] = []

    class Hanging(MemoryLease):
        def get(self) -> LeaseRecord | None:
            time.sleep(2)  # a call that hangs far past the deadline
            return store.record

    async def main() -> None:
        async def started() -> None:
            events.append(("started", time.monotonic()))

        async def stopped() -> None:
            events.append(("stopped", time.monotonic()))

        task = asyncio.create_task(a.run(started, stopped))
        while not events:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.35)  # a few renews
        assert a.is_leader()
        a.store = Hanging()
        while len(events) < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(asyncio.wait_for(main(), timeout=10))
    assert [e for e, _ in events] == ["started", "stopped"]
    deadline = a.deadline()
    assert deadline is not None
    assert deadline <= events[1][1] < deadline + 0.1, "stopped at the renew deadline, not after the hung call"


def test_shutdown_fences_first_and_hands_the_lease_back_after() -> None:
    store, clock = MemoryLease(), Clock()
    a = elector(store, clock, "a")
    assert a.try_acquire_or_renew()

    class Kube:
        def create(self, manifest: dict[str, str]) -> bool:
            raise AssertionError("a write passed the fence")

    fenced = FencedKube(Kube(), a.is_leader)
    a.stop_leading()
    assert not a.is_leader(), "no write from the moment shutdown begins"
    with pytest.raises(NotLeading):
        fenced.create({})
    assert store.record is not None and store.record.holder == "a", "still held while the passes drain"
    assert a.release()
    assert store.record.holder is None


def test_release_after_the_deadline_writes_nothing() -> None:
    store, clock = MemoryLease(), Clock()
    a = elector(store, clock, "a")
    assert a.try_acquire_or_renew()
    writes = store.writes
    clock.advance(10)
    assert not a.release(), "past the renew deadline the lease may be another's already"
    assert store.writes == writes


def test_a_deleted_lease_never_yields_two_leaders() -> None:
    """The Lease deleted by hand: the standby waits out the last record it saw, the leader re-creates it;
    at no clock reading do both lead."""
    clock, store = Clock(), MemoryLease()
    leader, standby = elector(store, clock, "a"), elector(store, clock, "b")
    assert leader.try_acquire_or_renew() and not standby.try_acquire_or_renew()
    store.record = None  # kubectl delete lease
    clock.advance(1)
    assert not standby.try_acquire_or_renew()  # the holder it saw may still lead
    assert not (leader.is_leader() and standby.is_leader())
    clock.advance(1)
    assert leader.try_acquire_or_renew()  # the leader re-creates it at its next renew
    assert store.record is not None and store.record.holder == "a"
    for _ in range(20):
        clock.advance(DEFAULT.retry_period)
        leader.try_acquire_or_renew()
        standby.try_acquire_or_renew()
        assert leader.is_leader() and not standby.is_leader()


def test_a_deleted_lease_of_a_crashed_leader_is_taken_after_its_duration() -> None:
    clock, store = Clock(), MemoryLease()
    crashed, standby = elector(store, clock, "a"), elector(store, clock, "b")
    assert crashed.try_acquire_or_renew() and not standby.try_acquire_or_renew()
    store.record = None
    clock.advance(DEFAULT.lease_duration - 1)
    assert not standby.try_acquire_or_renew()
    clock.advance(1)
    assert standby.try_acquire_or_renew() and standby.is_leader()
    assert not crashed.is_leader()  # its renew deadline passed long before


def test_a_stolen_lease_stops_the_leader_at_its_next_attempt() -> None:
    """Another holder written by hand: the leader stops leading at that attempt, not at its renew deadline,
    and its fence refuses writes from then on."""
    clock, store = Clock(), MemoryLease()
    leader = elector(store, clock, "a")
    assert leader.try_acquire_or_renew()
    assert store.record is not None
    store._store(replace(store.record, holder="intruder"))
    clock.advance(1)
    assert not leader.try_acquire_or_renew()
    assert not leader.is_leader()

    class Kube:
        def patch_status(self, *args: object) -> None:
            raise AssertionError("a write went through")

    with pytest.raises(NotLeading):
        FencedKube(Kube(), leader.is_leader).patch_status("ns", "j", {})


def test_a_conflicting_renew_stops_leading() -> None:
    clock, store = Clock(), MemoryLease()
    leader = elector(store, clock, "a")
    assert leader.try_acquire_or_renew()
    assert store.record is not None
    real_get = store.get

    def stale_get() -> LeaseRecord | None:
        record = real_get()
        if record is not None:
            store._store(replace(record))  # someone writes between the get and the update
        return record

    store.get = stale_get  # type: ignore[method-assign]
    clock.advance(1)
    assert not leader.try_acquire_or_renew() and not leader.is_leader()


def _steps_fail_then_recover(store: MemoryLease, clock: Clock, a: LeaderElector) -> None:
    store.down = True
    clock.advance(DEFAULT.retry_period)
    with pytest.raises(ConnectionError):
        a.try_acquire_or_renew()


def _steps_fail_twice_past_the_deadline(store: MemoryLease, clock: Clock, a: LeaderElector) -> None:
    _steps_fail_then_recover(store, clock, a)
    clock.advance(DEFAULT.renew_deadline)


def _steps_recover(store: MemoryLease, clock: Clock, a: LeaderElector) -> None:
    _steps_fail_then_recover(store, clock, a)
    store.down = False
    clock.advance(DEFAULT.retry_period)
    assert a.try_acquire_or_renew()


def _steps_renewed(store: MemoryLease, clock: Clock, a: LeaderElector) -> None:
    clock.advance(DEFAULT.retry_period)
    assert a.try_acquire_or_renew()


def _steps_just_before_the_deadline(store: MemoryLease, clock: Clock, a: LeaderElector) -> None:
    clock.advance(DEFAULT.renew_deadline - 0.001)


def _steps_at_the_deadline(store: MemoryLease, clock: Clock, a: LeaderElector) -> None:
    clock.advance(DEFAULT.renew_deadline)


def _steps_deleted(store: MemoryLease, clock: Clock, a: LeaderElector) -> None:
    store.record = None
    clock.advance(DEFAULT.retry_period)
    assert a.try_acquire_or_renew()  # the leader re-creates it and goes on


def _steps_stolen(store: MemoryLease, clock: Clock, a: LeaderElector) -> None:
    assert store.record is not None
    store._store(replace(store.record, holder="intruder"))
    clock.advance(0.5)
    assert not a.try_acquire_or_renew()


def _steps_shut_down(store: MemoryLease, clock: Clock, a: LeaderElector) -> None:
    a.stop_leading()


@pytest.mark.parametrize(
    ("steps", "leads", "writes"),
    [
        pytest.param(_steps_renewed, True, True, id="renewed"),
        pytest.param(_steps_just_before_the_deadline, True, True, id="deadline-less-1ms"),
        pytest.param(_steps_at_the_deadline, False, False, id="at-the-renew-deadline"),
        pytest.param(_steps_fail_then_recover, True, False, id="renew-failed-fence-closes-at-once"),
        pytest.param(_steps_fail_twice_past_the_deadline, False, False, id="renew-failed-to-the-deadline"),
        pytest.param(_steps_recover, True, True, id="renew-failed-then-succeeded"),
        pytest.param(_steps_deleted, True, True, id="deleted-re-created-by-the-leader"),
        pytest.param(_steps_stolen, False, False, id="stolen"),
        pytest.param(_steps_shut_down, False, False, id="shut-down"),
    ],
)
def test_the_fence_opens_only_on_a_held_unexpired_lease(steps: object, leads: bool, writes: bool) -> None:
    """The fence (``may_write``) after each situation, by the fake clock; a write goes through iff it is open,
    and it is never open while the replica does not lead."""
    clock, store = Clock(), MemoryLease()
    a = elector(store, clock, "a")
    assert a.try_acquire_or_renew() and a.may_write()
    steps(store, clock, a)  # type: ignore[operator]
    assert (a.is_leader(), a.may_write()) == (leads, writes)

    class Kube:
        def __init__(self) -> None:
            self.written: list[str] = []

        def patch_status(self, ns: str, name: str, patch: dict[str, str]) -> None:
            self.written.append(name)

    kube = Kube()
    fenced = FencedKube(kube, a.may_write)
    if writes:
        fenced.patch_status("ns", "j", {})
        assert kube.written == ["j"]
    else:
        with pytest.raises(NotLeading, match="patch_status: this replica does not hold the lease"):
            fenced.patch_status("ns", "j", {})
        assert kube.written == []


def test_a_deleted_lease_never_opens_two_fences() -> None:
    """The Lease deleted by hand while a leader and a standby run, the standby's attempts interleaved with
    the leader's at every 0.25 s of the fake clock for two lease durations: never both fences open."""
    clock, store = Clock(), MemoryLease()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    store.record = None
    for tick in range(int(2 * DEFAULT.lease_duration / 0.25)):
        clock.advance(0.25)
        if tick % 8 == 0:  # every 2 s, the retry period
            a.try_acquire_or_renew()
        if tick % 8 == 3:
            b.try_acquire_or_renew()
        assert not (a.may_write() and b.may_write()), f"two writers at +{(tick + 1) * 0.25:g}s"
    assert a.may_write() and not b.may_write()
