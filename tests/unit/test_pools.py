"""verl's trainer modes: the mode read from the entry point and the keys, the two pools, the mode's rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import make_nodes, make_spec

from verl_operator.api.plan import PlanResult
from verl_operator.planner import plan_job

SEP = ["trainer.use_v1=True", "trainer.v1.trainer_mode=separate_async"]
FA09 = "verl.experimental.fully_async_policy.fully_async_main"
OSO09 = "verl.experimental.one_step_off_policy.main_ppo"
FA06 = "recipe.fully_async_policy.fully_async_main"
OSO06 = "recipe.one_step_off_policy.main_ppo"


def plan(
    overrides: list[str],
    gpus: int = 16,
    entrypoint: str = "verl.trainer.main_ppo",
    version: str = "0.9",
    nodes: int = 4,
    node_gpus: int = 8,
    **sections: Any,
) -> PlanResult:
    spec = make_spec(
        gpus,
        verl={"image": "example.com/verl:0.9.1", "version": version, "entrypoint": entrypoint},
        algorithm="grpo",
        data={"maxPromptLength": 512, "maxResponseLength": 1024, **sections.pop("data", {})},
        overrides=overrides,
        **sections,
    )
    return plan_job(spec, make_nodes(nodes, node_gpus))


@pytest.mark.parametrize(
    ("overrides", "entrypoint", "version", "want"),
    [
        pytest.param([], "verl.trainer.main_ppo", "0.9", None, id="09-default-sync-no-pools"),
        pytest.param(
            ["trainer.v1.trainer_mode=colocate_async"],
            "verl.trainer.main_ppo",
            "0.9",
            ("colocate_async", None),
            id="09-colocate-async-one-pool",
        ),
        pytest.param(
            ["trainer.use_v1=False", "trainer.v1.trainer_mode=separate_async", "trainer.nnodes=2"],
            "verl.trainer.main_ppo",
            "0.9",
            None,
            id="09-legacy-ignores-mode",
        ),
        pytest.param(
            [*SEP, "trainer.nnodes=1", "actor_rollout_ref.rollout.nnodes=1"],
            "verl.trainer.main_ppo",
            "0.9",
            ("separate_async", 8),
            id="09-separate-async-1-1",
        ),
        pytest.param(
            ["trainer.nnodes=1", "rollout.nnodes=1", "data.train_batch_size=0"],
            FA09,
            "0.9",
            ("fully_async", 8),
            id="09-fully-async-entrypoint",
        ),
        pytest.param(
            ["trainer.nnodes=1", "rollout.nnodes=1"],
            OSO09,
            "0.9",
            ("one_step_off", 8),
            id="09-one-step-off-entrypoint",
        ),
        pytest.param(
            ["trainer.nnodes=1", "rollout.nnodes=1", "data.train_batch_size=0"],
            FA06,
            "0.6",
            ("fully_async", 8),
            id="06-fully-async-recipe",
        ),
        pytest.param(
            ["trainer.nnodes=1", "rollout.nnodes=1", "actor_rollout_ref.rollout.mode=async"],
            OSO06,
            "0.6",
            ("one_step_off", 8),
            id="06-one-step-off-recipe",
        ),
    ],
)
def test_mode_and_pools(overrides: list[str], entrypoint: str, version: str, want: Any) -> None:
    result = plan(overrides, entrypoint=entrypoint, version=version)
    assert result.feasible, result.violations
    assert result.plan is not None
    pools = result.plan.pools
    if want is None:
        assert pools is None or pools.rollout is None
        assert result.plan.world_size == 16
        return
    mode, rollout_gpus = want
    assert pools is not None and pools.mode == mode and pools.entrypoint == entrypoint
    if rollout_gpus is None:
        assert pools.rollout is None and pools.trainer.gpus == 16
        return
    assert pools.rollout is not None
    assert (pools.trainer.gpus, pools.rollout.gpus) == (16 - rollout_gpus, rollout_gpus)
    assert pools.trainer.gpus + pools.rollout.gpus == 16
    assert result.plan.world_size == pools.trainer.gpus  # the plan's own mesh is the trainer pool's
    assert (
        pools.rollout.replicas * pools.rollout.tensor_parallel_size + pools.rollout.idle_gpus == rollout_gpus
    )


def test_separate_async_example_plans_both_pools_and_emits_their_keys() -> None:
    """The example GRPO job on 16 H100 that was refused with 'trainer.nnodes 1 x n_gpus_per_node 8 = 8 !=
    spec.resources.gpus 16'."""
    result = plan(
        [*SEP, "trainer.nnodes=1", "actor_rollout_ref.rollout.nnodes=1"], data={"trainBatchSize": 256}
    )
    assert result.feasible, result.violations
    assert result.plan is not None and result.plan.pools is not None
    pools, ov = result.plan.pools, result.plan.overrides
    assert (pools.split, pools.nodes, pools.shared_nodes) == ("pinned", 2, False)
    assert pools.invariants == {"parameterSyncStep": 4, "trainBatchSize": 256, "miniBatchSize": 64}
    for key in (
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=8",
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=8",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
        "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    ):
        assert key in ov


@pytest.mark.parametrize(
    ("overrides", "entrypoint", "version", "rule", "text"),
    [
        pytest.param(
            [*SEP, "data.train_batch_size=256", "actor_rollout_ref.actor.ppo_mini_batch_size=32"],
            "verl.trainer.main_ppo",
            "0.9",
            "separate-async-batch",
            "256 != 4 x 32 = 128",
            id="sep-tb-ne-pss-x-mini",
        ),
        pytest.param(
            [*SEP, "data.train_batch_size=250"],
            "verl.trainer.main_ppo",
            "0.9",
            "separate-async-batch",
            "250 is not a multiple of 4",
            id="sep-tb-not-multiple",
        ),
        pytest.param(
            [*SEP, "actor_rollout_ref.rollout.checkpoint_engine.backend=naive"],
            "verl.trainer.main_ppo",
            "0.9",
            "async-checkpoint-engine",
            "naive",
            id="sep-naive-engine",
        ),
        pytest.param(
            [*SEP, "reward.reward_model.enable=True"],
            "verl.trainer.main_ppo",
            "0.9",
            "async-reward-model",
            "colocated reward model",
            id="sep-colocated-rm",
        ),
        pytest.param(
            [
                *SEP,
                "trainer.v1.separate_async.hybrid_rollout.enable_switch=True",
                "actor_rollout_ref.rollout.disaggregation.enabled=True",
            ],
            "verl.trainer.main_ppo",
            "0.9",
            "async-switch-disaggregation",
            "disaggregation",
            id="sep-switch-pd",
        ),
        pytest.param(
            ["trainer.v1.trainer_mode=separate"],
            "verl.trainer.main_ppo",
            "0.9",
            "trainer-mode",
            "'separate'",
            id="bad-mode",
        ),
        pytest.param(
            [*SEP, "trainer.nnodes=1", "trainer.n_gpus_per_node=8", "actor_rollout_ref.rollout.nnodes=2"],
            "verl.trainer.main_ppo",
            "0.9",
            "pools-agree",
            "1 x n_gpus_per_node 8 = 8 + rollout pool",
            id="pools-sum-24-ne-16",
        ),
        pytest.param(
            [*SEP, "actor_rollout_ref.rollout.nnodes=0"],
            "verl.trainer.main_ppo",
            "0.9",
            "pool-size",
            "nnodes > 0",
            id="sep-rollout-0-nodes",
        ),
        pytest.param(
            ["data.train_batch_size=512"], FA09, "0.9", "fully-async-batch", "must be 0", id="fa-tb-not-zero"
        ),
        pytest.param(
            ["data.train_batch_size=0", "async_training.require_batches=0"],
            FA09,
            "0.9",
            "fully-async-batch",
            "require_batches 0",
            id="fa-require-0",
        ),
        pytest.param(
            ["data.train_batch_size=0", "reward.reward_model.enable=True"],
            FA09,
            "0.9",
            "async-reward-model",
            "fully_async",
            id="fa-colocated-rm",
        ),
        pytest.param(
            [],
            FA06,
            "0.9",
            "entrypoint-release",
            "verl.experimental.fully_async_policy",
            id="06-recipe-on-09",
        ),
        pytest.param(
            [],
            OSO09,
            "0.6",
            "entrypoint-release",
            "recipe.one_step_off_policy.main_ppo",
            id="09-module-on-06",
        ),
        # 12 trainer GPUs cannot split 512 trajectories (32 prompts x n 16) over their data-parallel ranks.
        pytest.param(
            [
                "data.train_batch_size=0",
                "trainer.nnodes=3",
                "trainer.n_gpus_per_node=4",
                "rollout.nnodes=1",
                "rollout.n_gpus_per_node=4",
                "actor_rollout_ref.rollout.n=16",
                "actor_rollout_ref.actor.ppo_mini_batch_size=32",
            ],
            FA09,
            "0.9",
            None,
            "512",
            id="fa-12-trainer-gpus-512",
        ),
        pytest.param(
            ["actor_rollout_ref.actor.megatron.grad_offload=True"],
            "verl.trainer.main_ppo",
            "0.9",
            "removed-key",
            "removed megatron.grad_offload",
            id="09-grad-offload-removed",
        ),
    ],
)
def test_refused(overrides: list[str], entrypoint: str, version: str, rule: str | None, text: str) -> None:
    result = plan(overrides, entrypoint=entrypoint, version=version)
    assert not result.feasible
    hits = [v for v in result.violations if (rule is None or v.rule == rule) and text in v.message]
    assert hits, [(v.rule, v.message) for v in result.violations]
    assert all(v.suggestions for v in hits)


def test_separate_async_suggests_the_nearest_batch_sizes() -> None:
    result = plan([*SEP, "data.train_batch_size=256", "actor_rollout_ref.actor.ppo_mini_batch_size=32"])
    (v,) = [v for v in result.violations if v.rule == "separate-async-batch"]
    assert v.field == "spec.overrides[2] (data.train_batch_size)"
    assert v.suggestions == [
        "set data.train_batch_size=128",
        "or actor_rollout_ref.actor.ppo_mini_batch_size=64",
        "or trainer.v1.separate_async.parameter_sync_step=8",
    ]


@pytest.mark.parametrize(
    ("version", "entrypoint", "feasible"),
    [
        pytest.param("0.9", OSO09, True, id="09-idle-remainder-warns"),
        pytest.param("0.6", OSO06, False, id="06-one-step-off-refuses"),
    ],
)
def test_rollout_pool_not_a_multiple_of_tp(version: str, entrypoint: str, feasible: bool) -> None:
    """A rollout pool of 6 GPUs with rollout TP 4: one replica, 2 GPUs left over (both pools on one 16-GPU
    node)."""
    result = plan(
        [
            "trainer.nnodes=1",
            "trainer.n_gpus_per_node=8",
            "rollout.nnodes=1",
            "rollout.n_gpus_per_node=6",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
            "actor_rollout_ref.rollout.mode=async",
        ],
        gpus=14,
        entrypoint=entrypoint,
        version=version,
        node_gpus=16,
    )
    assert result.feasible is feasible, result.violations
    if feasible:
        assert (
            result.plan is not None
            and result.plan.pools is not None
            and result.plan.pools.rollout is not None
        )
        assert (result.plan.pools.rollout.replicas, result.plan.pools.rollout.idle_gpus) == (1, 2)
        assert any("2 GPUs stay idle" in w for w in result.warnings)
        assert (result.plan.nnodes, result.plan.gpus_per_node, result.plan.pools.shared_nodes) == (
            1,
            14,
            True,
        )
    else:
        (v,) = [v for v in result.violations if v.rule == "rollout-pool"]
        assert "6 % 4 = 2" in v.message and "use rollout TP 3" in v.suggestions


def test_fully_async_plans_the_trainer_step_and_emits_zero_batch() -> None:
    """fully_async's trainer takes ppo_mini_batch_size x require_batches prompts per step; verl wants
    data.train_batch_size=0 and the recipe's own keys as written."""
    result = plan(
        [
            "data.train_batch_size=0",
            "trainer.nnodes=1",
            "rollout.nnodes=1",
            "actor_rollout_ref.actor.ppo_mini_batch_size=32",
            "async_training.require_batches=4",
            "async_training.staleness_threshold=0.5",
            "rollout.total_rollout_steps=51200",
        ],
        entrypoint=FA09,
    )
    assert result.feasible, result.violations
    assert result.plan is not None and result.plan.pools is not None
    assert result.plan.pools.invariants["trainerBatch"] == 128
    assert result.plan.batching.train_batch_size == 128
    ov = result.plan.overrides
    assert "data.train_batch_size=0" in ov and "data.train_batch_size=128" not in ov
    assert "async_training.staleness_threshold=0.5" in ov and "rollout.total_rollout_steps=51200" in ov
    assert "rollout.nnodes=1" in ov and "rollout.n_gpus_per_node=8" in ov


@pytest.mark.parametrize(
    ("gpus", "nodes_gpus", "want"),
    [
        pytest.param(16, 8, (1, 8, 1, 8, 2, False), id="16-on-8gpu-nodes"),
        pytest.param(8, 8, (1, 5, 1, 3, 1, True), id="one-node-shared"),
    ],
)
def test_open_split_from_the_throughput_model(gpus: int, nodes_gpus: int, want: tuple[Any, ...]) -> None:
    result = plan(SEP, gpus=gpus)
    assert result.feasible, result.violations
    assert result.plan is not None and result.plan.pools is not None
    p = result.plan.pools
    assert p.rollout is not None and p.split == "model" and p.model_rollout_fraction is not None
    got = (p.trainer.nnodes, p.trainer.gpus_per_node, p.rollout.nnodes, p.rollout.gpus_per_node, p.nodes)
    assert (*got, p.shared_nodes) == want


def test_the_same_spec_gives_the_same_pools() -> None:
    first = plan(SEP)
    second = plan(SEP)
    assert first == second


def test_both_pools_are_one_gang_of_pods() -> None:
    """The job's pods hold both pools (placement, the pods, Kueue and launch.json read plan.nnodes)."""
    result = plan([*SEP, "trainer.nnodes=1", "actor_rollout_ref.rollout.nnodes=1"])
    assert result.plan is not None
    assert (result.plan.nnodes, result.plan.gpus_per_node, len(result.plan.nodes)) == (2, 8, 2)


def test_pools_of_two_pod_sizes_are_refused() -> None:
    result = plan(
        ["trainer.nnodes=1", "trainer.n_gpus_per_node=8", "rollout.nnodes=2", "rollout.n_gpus_per_node=4"],
        entrypoint=OSO09,
    )
    (v,) = [v for v in result.violations if v.rule == "pools-layout"]
    assert "8 GPUs per node and the rollout pool's 4" in v.message
    assert v.suggestions[0] == "give both pools 8 GPUs per node"


@pytest.mark.parametrize(
    ("module", "engine", "want"),
    [
        pytest.param(
            "verl.trainer.main_ppo", "megatron", "--config-name=ppo_megatron_trainer", id="main-ppo"
        ),
        pytest.param(FA09, "megatron", "--config-name=fully_async_ppo_megatron_trainer", id="fully-async-09"),
        pytest.param(
            OSO06, "megatron", "--config-name=one_step_off_ppo_megatron_trainer", id="one-step-off-06"
        ),
        pytest.param(FA06, "fsdp", FA06, id="fsdp-default-config"),
    ],
)
def test_the_launcher_runs_the_recipe_with_its_own_megatron_config(
    module: str, engine: str, want: str
) -> None:
    from verl_operator.manifests.launchspec import entrypoint

    command = entrypoint(engine, module)
    assert command[:3] == ("python3", "-m", module)
    assert command[-1] == want


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("name", "mode", "nodes"),
    [
        pytest.param("async-colocate-qwen7b-dgx.yaml", "colocate_async", 1, id="colocate-async"),
        pytest.param("async-separate-qwen7b-dgx.yaml", "separate_async", 2, id="separate-async"),
        pytest.param("async-fully-qwen7b-dgx.yaml", "fully_async", 2, id="fully-async"),
        pytest.param("async-one-step-off-qwen7b-dgx.yaml", "one_step_off", 2, id="one-step-off"),
    ],
)
def test_every_mode_example_plans_on_its_cluster(name: str, mode: str, nodes: int) -> None:
    from verl_operator.commands.plan import load_nodes, plan_files

    result = plan_files(
        str(EXAMPLES / "jobs" / name), load_nodes(str(EXAMPLES / "clusters" / "dgx-h100.yaml"))
    )
    assert result.feasible, result.violations
    assert result.plan is not None and result.plan.pools is not None
    assert (result.plan.pools.mode, result.plan.pools.nodes, result.plan.nnodes) == (mode, nodes, nodes)


