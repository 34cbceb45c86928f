"""Every plan the planner accepts passes verl's own checks for its version.

A seeded sample of specs x simulated node sets (``plan_sample.py``) goes through ``plan_job``
(``accepted_plans`` in conftest); each feasible plan's override list is composed with verl's own Hydra
config and checked by verl's own code (``verl_runner.py``) in the environment of its release, on a
weight-less model folder of the plan's model shape. A failure here is a planner bug: the message lists every
failing case with its spec, nodes, overrides and verl's error.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from plan_sample import RELEASE, Draw, model_shape
from verl_client import CheckRequest, VerlRunner

#: Fewest feasible plans per version for the sample to count as broad (guards against a vacuous pass).
MIN_FEASIBLE = 60
#: Every n-th plan is also composed by Hydra's full ``compose`` and compared with the runner's shortcut.
VERIFY_EVERY = 8

Plans = dict[str, list[tuple[Draw, Any, Any]]]


def _override(overrides: list[str], key: str) -> str:
    values = [item.split("=", 1)[1] for item in overrides if item.split("=", 1)[0].lstrip("+") == key]
    assert values, f"{key} missing from {overrides}"
    return values[-1]


@pytest.mark.parametrize("release", sorted(RELEASE.values()))
def test_sample_is_broad(accepted_plans: Plans, release: str) -> None:
    plans = accepted_plans[release]
    assert len(plans) >= MIN_FEASIBLE, f"only {len(plans)} feasible plans for verl {release}"
    # The sample must cover the layouts verl's checks depend on, not one repeated shape.
    overrides = [result.plan.overrides for _, _, result in plans]
    nnodes = [int(_override(o, "trainer.nnodes")) for o in overrides]
    worlds = {
        n * int(_override(o, "trainer.n_gpus_per_node")) for n, o in zip(nnodes, overrides, strict=True)
    }
    assert len(worlds) >= 4, worlds
    assert max(nnodes) > 1, "no multi-node plan in the sample"
    layouts = [result.plan for _, _, result in plans]
    assert any(plan.sequence_parallel_size > 1 for plan in layouts), "no Ulysses SP plan"
    assert any(plan.rollout.tensor_parallel_size > 1 for plan in layouts), "no rollout TP > 1 plan"
    assert any(plan.batching.dynamic_batch_size for plan in layouts), "no dynamic batch size plan"
    assert any(spec.algorithm.needs_critic for _, spec, _ in plans), "no plan with a critic"


@pytest.mark.parametrize("release", sorted(RELEASE.values()))
def test_every_accepted_plan_passes_verl(
    accepted_plans: Plans, verl_runners: dict[str, VerlRunner], release: str
) -> None:
    plans = accepted_plans[release]
    requests = [
        CheckRequest(
            item.label,
            tuple(result.plan.overrides),
            (),
            model_shape(spec),
            verify_compose=index % VERIFY_EVERY == 0,
        )
        for index, (item, spec, result) in enumerate(plans)
    ]
    results = verl_runners[release].check(requests)
    failures = [
        {
            "case": item.label,
            "spec": item.spec,
            "nodes": f"{len(item.nodes)} x {item.nodes[0]['status']['allocatable']['nvidia.com/gpu']} "
            f"{item.nodes[0]['metadata']['labels']['nvidia.com/gpu.product']}",
            "overrides": plan_result.plan.overrides,
            "stage": result.stage,
            "verl_error": f"{result.error_type}: {result.error}",
        }
        for (item, _, plan_result), result in zip(plans, results, strict=True)
        if not result.ok
    ]
    assert not failures, (
        f"{len(failures)} of {len(plans)} accepted plans fail verl {release}'s own checks:\n"
        + "\n".join(json.dumps(failure, indent=1) for failure in failures)
    )


def _break_batch(overrides: list[str]) -> list[str] | None:
    """The plan with ``data.train_batch_size`` moved to the next size that ``B % W`` rejects, or None."""
    if _override(overrides, "actor_rollout_ref.actor.use_dynamic_bsz") == "True":
        return None  # verl skips the batch check with dynamic batch size
    world = int(_override(overrides, "trainer.nnodes")) * int(_override(overrides, "trainer.n_gpus_per_node"))
    if world == 1:
        return None
    n = int(_override(overrides, "actor_rollout_ref.rollout.n"))
    if n % world == 0:
        return None  # every batch size gives a multiple of the world
    batch = int(_override(overrides, "data.train_batch_size")) + 1
    while (batch * n) % world == 0:
        batch += 1
    return [o for o in overrides if not o.startswith("data.train_batch_size=")] + [
        f"data.train_batch_size={batch}"
    ]


@pytest.mark.parametrize("release", sorted(RELEASE.values()))
def test_a_broken_plan_is_caught(
    accepted_plans: Plans, verl_runners: dict[str, VerlRunner], release: str
) -> None:
    """The same path rejects accepted plans whose batch was made indivisible: the test above can fail."""
    broken = [
        (item, spec, changed)
        for item, spec, result in accepted_plans[release][::5]
        if (changed := _break_batch(list(result.plan.overrides))) is not None
    ][:12]
    assert len(broken) >= 5, "too few plans to break"
    requests = [
        CheckRequest(item.label, tuple(changed), (), model_shape(spec)) for item, spec, changed in broken
    ]
    results = verl_runners[release].check(requests)
    assert [(r.ok, r.stage) for r in results] == [(False, "validate_config")] * len(results), results
    assert all("real_train_batch_size" in (r.error or "") for r in results), results
