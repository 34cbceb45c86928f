"""A bounded fuzz sample of admission (the long run is ``bench/fuzz_admission.py``).

Specs drawn from the generated CRD schema and verl's override grammar go through the webhook's check and the
planner: never an unexpected error (the catch-all denial), every problem names a field, every plan stays
inside the step budget, and every accepted plan keeps the mesh and batch arithmetic verl needs. Specs whose
overrides set the planner's keys through their parents (dict values), delete parents or carry typo keys are
admitted only with a command line on which no user override writes or deletes a key the planner sets.
"""

from __future__ import annotations

from typing import Any

from conftest import make_nodes
from hostile_specs import dict_specs, hostile_specs
from hypothesis import HealthCheck, given, settings
from pydantic import ValidationError

from verl_operator.api.spec import VerlJobSpec
from verl_operator.controller.webhook import admission_problems
from verl_operator.planner import plan_job
from verl_operator.planner.budget import Budget
from verl_operator.planner.dialect import INPUT_KEYS
from verl_operator.planner.overrides import parse_override

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
    # verl checks mini <= train batch without dynamic batch size only (with it: one padded mini-batch, a warning).
    assert mini >= 1 and (b["dynamicBatchSize"] or tb >= mini) and (mini * n) % dp == 0
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


def touches_owned(raw: str) -> list[str]:
    """The planner's keys that override ``raw`` writes, deletes, or reaches inside, as Hydra applies it (a
    dict is merged: only its leaves are written; an empty one writes nothing)."""
    ov = parse_override(raw)
    written = [(ov.key, None)] if ov.prefix == "~" else ov.leaves()
    return sorted(
        owned
        for owned in INPUT_KEYS
        for key, value in written
        if key == owned
        or key.startswith(owned + ".")
        or (owned.startswith(key + ".") and (ov.prefix == "~" or value != {}))
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dict_specs())
def test_admitted_overrides_never_undo_the_plan(spec: dict[str, Any]) -> None:
    frozen = iter(range(10**9))
    problems = admission_problems(spec, None, NODES, clock=lambda: next(frozen) * 0.0)
    assert not [p for p in problems if UNEXPECTED in p], problems
    if problems:
        return
    result = plan_job(VerlJobSpec.model_validate(spec), NODES)
    assert result.plan is not None
    emitted = [o for o in result.plan.overrides if parse_override(o).key in INPUT_KEYS]
    assert result.plan.overrides[: len(emitted)] == emitted, "the planner's keys come first, once each"
    users = result.plan.overrides[len(emitted) :]
    assert not {raw: keys for raw in users if (keys := touches_owned(raw))}