def test_the_example_jobs_of_every_mode_ship() -> None:
    names = {p.name for p in (EXAMPLES / "jobs").glob("async-*.yaml")}
    params = test_every_mode_example_plans_on_its_cluster.pytestmark[0].args[1]  # type: ignore[attr-defined]
    assert names == {p.values[0] for p in params}


@pytest.mark.parametrize(
    ("name", "pods", "gpus"),
    [
        pytest.param("async-separate-qwen7b-dgx.yaml", 2, 8, id="separate-async-two-nodes"),
        pytest.param("async-one-step-off-qwen7b-dgx.yaml", 2, 8, id="one-step-off-shared-nodes"),
    ],
)
def test_both_pools_render_as_one_gang(name: str, pods: int, gpus: int) -> None:
    """The pods hold both pools' GPUs; launch.json asks for all the nodes and carries both pools' keys."""
    import json

    import yaml

    from verl_operator.commands.plan import load_nodes
    from verl_operator.commands.render import render

    job = yaml.safe_load((EXAMPLES / "jobs" / name).read_text())
    children = render(job, load_nodes(str(EXAMPLES / "clusters" / "dgx-h100.yaml")))
    ray_pods = [c for c in children if c["kind"] == "Pod"]
    assert len(ray_pods) == pods
    for pod in ray_pods:
        (limits,) = [
            c["resources"]["limits"]
            for c in pod["spec"]["containers"]
            if "nvidia.com/gpu" in c["resources"].get("limits", {})
        ]
        assert limits["nvidia.com/gpu"] == str(gpus)
    (config,) = [c for c in children if c["kind"] == "ConfigMap"]
    launch = json.loads(next(iter(config["data"].values())))
    assert launch["nnodes"] == pods
    assert launch["entrypoint"][2] == job["spec"]["verl"].get("entrypoint", "verl.trainer.main_ppo")
    assert any(o.split("=", 1)[0].endswith("rollout.nnodes") for o in launch["overrides"])


