"""Every plan the planner accepts passes verl's own checks for its version.

A seeded sample of specs x simulated node sets (``plan_sample.py``) goes through ``plan_job``; each
feasible plan's override list is composed with verl's own Hydra config and checked by verl's own code
(``verl_runner.py``) in the environment of its release, on a weight-less model folder of the plan's model
shape. A failure here is a planner bug: the message lists every failing case with its spec, overrides and
verl's error.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from plan_sample import Draw, sample
from verl_client import CheckRequest, check_batch
from verl_envs import VerlEnv

planner = pytest.importorskip("verl_operator.planner", reason="verl_operator.planner cannot be imported")
catalog = pytest.importorskip(
    "verl_operator.planner.catalog", reason="the planner's model catalog is missing"
)

from verl_operator.api.spec import VerlJobSpec  # noqa: E402

SAMPLE_SIZE = 400  # draws; about 60% are feasible, so a few hundred plans over both versions
#: The verl release each VerlJob version line is checked against.
RELEASE = {"0.6": "0.6.1", "0.9": "0.9.1"}
#: Fewest feasible plans per version for the sample to count as broad (guards against a vacuous pass).
MIN_FEASIBLE = 60
#: Every n-th plan is also composed by Hydra's full ``compose`` and compared with the runner's shortcut.
VERIFY_EVERY = 8


def _shape(spec: VerlJobSpec) -> dict[str, Any]:
    if spec.model.shape is not None:
        return spec.model.shape.to_wire()
    entry = catalog.lookup(spec.model.path)
    assert entry is not None, f"the sample uses {spec.model.path}, which is not in the catalog"
    return entry.shape.to_wire()


@pytest.fixture(scope="module")
def planned() -> dict[str, list[tuple[Draw, VerlJobSpec, list[str]]]]:
    """The feasible plans of the sample, grouped by verl release."""
    out: dict[str, list[tuple[Draw, VerlJobSpec, list[str]]]] = {release: [] for release in RELEASE.values()}
    for item in sample(SAMPLE_SIZE):
        spec = VerlJobSpec.model_validate(item.spec)
        result = planner.plan_job(spec, item.nodes)
        if result.feasible:
            assert result.plan is not None
            out[RELEASE[spec.verl.version]].append((item, spec, list(result.plan.overrides)))
    return out


@pytest.mark.parametrize("release", sorted(RELEASE.values()))
def test_sample_is_broad(planned: dict[str, list[tuple[Draw, VerlJobSpec, list[str]]]], release: str) -> None:
    plans = planned[release]
    assert len(plans) >= MIN_FEASIBLE, f"only {len(plans)} feasible plans for verl {release}"
    # The sample must cover the layouts verl's checks depend on, not one repeated shape.
    nnodes = [int(_override(overrides, "trainer.nnodes")) for _, _, overrides in plans]
    worlds = {
        n * int(_override(o, "trainer.n_gpus_per_node")) for n, (_, _, o) in zip(nnodes, plans, strict=True)
    }
    assert len(worlds) >= 4, worlds
    assert max(nnodes) > 1, "no multi-node plan in the sample"


def _override(overrides: list[str], key: str) -> str:
    values = [item.split("=", 1)[1] for item in overrides if item.split("=", 1)[0].lstrip("+") == key]
    assert values, f"{key} missing from {overrides}"
    return values[-1]


@pytest.mark.parametrize("release", sorted(RELEASE.values()))
def test_every_accepted_plan_passes_verl(
    planned: dict[str, list[tuple[Draw, VerlJobSpec, list[str]]]],
    verl_envs: dict[str, VerlEnv],
    release: str,
) -> None:
    plans = planned[release]
    requests = [
        CheckRequest(item.label, tuple(overrides), (), _shape(spec), verify_compose=index % VERIFY_EVERY == 0)
        for index, (item, spec, overrides) in enumerate(plans)
    ]
    results = check_batch(verl_envs[release], requests)
    failures = [
        {
            "case": item.label,
            "spec": item.spec,
            "nodes": f"{len(item.nodes)} x {item.nodes[0]['status']['allocatable']['nvidia.com/gpu']} "
            f"{item.nodes[0]['metadata']['labels']['nvidia.com/gpu.product']}",
            "overrides": overrides,
            "stage": result.stage,
            "verl_error": f"{result.error_type}: {result.error}",
        }
        for (item, _, overrides), result in zip(plans, results, strict=True)
        if not result.ok
    ]
    assert not failures, (
        f"{len(failures)} of {len(plans)} accepted plans fail verl {release}'s own checks:\n"
        + "\n".join(json.dumps(failure, indent=1) for failure in failures)
    )
