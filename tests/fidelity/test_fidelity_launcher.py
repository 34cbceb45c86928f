"""The command the launcher starts verl with is accepted by verl's own parser and checks, both dialects.

The whole chain of the product runs on the sample's accepted plans: the planner's plan, the operator's
``launch.json`` (``build_launch_spec``), the launcher's parse of it (``parse_launch_spec``) and its argv
(``verl_launcher.verl.build_argv``), with and without a checkpoint directory, on a first attempt and on
a restart. Each argv goes to verl's environment whole: Hydra's own command-line parser (the one
``@hydra.main`` runs on ``sys.argv``) splits it, then the same checks as the planner test run.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from plan_sample import RELEASE, Draw, model_shape
from verl_client import MAIN_PPO_ARGV, CheckRequest, VerlRunner

launcher_verl = pytest.importorskip("verl_launcher.verl", reason="verl_launcher.verl cannot be imported")
launcher_spec = pytest.importorskip("verl_launcher.spec", reason="verl_launcher.spec cannot be imported")
launchspec = pytest.importorskip(
    "verl_operator.manifests.launchspec", reason="verl_operator.manifests.launchspec cannot be imported"
)

EVERY = 4  # a quarter of the accepted plans: the argv only adds the launcher's own overrides to them


def launch_argv(index: int, spec: Any, plan: Any) -> list[str]:
    """The argv the launcher builds for ``plan``; the index varies checkpointing and the attempt."""
    from verl_operator.api.spec import CheckpointSpec

    if index % 3 != 2:  # two in three jobs keep checkpoints on a volume
        checkpoint = CheckpointSpec(dir=f"/checkpoints/job-{index}", resume=(index // 2) % 2 == 0)
        spec = spec.model_copy(update={"checkpoint": checkpoint})
    job = {"metadata": {"name": f"job-{index}", "namespace": "team-a", "uid": f"uid-{index}"}}
    launch_plan = launchspec.LaunchPlan.from_plan_json(plan.model_dump(mode="json", by_alias=True), spec)
    document = json.loads(launchspec.build_launch_spec(job, spec, launch_plan).to_json())
    parsed = launcher_spec.parse_launch_spec(document, source=f"job-{index}/launch.json")
    return list(launcher_verl.build_argv(parsed, attempt=index % 2))


@pytest.mark.parametrize("release", sorted(RELEASE.values()))
def test_launcher_argv_passes_verl(
    accepted_plans: dict[str, list[tuple[Draw, Any, Any]]], verl_runners: dict[str, VerlRunner], release: str
) -> None:
    chosen = accepted_plans[release][::EVERY]
    assert len(chosen) >= 10, f"only {len(chosen)} plans to build argvs from"
    argvs = [launch_argv(index, spec, result.plan) for index, (_, spec, result) in enumerate(chosen)]
    assert all(tuple(argv[:3]) == MAIN_PPO_ARGV for argv in argvs), argvs[0]
    requests = [
        CheckRequest(f"{item.label}-argv", argv=tuple(argv), model_shape=model_shape(spec))
        for (item, spec, _), argv in zip(chosen, argvs, strict=True)
    ]
    results = verl_runners[release].check(requests)
    failures = [
        {
            "case": result.id,
            "argv": argv,
            "stage": result.stage,
            "verl_error": f"{result.error_type}: {result.error}",
        }
        for argv, result in zip(argvs, results, strict=True)
        if not result.ok
    ]
    assert not failures, f"{len(failures)} of {len(argvs)} launcher argvs fail verl {release}:\n" + "\n".join(
        json.dumps(failure, indent=1) for failure in failures
    )