@pytest.mark.parametrize(
    ("overrides", "entrypoint", "feasible", "emitted"),
    [
        pytest.param(
            ["trainer.nnodes=1", "rollout.nnodes=1", "data.train_batch_size=0"],
            FA06,
            True,
            "actor_rollout_ref.rollout.mode=async",
            id="06-fully-async-emits-async",
        ),
        pytest.param(
            [
                "trainer.nnodes=1",
                "rollout.nnodes=1",
                "data.train_batch_size=0",
                "actor_rollout_ref.rollout.mode=sync",
            ],
            FA06,
            False,
            None,
            id="06-fully-async-refuses-sync",
        ),
        pytest.param(
            ["trainer.nnodes=1", "rollout.nnodes=1", "actor_rollout_ref.rollout.mode=sync"],
            OSO06,
            True,
            "actor_rollout_ref.rollout.mode=sync",
            id="06-one-step-off-fsdp-sync",
        ),
    ],
)
def test_06_recipes_rollout_mode(
    overrides: list[str], entrypoint: str, feasible: bool, emitted: str | None
) -> None:
    result = plan(overrides, entrypoint=entrypoint, version="0.6")
    assert result.feasible is feasible, result.violations
    if not feasible:
        (v,) = [v for v in result.violations if v.rule == "rollout-mode"]
        assert "needs rollout.mode=async, not sync" in v.message
        return
    assert result.plan is not None and emitted in result.plan.overrides


