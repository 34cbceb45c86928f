"""The planner: a VerlJob spec plus the cluster's Node objects in, a valid plan or violations out (pure)."""

from __future__ import annotations

from verl_operator.planner.facts import NodeFacts, node_facts
from verl_operator.planner.job import plan_job

__all__ = ["NodeFacts", "node_facts", "plan_job"]
