"""The planner's work budget: a bound on how many candidates one plan may evaluate.

Every memory-model evaluation and every candidate the search checks spends one step of the budget of the plan
in progress (a context variable, so the search functions keep their signatures). A plan that runs out is
answered with a ``plan-too-large`` violation instead of running on: admission stays fast for any input.

The budget counts steps, so a plan is deterministic. A caller with a latency bound (the webhook) may add a
deadline on a clock it passes in; the planner itself reads no clock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

#: Steps one plan may take. The largest plans of the golden tables and the benchmarks take under 3000
#: (docs/benchmarks.md); 50000 steps take about half a second.
MAX_STEPS = 50_000
#: How many steps pass between two looks at the deadline clock.
CLOCK_EVERY = 32


class PlanTooLarge(Exception):
    """The plan ran out of its budget (steps or deadline)."""

    def __init__(self, steps: int, why: str) -> None:
        super().__init__(why)
        self.steps = steps
        self.why = why


@dataclass
class Budget:
    """Steps left for one plan, and an optional deadline on a caller's clock.

    Attributes:
        steps: The most steps the plan may take.
        clock: A monotonic clock (seconds), only with ``deadline``.
        deadline: The clock reading after which the plan stops.
        used: Steps taken so far.
    """

    steps: int = MAX_STEPS
    clock: Callable[[], float] | None = None
    deadline: float | None = None
    used: int = 0

    def spend(self, n: int = 1) -> None:
        """Take ``n`` steps.

        Raises:
            PlanTooLarge: the steps or the time ran out.
        """
        before = self.used
        self.used += n
        if self.used > self.steps:
            raise PlanTooLarge(self.used, f"it needs more than {self.steps} search steps")
        if (
            self.clock is not None
            and self.deadline is not None
            and before // CLOCK_EVERY != self.used // CLOCK_EVERY
            and self.clock() > self.deadline
        ):
            raise PlanTooLarge(self.used, f"it did not finish in time ({self.used} search steps)")


_CURRENT: ContextVar[Budget | None] = ContextVar("verl_operator_plan_budget", default=None)


@contextlib.contextmanager
def limited(budget: Budget) -> Iterator[Budget]:
    """Make ``budget`` the budget of the plan computed inside the ``with`` block."""
    token = _CURRENT.set(budget)
    try:
        yield budget
    finally:
        _CURRENT.reset(token)


def spend(n: int = 1) -> None:
    """Take ``n`` steps of the current plan's budget (nothing outside :func:`limited`).

    Raises:
        PlanTooLarge: the budget ran out.
    """
    budget = _CURRENT.get()
    if budget is not None:
        budget.spend(n)