FA_POOLS = ["data.train_batch_size=0", "trainer.nnodes=1", "rollout.nnodes=1"]


@pytest.mark.parametrize(
    ("extra", "rule", "text"),
    [
        pytest.param(
            ["actor_rollout_ref.hybrid_engine=True"],
            "async-hybrid-engine",
            "must be false, not true",
            id="hybrid-engine-true",
        ),
        pytest.param(
            ["actor_rollout_ref.rollout.standalone_gpu_memory_utilization=0.99"],
            "rollout-pool-memory",
            "exceeds the GPU",
            id="standalone-gmu-over-the-gpu",
        ),
        pytest.param(
            ["actor_rollout_ref.rollout.standalone_gpu_memory_utilization=0.1"],
            "rollout-pool-memory",
            "leave no KV cache",
            id="standalone-gmu-below-the-weights",
        ),
    ],
)
def test_fully_async_pool_rules(extra: list[str], rule: str, text: str) -> None:
    result = plan([*FA_POOLS, *extra], entrypoint=FA09)
    (v,) = [v for v in result.violations if v.rule == rule]
    assert text in v.message and v.suggestions


@pytest.mark.parametrize(
    ("entrypoint", "version", "where"),
    [
        pytest.param(FA09, "0.9", "fully_async_rollouter.py line 733", id="09"),
        pytest.param(FA06, "0.6", "fully_async_rollouter.py line 241", id="06"),
    ],
)
def test_fully_async_needs_the_rollouts_log_probs(entrypoint: str, version: str, where: str) -> None:
    """verl asserts ``calculate_log_probs`` in the rollouter (0.6.1's default false): false is refused, unset
    emitted."""
    refused = plan([*FA_POOLS, "actor_rollout_ref.rollout.calculate_log_probs=False"], entrypoint=entrypoint,
                   version=version)  # fmt: skip
    (v,) = [v for v in refused.violations if v.rule == "fully-async-log-probs"]
    assert (
        v.field == "spec.overrides[3] (actor_rollout_ref.rollout.calculate_log_probs)" and where in v.message
    )
    planned = plan(FA_POOLS, entrypoint=entrypoint, version=version)
    assert planned.plan is not None, planned.violations
    assert planned.plan.overrides.count("actor_rollout_ref.rollout.calculate_log_probs=True") == 1
    kept = plan([*FA_POOLS, "actor_rollout_ref.rollout.calculate_log_probs=True"], entrypoint=entrypoint,
                version=version)  # fmt: skip
    assert kept.plan is not None
    assert kept.plan.overrides.count("actor_rollout_ref.rollout.calculate_log_probs=True") == 1


