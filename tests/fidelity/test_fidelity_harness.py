"""The harness can fail: known-bad launch settings are rejected by verl's own code, known-good ones pass.

Each bad case is one change to a valid base configuration; the expected stage and message fragment are
verl's (or Hydra's) own wording for that mistake, so a harness that stopped running a check would fail here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from verl_client import MAIN_PPO_ARGV, CheckRequest, CheckResult, VerlRunner, check_batch
from verl_envs import VerlEnv

#: A valid GRPO launch on one node of 8 GPUs: 64 prompts x 4 samples = 256 trajectories, 32 per GPU.
BASE: dict[str, str] = {
    "algorithm.adv_estimator": "grpo",
    "trainer.nnodes": "1",
    "trainer.n_gpus_per_node": "8",
    "data.train_batch_size": "64",
    "actor_rollout_ref.model.path": "Qwen/Qwen2.5-0.5B-Instruct",
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.n": "4",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "2",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "4",
}

QWEN3_30B_A3B: dict[str, Any] = {  # an MoE shape, to exercise the model-folder writer on qwen3_moe
    "modelType": "qwen3_moe",
    "layers": 48,
    "hiddenSize": 2048,
    "attentionHeads": 32,
    "kvHeads": 4,
    "headDim": 128,
    "intermediateSize": 6144,
    "vocabSize": 151936,
    "maxPositionEmbeddings": 40960,
    "numExperts": 128,
    "numExpertsPerTok": 8,
    "moeIntermediateSize": 768,
}


def overrides(*, drop: tuple[str, ...] = (), **changes: str) -> tuple[str, ...]:
    """BASE without the ``drop`` keys, with ``changes`` (``__`` in a name stands for ``.``)."""
    merged = {key: value for key, value in BASE.items() if key not in drop}
    merged.update({key.replace("__", "."): value for key, value in changes.items()})
    return tuple(f"{key}={value}" for key, value in merged.items())


# (version, request, ok, stage, fragment of verl's message)
CASES: list[Any] = [
    pytest.param("0.9.1", CheckRequest("ok", overrides()), True, "all", None, id="0.9.1-valid-base"),
    pytest.param("0.6.1", CheckRequest("ok", overrides()), True, "all", None, id="0.6.1-valid-base-spmd"),
    pytest.param(
        "0.6.1",
        CheckRequest("ok", overrides(actor_rollout_ref__rollout__mode="async")),
        True,
        "all",
        None,
        id="0.6.1-valid-server-mode",
    ),
    pytest.param(
        "0.9.1",
        CheckRequest("moe", overrides(), model_shape=QWEN3_30B_A3B),
        True,
        "all",
        None,
        id="0.9.1-valid-moe-model-folder",
    ),
    pytest.param(
        "0.9.1",
        CheckRequest("argv", argv=(*MAIN_PPO_ARGV, *overrides())),
        True,
        "all",
        None,
        id="0.9.1-valid-argv",
    ),
    pytest.param(
        "0.9.1",
        CheckRequest("group", (*overrides(), "model_engine=dp")),
        True,
        "all",
        None,
        id="0.9.1-valid-config-group-override",
    ),
    pytest.param(
        "0.9.1",
        CheckRequest("group-bad", (*overrides(), "model_engine=no_such_engine")),
        False,
        "compose",
        "no_such_engine",
        id="0.9.1-unknown-config-group-option",
    ),
    pytest.param(
        "0.9.1",
        CheckRequest("sync", overrides(actor_rollout_ref__rollout__mode="sync")),
        False,
        "dataclass:rollout",
        "Rollout mode 'sync' has been removed",
        id="0.9.1-spmd-mode-removed",
    ),
    pytest.param(
        "0.9.1",
        CheckRequest("no-name", overrides(drop=("actor_rollout_ref.rollout.name",))),
        False,
        "dataclass:rollout",
        "name",
        id="0.9.1-rollout-name-has-no-default",
    ),
    pytest.param(
        "0.9.1",
        CheckRequest("pp", overrides(actor_rollout_ref__rollout__pipeline_model_parallel_size="2")),
        False,
        "dataclass:rollout",
        "pipeline_model_parallel_size > 1",
        id="0.9.1-rollout-pp-not-implemented",
    ),
    pytest.param(
        "0.9.1",
        CheckRequest("no-micro", overrides(drop=("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",))),
        False,
        "validate_config",
        "Please set at least one of 'actor.ppo_micro_batch_size'",
        id="0.9.1-missing-micro-batch",
    ),
    pytest.param(
        "0.6.1",
        CheckRequest("no-micro", overrides(drop=("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",))),
        False,
        "validate_config",
        "ppo_micro_batch_size",
        id="0.6.1-missing-micro-batch",
    ),
    pytest.param(
        "0.9.1",
        CheckRequest("b-mod-w", overrides(data__train_batch_size="60", actor_rollout_ref__rollout__n="1")),
        False,
        "validate_config",
        "real_train_batch_size (60) must be divisible by minimal possible batch size (8)",
        id="0.9.1-batch-not-divisible-by-world",
    ),
    pytest.param(
        "0.6.1",
        CheckRequest("b-mod-w", overrides(data__train_batch_size="60", actor_rollout_ref__rollout__n="1")),
        False,
        "validate_config",
        "real_train_batch_size (60) must be divisible by minimal possible batch size (8)",
        id="0.6.1-batch-not-divisible-by-world",
    ),
    pytest.param(
        "0.9.1",
        CheckRequest("mini", overrides(actor_rollout_ref__actor__ppo_mini_batch_size="128")),
        False,
        "validate_config",
        "train_batch_size (64) must be >= actor.ppo_mini_batch_size (128)",
        id="0.9.1-mini-batch-larger-than-batch",
    ),
    pytest.param(
        "0.9.1",
        CheckRequest(
            "ref-micro",
            overrides(
                drop=("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",),
                actor_rollout_ref__actor__use_kl_loss="True",
            ),
        ),
        False,
        "validate_config",
        "[actor_rollout_ref.ref] Please set at least one of",
        id="0.9.1-kl-loss-needs-ref-micro-batch",
    ),
    pytest.param(
        "0.6.1",
        CheckRequest("critic", overrides(algorithm__adv_estimator="gae")),
        False,
        "validate_config",
        "critic",
        id="0.6.1-ppo-critic-needs-micro-batch",
    ),
    pytest.param(
        "0.9.1",
        CheckRequest("typo", overrides(actor_rollout_ref__rollout__tensor_parallel_size="2")),
        False,
        "compose",
        "actor_rollout_ref.rollout.tensor_parallel_size",
        id="0.9.1-unknown-key",
    ),
    pytest.param(
        "0.9.1",
        CheckRequest("syntax", (*overrides(), "trainer.nnodes")),
        False,
        "parse",
        "trainer.nnodes",
        id="0.9.1-override-without-value",
    ),
    pytest.param(
        "0.9.1",
        CheckRequest("name", overrides(actor_rollout_ref__rollout__name="hf")),
        False,
        "rollout_registry",
        "Rollout hf with mode async not found",
        id="0.9.1-rollout-engine-not-registered",
    ),
    pytest.param(
        "0.6.1",
        CheckRequest("name", overrides(actor_rollout_ref__rollout__name="hf")),
        False,
        "rollout_registry",
        "Rollout hf with mode sync not found",
        id="0.6.1-rollout-engine-not-registered",
    ),
    pytest.param(
        "0.9.1",
        CheckRequest(
            "straddle",
            overrides(trainer__nnodes="2", actor_rollout_ref__rollout__tensor_model_parallel_size="12"),
        ),
        False,
        "rollout_replica",
        "world_size 12 must be divisible by gpus_per_node 8",
        id="0.9.1-replica-of-12-gpus-on-8-gpu-nodes",
    ),
    pytest.param(
        "0.9.1",
        CheckRequest(
            "sp2", overrides(actor_rollout_ref__actor__fsdp_config__ulysses_sequence_parallel_size="2")
        ),
        True,
        "all",
        None,
        id="0.9.1-valid-sp2-heads-14",
    ),
    pytest.param(
        "0.9.1",
        CheckRequest(
            "sp4", overrides(actor_rollout_ref__actor__fsdp_config__ulysses_sequence_parallel_size="4")
        ),
        False,
        "monkey_patch",
        "num_attention_heads 14 must be divisible by ulysses_sp_size 4",
        id="0.9.1-sp4-does-not-divide-14-heads",
    ),
    pytest.param(
        "0.6.1",
        CheckRequest("sp2-padding", overrides(actor_rollout_ref__actor__ulysses_sequence_parallel_size="2")),
        False,
        "validate_config",
        "you must enable `use_remove_padding`",
        id="0.6.1-sp-needs-remove-padding",
    ),
    pytest.param(
        "0.6.1",
        CheckRequest(
            "sp4",
            overrides(
                actor_rollout_ref__actor__ulysses_sequence_parallel_size="4",
                actor_rollout_ref__model__use_remove_padding="True",
            ),
        ),
        False,
        "monkey_patch",
        "num_attention_heads 14 must be divisible by ulysses_sp_size 4",
        id="0.6.1-sp4-does-not-divide-14-heads",
    ),
    pytest.param(
        "0.9.1",
        CheckRequest("argv-module", argv=("python3", "-m", "verl.trainer.main_ppo_v0", *overrides())),
        False,
        "parse",
        "verl.trainer.main_ppo",
        id="0.9.1-argv-wrong-module",
    ),
]


@pytest.fixture(scope="module")
def verdicts(verl_runners: dict[str, VerlRunner]) -> dict[tuple[str, str], CheckResult]:
    """Every case checked, one runner process per verl version."""
    by_version: dict[str, list[tuple[str, CheckRequest]]] = {}
    for case in CASES:
        version, request = case.values[0], case.values[1]
        by_version.setdefault(version, []).append((case.id, request))
    out: dict[tuple[str, str], CheckResult] = {}
    for version, items in by_version.items():
        requests = [
            CheckRequest(case_id, r.overrides, r.argv, r.model_shape, verify_compose=True)
            for case_id, r in items
        ]
        for result in verl_runners[version].check(requests):
            out[(version, result.id)] = result
    return out


@pytest.mark.parametrize(("version", "request_", "ok", "stage", "fragment"), CASES)
def test_verl_verdict(
    request: pytest.FixtureRequest,
    verdicts: dict[tuple[str, str], CheckResult],
    version: str,
    request_: CheckRequest,
    ok: bool,
    stage: str,
    fragment: str | None,
) -> None:
    case_id = request.node.callspec.id
    result = verdicts[(version, case_id)]
    assert (result.ok, result.stage) == (ok, stage), result
    if fragment is not None:
        assert result.error is not None and fragment in result.error, result


def test_one_shot_process_gives_the_same_verdicts(
    verl_envs: dict[str, VerlEnv], verdicts: dict[tuple[str, str], CheckResult]
) -> None:
    """``check_batch`` (one process, one JSON document on stdin) answers as the long-lived runner does."""
    chosen = [case for case in CASES if case.values[0] == "0.9.1"][:6]
    requests = [CheckRequest(case.id, *dataclasses.astuple(case.values[1])[1:4]) for case in chosen]
    results = check_batch(verl_envs["0.9.1"], requests)
    assert [(r.ok, r.stage, r.error) for r in results] == [
        (verdicts[("0.9.1", c.id)].ok, verdicts[("0.9.1", c.id)].stage, verdicts[("0.9.1", c.id)].error)
        for c in chosen
    ]
    assert {r.ok for r in results} == {True, False}, "the chosen cases must include passes and failures"
