"""The spec fields of verl's asynchronous trainers: ``spec.verl.trainerMode`` and ``spec.resources.rolloutGpus``.

Each gives what an override gives (the same plan), an agreeing override is accepted, a conflicting one is
refused naming both, and a field the job's mode or release cannot take is refused.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_nodes, make_spec

from verl_operator.api.plan import PlanResult
from verl_operator.planner import plan_job

FA09 = "verl.experimental.fully_async_policy.fully_async_main"
OSO09 = "verl.experimental.one_step_off_policy.main_ppo"
OSO06 = "recipe.one_step_off_policy.main_ppo"


def plan(
    overrides: list[str] | None = None,
    gpus: int = 16,
    *,
    mode: str | None = None,
    rollout_gpus: int | None = None,
    entrypoint: str = "verl.trainer.main_ppo",
    version: str = "0.9",
    nodes: int = 4,
    **resources: Any,
) -> PlanResult:
    verl: dict[str, Any] = {"image": "example.com/verl:0.9.1", "version": version, "entrypoint": entrypoint}
    if mode is not None:
        verl["trainerMode"] = mode
    if rollout_gpus is not None:
        resources["rolloutGpus"] = rollout_gpus
    spec = make_spec(
        gpus,
        verl=verl,
        algorithm="grpo",
        data={"maxPromptLength": 512, "maxResponseLength": 1024, "trainBatchSize": 256},
        resources=resources,
        overrides=list(overrides or []),
    )
    return plan_job(spec, make_nodes(nodes, 8))


def pools(result: PlanResult) -> tuple[str, int, int, str]:
    assert result.plan is not None, [v.one_line() for v in result.violations]
    p = result.plan.pools
    assert p is not None and p.rollout is not None
    return p.mode, p.trainer.gpus, p.rollout.gpus, p.split


def only(result: PlanResult) -> Any:
    assert not result.feasible
    assert len(result.violations) == 1, [v.one_line() for v in result.violations]
    return result.violations[0]


def test_the_spec_fields_plan_as_the_overrides_do() -> None:
    by_fields = plan(mode="separate_async", rollout_gpus=8)
    by_keys = plan(
        ["trainer.v1.trainer_mode=separate_async", "trainer.nnodes=1", "actor_rollout_ref.rollout.nnodes=1"]
    )
    assert pools(by_fields) == pools(by_keys) == ("separate_async", 8, 8, "pinned")
    assert by_fields.plan is not None and by_keys.plan is not None
    emitted = by_fields.plan.overrides
    assert emitted.count("trainer.v1.trainer_mode=separate_async") == 1
    assert "actor_rollout_ref.rollout.nnodes=1" in emitted
    assert by_fields.plan.nnodes == by_keys.plan.nnodes == 2


def test_an_agreeing_override_is_accepted_and_not_repeated() -> None:
    result = plan(["trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.nnodes=1"],
                  mode="separate_async", rollout_gpus=8)  # fmt: skip
    assert pools(result)[:3] == ("separate_async", 8, 8)
    assert result.plan is not None
    assert sum(o.startswith("trainer.v1.trainer_mode=") for o in result.plan.overrides) == 1


def test_colocate_async_from_the_spec_is_one_pool_and_emitted() -> None:
    result = plan(mode="colocate_async", gpus=8)
    assert result.plan is not None and result.plan.pools is not None
    assert (result.plan.pools.mode, result.plan.pools.rollout) == ("colocate_async", None)
    assert result.plan.overrides[0] == "trainer.v1.trainer_mode=colocate_async"


def test_a_conflicting_mode_override_is_refused_naming_both() -> None:
    v = only(plan(["trainer.v1.trainer_mode=colocate_async"], mode="separate_async", rollout_gpus=8))
    assert (v.field, v.rule) == ("spec.verl.trainerMode", "override-conflict")
    assert "'separate_async'" in v.message and "spec.overrides[0] (trainer.v1.trainer_mode)" in v.message
    assert "'colocate_async'" in v.message


def test_the_legacy_trainer_override_conflicts_with_a_v1_mode() -> None:
    v = only(plan(["trainer.use_v1=False"], mode="colocate_async", gpus=8))
    assert (v.field, v.rule) == ("spec.verl.trainerMode", "override-conflict")
    assert "trainer.use_v1" in v.message


def test_verl_06_has_no_v1_mode() -> None:
    v = only(plan(mode="separate_async", rollout_gpus=8, version="0.6"))
    assert (v.field, v.rule) == ("spec.verl.trainerMode", "trainer-mode")
    assert "verl 0.6 has no v1 trainer" in v.message


def test_a_recipe_entry_point_takes_no_v1_mode() -> None:
    v = only(plan(mode="separate_async", rollout_gpus=8, entrypoint=FA09))
    assert (v.field, v.rule) == ("spec.verl.trainerMode", "override-conflict")
    assert FA09 in v.message and "fully_async" in v.message


@pytest.mark.parametrize(
    ("entrypoint", "version", "key"),
    [
        pytest.param(FA09, "0.9", "rollout.nnodes=1", id="fully-async-09"),
        pytest.param(OSO09, "0.9", "rollout.nnodes=1", id="one-step-off-09"),
    ],
)
def test_rollout_gpus_sizes_a_recipe_pool(entrypoint: str, version: str, key: str) -> None:
    overrides = ["data.train_batch_size=0"] if entrypoint == FA09 else []
    result = plan(overrides, rollout_gpus=8, entrypoint=entrypoint, version=version)
    assert pools(result)[1:] == (8, 8, "pinned")
    assert result.plan is not None and key in result.plan.overrides


def test_one_node_holds_both_pools() -> None:
    result = plan(gpus=8, rollout_gpus=2, entrypoint=OSO09, nodes=1, gpusPerNode=8)
    assert not result.feasible  # 6 trainer GPUs cannot split 256 x 5 trajectories: the split is the spec's
    assert result.violations[0].message.endswith("not divisible by 6 GPUs")
    result = plan(gpus=8, rollout_gpus=4, entrypoint=OSO09, nodes=1)
    assert pools(result)[1:3] == (4, 4)
    assert result.plan is not None and result.plan.pools is not None
    assert (result.plan.pools.shared_nodes, result.plan.nnodes, result.plan.gpus_per_node) == (True, 1, 8)


def test_a_conflicting_pool_key_is_refused_naming_both() -> None:
    v = only(plan(["actor_rollout_ref.rollout.nnodes=2"], mode="separate_async", rollout_gpus=8))
    assert (v.field, v.rule) == ("spec.resources.rolloutGpus", "override-conflict")
    assert "spec.resources.rolloutGpus = 8 makes actor_rollout_ref.rollout.nnodes 1" in v.message
    assert "spec.overrides[0] (actor_rollout_ref.rollout.nnodes) = 2" in v.message
    assert "or set spec.resources.rolloutGpus: 16" not in v.suggestions  # 16 leaves no trainer GPU
    v = only(plan(["trainer.nnodes=2"], gpus=32, mode="separate_async", rollout_gpus=8))
    assert "makes trainer.nnodes 3" in v.message and "spec.overrides[0] (trainer.nnodes) = 2" in v.message
    assert v.suggestions == [
        "drop spec.overrides[0] (trainer.nnodes)",
        "or set spec.resources.rolloutGpus: 16",
    ]


def test_rollout_gpus_must_leave_trainer_gpus() -> None:
    v = only(plan(mode="separate_async", rollout_gpus=16))
    assert (v.field, v.rule) == ("spec.resources.rolloutGpus", "pools-agree")
    assert "16 - 16 = 0 GPUs for the trainer pool" in v.message


def test_rollout_gpus_are_whole_nodes_or_one_node() -> None:
    v = only(plan(mode="separate_async", rollout_gpus=4, gpus=24))
    assert (v.field, v.rule) == ("spec.resources.rolloutGpus", "pools-agree")
    assert "not whole nodes of 8 and 8 GPUs" in v.message
    assert v.suggestions == ["set spec.resources.rolloutGpus: 8"]


def test_a_one_pool_mode_takes_no_rollout_gpus() -> None:
    v = only(plan(rollout_gpus=8))
    assert (v.field, v.rule) == ("spec.resources.rolloutGpus", "pool-size")
    assert "set spec.verl.trainerMode: separate_async" in v.suggestions
    v = only(plan(rollout_gpus=8, version="0.6"))
    assert any("recipe.fully_async_policy" in s for s in v.suggestions)


def test_the_crd_carries_both_fields() -> None:
    from verl_operator.crdgen import build_crd

    props = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]
    mode = props["verl"]["properties"]["trainerMode"]
    assert mode["enum"] == ["sync", "colocate_async", "separate_async"]
    assert "trainer.v1.trainer_mode" in mode["description"]
    rollout = props["resources"]["properties"]["rolloutGpus"]
    assert (rollout["type"], rollout["minimum"]) == ("integer", 1)