def test_pool_memory_rollout_gpu_has_no_optimizer_trainer_gpu_no_kv_cache() -> None:
    result = plan(
        [*FA_POOLS, "actor_rollout_ref.rollout.standalone_gpu_memory_utilization=0.9"], entrypoint=FA09
    )
    assert result.feasible, result.violations
    assert result.plan is not None and result.plan.pools is not None
    pools = result.plan.pools
    assert pools.rollout is not None
    r, t = pools.rollout.memory_gib, pools.trainer.memory_gib
    assert r["vllmBudget"] == round(0.9 * result.plan.memory.gpu_memory_gib, 2)
    # Qwen2.5-7B's 7.6e9 bf16 weights on TP 1
    assert r["modelWeights"] == pytest.approx(7.616e9 * 2 / 1024**3, abs=0.01)
    assert "optimizer" not in r and "vllmBudget" not in t and "vllmResidual" not in t
    assert "actor_rollout_ref.rollout.standalone_gpu_memory_utilization=0.9" in result.plan.overrides
    assert "actor_rollout_ref.hybrid_engine=False" in result.plan.overrides  # emitted: verl's default is true


def test_separate_async_trainer_gpu_keeps_the_hybrid_replicas_memory() -> None:
    result = plan([*SEP, "trainer.nnodes=1", "actor_rollout_ref.rollout.nnodes=1"])
    assert result.plan is not None and result.plan.pools is not None
    mem = result.plan.memory
    assert result.plan.pools.trainer.peak_gib == max(
        mem.rollout_peak_gib, mem.train_peak_gib, mem.log_prob_peak_gib
    )


