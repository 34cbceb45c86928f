"""The planner's output values (defined in :mod:`verl_operator.api.plan`, part of the API) and their helpers."""

from __future__ import annotations

from verl_operator.api.plan import (
    BatchingPlan,
    MemoryPhase,
    MemoryPlan,
    NodePoolPlan,
    PaddingPlan,
    Plan,
    PlanResult,
    RolloutPlan,
    Violation,
)

__all__ = [
    "BatchingPlan",
    "MemoryPhase",
    "MemoryPlan",
    "NodePoolPlan",
    "PaddingPlan",
    "Plan",
    "PlanResult",
    "RolloutPlan",
    "Violation",
    "infeasible",
]


def infeasible(violations: list[Violation], warnings: list[str] | None = None) -> PlanResult:
    """A result without a plan."""
    return PlanResult(feasible=False, violations=violations, warnings=list(warnings or []), plan=None)
