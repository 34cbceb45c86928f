"""kopf's start-up barrier without a wake-up storm: toggle sets notify their waiters when their state flips.

kopf holds every object's handlers until every index is populated: in its watchers each object of an
indexed resource (here nodes, pods, VerlJobs, PriorityClasses) gets a toggle in one ``ToggleSet`` when its
first event arrives and drops it once its index handler ran; every object's worker then waits for the set
to be empty (``kopf/_core/reactor/queueing.py`` ``watcher``, ``processing.py`` ``process_resource_event``,
kopf 1.38-1.45). Each ``make_toggle`` and ``drop_toggle`` calls ``notify_all`` on the set's condition, so
each of n objects wakes every one of the up to n workers already waiting: n squared task wake-ups, each a
trip through the event loop. On 5000 nodes with 3750 pods and 1000 jobs the operator spent over 15 minutes
of a core in them after a restart, reconciling nothing (``docs/benchmarks.md``).

Adding or dropping a toggle changes no toggle's own state, only possibly the set's (``any`` / ``all`` of
its toggles), and the set's waiters wait for the set's state (``ToggleSet.wait_for``). So notifying only
when that state flipped wakes every waiter whose condition became true and no other: the same behaviour,
with O(n) wake-ups in all. :func:`install` replaces the three methods once, and leaves kopf as it is if
its ``ToggleSet`` does not look as expected (a later kopf).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger("verl_operator.kopf")

#: The methods replaced, and the attributes they rely on.
_METHODS = ("make_toggle", "drop_toggle", "drop_toggles")
_ATTRIBUTES = ("_condition", "_toggles", "is_on")


def install() -> bool:
    """Make kopf's ``ToggleSet`` notify on state changes only; True when installed (or already)."""
    try:
        from kopf._cogs.aiokits import aiotoggles
    except ImportError:  # pragma: no cover - kopf moved its internals
        log.warning("kopf's toggles not found; its start-up barrier is left as it is")
        return False
    cls: Any = aiotoggles.ToggleSet
    if getattr(cls, "_notifies_on_flips", False):
        return True
    probe = cls(all)
    if not all(hasattr(cls, m) for m in _METHODS) or not all(hasattr(probe, a) for a in _ATTRIBUTES):
        log.warning("kopf's ToggleSet is not as expected; its start-up barrier is left as it is")
        return False

    async def changed(self: Any, change: Callable[[], object]) -> None:
        """Apply ``change`` to the set's toggles; wake the waiters only if the set's state flipped."""
        async with self._condition:
            before = self.is_on()
            change()
            if self.is_on() != before:
                self._condition.notify_all()

    async def make_toggle(self: Any, __val: bool = False, *, name: str | None = None) -> Any:
        toggle = aiotoggles.Toggle(__val, name=name, condition=self._condition)
        await changed(self, lambda: self._toggles.add(toggle))
        return toggle

    async def drop_toggle(self: Any, toggle: Any) -> None:
        await changed(self, lambda: self._toggles.discard(toggle))

    async def drop_toggles(self: Any, toggles: Iterable[Any]) -> None:
        await changed(self, lambda: self._toggles.difference_update(toggles))

    cls.make_toggle, cls.drop_toggle, cls.drop_toggles = make_toggle, drop_toggle, drop_toggles
    cls._notifies_on_flips = True
    return True