@pytest.mark.parametrize(
    ("override", "entrypoint", "version", "refused"),
    [
        pytest.param("rollout.total_epochs=10", FA09, "0.9", True, id="09-no-total-epochs"),
        pytest.param("rollout.total_epochs=10", FA06, "0.6", False, id="06-total-epochs"),
        pytest.param("async_training.use_rollout_log_probs=True", FA09, "0.9", True, id="09-moved-key"),
        pytest.param("+async_training.use_rollout_log_probs=True", FA09, "0.9", False, id="09-added-key"),
        pytest.param(
            "actor_rollout_ref.rollout.standalone_gpu_memory_utilization=0.9",
            FA06,
            "0.6",
            True,
            id="06-no-standalone-gmu",
        ),
        pytest.param(
            "async_training.require_batches=2", OSO09, "0.9", True, id="one-step-off-no-async-training"
        ),
    ],
)
def test_recipe_keys_against_the_recipes_config(
    override: str, entrypoint: str, version: str, refused: bool
) -> None:
    result = plan(
        ["data.train_batch_size=0", "trainer.nnodes=1", "rollout.nnodes=1", override],
        entrypoint=entrypoint,
        version=version,
    )
    unknown = [v for v in result.violations if v.rule == "override-unknown-key" and "config" in v.message]
    assert bool(unknown) is refused, result.violations


