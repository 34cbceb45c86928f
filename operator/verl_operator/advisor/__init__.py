"""The advisor: a run's measured step phases in, the bottleneck and the next single changes out (pure).

It sits beside the planner and uses it: every change it proposes is re-planned before it is shown.
"""

from __future__ import annotations

from verl_operator.advisor.advise import Advice, AsyncSplit, Report, advise
from verl_operator.advisor.phases import GENERATION_TARGET, NoStepsError, RunPhases, analyse

__all__ = [
    "GENERATION_TARGET",
    "Advice",
    "AsyncSplit",
    "NoStepsError",
    "Report",
    "RunPhases",
    "advise",
    "analyse",
]
