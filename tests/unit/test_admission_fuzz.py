"""A bounded fuzz sample of admission (the long run is ``bench/fuzz_admission.py``).

Specs drawn from the generated CRD schema and verl's override grammar go through the webhook's check and the
planner: never an unexpected error (the catch-all denial), every problem names a field, every plan stays
inside the step budget, and every accepted plan keeps the mesh and batch arithmetic verl needs.
"""

from __future__ import annotations

from typing import Any

from conftest import make_nodes
from hostile_specs import hostile_specs
from hypothesis import HealthCheck, given, settings
from pydantic import ValidationError

from verl_operator.api.spec import VerlJobSpec
from verl_operator.controller.webhook import admission_problems
from verl_operator.planner import plan_job
from verl_operator.planner.budget import Budget

NODES = make_nodes(2, gpus=8) + make_nodes(2, gpus=4, prefix="l40s", product="NVIDIA-L40S", memory_mib=46068)
UNEXPECTED = "the operator could not check this spec"


def check_plan(plan: dict[str, Any]) -> None:
    """What any accepted plan must hold, whatever the spec pinned."""
    w, sp = plan["worldSize"], plan["sequenceParallelSize"]
    tp, b = plan["rollout"]["tensorParallelSize"], plan["batching"]
    dp = plan["dataParallelSize"]
    assert w == plan["nnodes"] * plan["gpusPerNode"] and dp * sp == w
    assert w % tp == 0 and plan["rollout"]["replicas"] * tp == w
    tb, n, mini = b["trainBatchSize"], b["rolloutN"], b["ppoMiniBatchSize"]
    assert tb >= mini >= 1 and (mini * n) % dp == 0
    if not b["dynamicBatchSize"]:
        assert (tb * n) % w == 0 and (mini * n // dp) % b["ppoMicroBatchSizePerGpu"] == 0


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_specs())
def test_admission_never_fails_unexpectedly(spec: dict[str, Any]) -> None:
    frozen = iter(range(10**9))  # a clock that never passes the deadline: the step budget alone bounds it
    problems = admission_problems(spec, None, NODES, clock=lambda: next(frozen) * 0.0)
    assert all(p.startswith("spec") for p in problems), problems
    assert not [p for p in problems if UNEXPECTED in p], problems
    try:
        parsed = VerlJobSpec.model_validate(spec)
    except ValidationError:
        return
    budget = Budget()
    result = plan_job(parsed, NODES, budget=budget)
    assert budget.used <= budget.steps
    assert all(v.rule != "plan-too-large" for v in result.violations), result.violations
    if result.feasible:
        check_plan(result.to_json_dict()["plan"])