def test_a_trainer_pool_without_rollout_replicas_is_not_refused_for_the_rollout_phase() -> None:
    """one_step_off's trainer GPUs hold no vLLM budget (hybrid_engine=False): gpu_memory_utilization 0.9 beside
    the optimizer is the colocated trainer's problem, not theirs; the rollout pool's GPU holds it alone."""
    common = ["actor_rollout_ref.rollout.gpu_memory_utilization=0.9", "data.train_batch_size=64"]
    colocated = plan(common, gpus=8, nodes=2)
    assert not colocated.feasible
    assert "memory-rollout" in {v.rule for v in colocated.violations}
    pooled = plan(
        [
            *common,
            "trainer.nnodes=1",
            "trainer.n_gpus_per_node=4",
            "rollout.nnodes=1",
            "rollout.n_gpus_per_node=4",
        ],
        gpus=8,
        entrypoint=OSO09,
        nodes=2,
    )
    assert pooled.feasible, pooled.violations
    assert pooled.plan is not None and pooled.plan.pools is not None and pooled.plan.pools.rollout is not None
    assert "vllmBudget" in pooled.plan.pools.rollout.memory_gib
    assert pooled.plan.pools.rollout.peak_gib is not None
    assert pooled.plan.pools.rollout.peak_gib <= pooled.plan.memory.gpu_memory_gib


@pytest.mark.parametrize("value", ["-1", "-0.5"], ids=["int", "float"])
def test_fully_async_negative_staleness_whatever_its_type(value: str) -> None:
    result = plan(
        [*FA_POOLS, "async_training.staleness_threshold=0.1", f"async_training.staleness_threshold={value}"],
        entrypoint=FA09,
    )
    (v,) = [v for v in result.violations if v.rule == "fully-async-batch"]
    assert f"{value} must be >= 0" in v.message
    assert not [
        v for v in result.violations if v.rule == "override-unknown-key"
    ]  # both occurrences are the recipe's
