"""The planner: a VerlJob spec plus the cluster's Node objects in, a valid plan or violations out (pure)."""

from __future__ import annotations

from verl_operator.planner.facts import NodeFacts, node_facts
from verl_operator.planner.job import plan_job
from verl_operator.planner.result import Plan, PlanResult, Violation

__all__ = ["NodeFacts", "Plan", "PlanResult", "Violation", "node_facts", "plan_job"]
