"""Plans the admission fuzz campaign accepts pass verl's own checks (the fuzz sample of the unit tier and
``bench/fuzz_admission.py`` draw from the same strategies: ``tests/unit/hostile_specs.py``).

Specs drawn from the CRD schema and verl's override grammar that the webhook admits (schema, policy, planner)
are composed with verl's own config code for their release, as the seeded sample of
``test_fidelity_planner.py`` is; only catalog models are kept (a drawn shape has no model folder to load).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, seed, settings
from plan_sample import RELEASE, model_shape
from verl_client import CheckRequest, VerlRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from hostile_specs import hostile_specs

#: Drawn specs (about 5% are admitted with a catalog model).
DRAWS = 600
#: Fewest admitted plans for the check to count (guards against a vacuous pass).
MIN_PLANS = 10


def node(name: str, gpus: int, product: str, memory_mib: int) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": str(memory_mib)}
    allocatable = {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": str(gpus)}
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "status": {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": "True"}]},
    }


#: The nodes of the unit-tier sample and the benchmark: 2 x 8 H100 and 2 x 4 L40S.
NODES = [node(f"gpu-{i}", 8, "NVIDIA-H100-80GB-HBM3", 81559) for i in range(2)] + [
    node(f"l40s-{i}", 4, "NVIDIA-L40S", 46068) for i in range(2)
]


@pytest.fixture(scope="module")
def fuzz_plans() -> dict[str, list[tuple[dict[str, Any], Any, Any]]]:
    from verl_operator.controller.webhook import check_admission
    from verl_operator.planner import catalog

    out: dict[str, list[tuple[dict[str, Any], Any, Any]]] = {release: [] for release in RELEASE.values()}

    @seed(20261201)
    @settings(max_examples=DRAWS, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(hostile_specs())
    def collect(spec: dict[str, Any]) -> None:
        checked = check_admission(spec, None, NODES)
        if checked.problems or checked.spec is None or checked.plan is None:
            return
        parsed: Any = checked.spec
        if parsed.model.shape is not None or catalog.lookup(parsed.model.path) is None:
            return
        out[RELEASE[parsed.verl.version]].append((spec, parsed, checked.plan))

    collect()
    return out


@pytest.mark.parametrize("release", sorted(RELEASE.values()))
def test_admitted_fuzz_plans_pass_verl(
    fuzz_plans: dict[str, list[tuple[dict[str, Any], Any, Any]]],
    verl_runners: dict[str, VerlRunner],
    release: str,
) -> None:
    plans = fuzz_plans[release]
    total = sum(len(p) for p in fuzz_plans.values())
    assert total >= MIN_PLANS, f"only {total} admitted fuzz plans"
    requests = [
        CheckRequest(f"fuzz-{i}", tuple(plan["overrides"]), (), model_shape(spec), verify_compose=False)
        for i, (_, spec, plan) in enumerate(plans)
    ]
    results = verl_runners[release].check(requests) if requests else []
    failures = [
        {"spec": raw, "overrides": plan["overrides"], "verl_error": f"{r.error_type}: {r.error}"}
        for (raw, _, plan), r in zip(plans, results, strict=True)
        if not r.ok
    ]
    assert not failures, (
        f"{len(failures)} of {len(plans)} admitted fuzz plans fail verl {release}:\n"
        + "\n".join(json.dumps(f, indent=1)[:2000] for f in failures)
    )
