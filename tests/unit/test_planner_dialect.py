"""The output override list per verl release line."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_nodes, make_spec

from verl_operator.planner import plan_job
from verl_operator.planner.dialect import format_value
from verl_operator.planner.overrides import parse_override


def overrides(version: str, **kw: Any) -> dict[str, str]:
    result = plan_job(make_spec(8, verl={"image": "x", "version": version}, **kw), make_nodes(1))
    assert result.plan is not None, result.violations
    pairs = [o.split("=", 1) for o in result.plan.overrides]
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), "every key is emitted once"
    return dict(pairs)


ARR = "actor_rollout_ref"


@pytest.mark.parametrize(
    ("version", "present", "absent"),
    [
        pytest.param(
            "0.6",
            {f"{ARR}.rollout.mode": "sync", f"{ARR}.actor.ulysses_sequence_parallel_size": "2"},
            [f"{ARR}.actor.fsdp_config.ulysses_sequence_parallel_size"],
            id="0.6-spmd",
        ),
        pytest.param(
            "0.9",
            {
                f"{ARR}.rollout.mode": "async",
                f"{ARR}.actor.fsdp_config.ulysses_sequence_parallel_size": "2",
                f"{ARR}.ref.fsdp_config.ulysses_sequence_parallel_size": "2",
            },
            [f"{ARR}.actor.ulysses_sequence_parallel_size"],
            id="0.9-server",
        ),
    ],
)
def test_version_keys(version: str, present: dict[str, str], absent: list[str]) -> None:
    out = overrides(version, parallelism={"sequenceParallelSize": 2})
    for key, value in present.items():
        assert out[key] == value
    for key in absent:
        assert key not in out
    assert out[f"{ARR}.rollout.name"] == "vllm"
    assert out[f"{ARR}.model.use_remove_padding"] == "True"


def test_sp_one_leaves_remove_padding_alone() -> None:
    assert f"{ARR}.model.use_remove_padding" not in overrides("0.9")


def test_per_gpu_forms_and_equal_log_prob_settings() -> None:
    out = overrides("0.9", overrides=[f"{ARR}.actor.ppo_micro_batch_size=32"])
    # A global micro-batch (32 over 8 data-parallel ranks) becomes the per-GPU form.
    assert out[f"{ARR}.actor.ppo_micro_batch_size_per_gpu"] == "4"
    assert f"{ARR}.actor.ppo_micro_batch_size" not in out
    assert (
        out[f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu"]
        == out[f"{ARR}.ref.log_prob_micro_batch_size_per_gpu"]
    )
    assert out[f"{ARR}.rollout.log_prob_use_dynamic_bsz"] == out[f"{ARR}.actor.use_dynamic_bsz"] == "False"


def test_dynamic_batch_size_forms() -> None:
    out = overrides("0.9", batching={"dynamicBatchSize": True, "maxTokenLenPerGpu": 8192})
    assert out[f"{ARR}.actor.ppo_max_token_len_per_gpu"] == "8192"
    assert out[f"{ARR}.rollout.log_prob_max_token_len_per_gpu"] == "8192"
    assert out[f"{ARR}.ref.log_prob_use_dynamic_bsz"] == "True"
    assert f"{ARR}.actor.ppo_micro_batch_size_per_gpu" not in out


def test_passthrough_kept_verbatim_and_owned_keys_replaced() -> None:
    user = [
        "trainer.total_epochs=15",
        "++trainer.val_before_train=False",
        f"{ARR}.rollout.tensor_model_parallel_size=2",
        "trainer.logger=['console','wandb']",
    ]
    result = plan_job(make_spec(8, overrides=user), make_nodes(1))
    assert result.plan is not None
    out = result.plan.overrides
    assert out[-3:] == [
        "trainer.total_epochs=15",
        "++trainer.val_before_train=False",
        "trainer.logger=['console','wandb']",
    ]
    assert out.count(f"{ARR}.rollout.tensor_model_parallel_size=2") == 1


def test_ppo_emits_critic_micro_batch() -> None:
    out = overrides("0.9", algorithm="ppo")
    assert out["algorithm.adv_estimator"] == "gae"
    assert out["critic.ppo_micro_batch_size_per_gpu"] == out[f"{ARR}.actor.ppo_micro_batch_size_per_gpu"]


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(True, id="bool"),
        pytest.param(None, id="null"),
        pytest.param(0.6, id="float"),
        pytest.param(-1, id="negative"),
        pytest.param("/data/gsm8k/train.parquet", id="path"),
        pytest.param("hello world", id="space"),
        pytest.param(["/a/b.parquet", "/c/d.parquet"], id="list"),
    ],
)
def test_format_value_round_trips(value: Any) -> None:
    assert parse_override(f"k={format_value(value)}").value == value


def test_files_are_emitted_from_the_spec() -> None:
    out = overrides("0.9", data={"trainFiles": ["/data/train.parquet"], "valFiles": ["/data/test.parquet"]})
    assert parse_override("k=" + out["data.train_files"]).value == ["/data/train.parquet"]


@pytest.mark.parametrize(
    ("version", "response", "batched"),
    [
        pytest.param("0.6", 1024, "8192", id="0.6-short"),
        pytest.param("0.6", 16384, "16896", id="0.6-long-raised"),
        pytest.param("0.9", 16384, "8192", id="0.9-long-chunked"),
    ],
)
def test_max_model_len_and_batched_tokens(version: str, response: int, batched: str) -> None:
    out = overrides(version, data={"maxPromptLength": 512, "maxResponseLength": response})
    assert out[f"{ARR}.rollout.max_model_len"] == str(512 + response)
    assert out[f"{ARR}.rollout.max_num_batched_tokens"] == batched


# The override list of verl's examples/grpo_trainer/run_qwen2-7b.sh, pasted as written in the script.
RUN_QWEN2_7B = [
    "data.train_files=$HOME/data/gsm8k/train.parquet",
    "data.val_files=$HOME/data/gsm8k/test.parquet",
    "data.train_batch_size=1024",
    "data.val_batch_size=1312",
    "data.max_prompt_length=512",
    "data.max_response_length=512",
    "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size=128",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size=128",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size=128",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.kl_ctrl.kl_coef=0.001",
    "trainer.critic_warmup=0",
    "trainer.logger=['console','wandb']",
    "trainer.project_name='verl_grpo_example_gsm8k'",
    "trainer.experiment_name='deepseek_llm_7b_function_rm'",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=1",
    "trainer.save_freq=-1",
    "trainer.total_epochs=15",
]


@pytest.mark.parametrize("version", ["0.6", "0.9"])
def test_pasted_example_script(version: str) -> None:
    spec = make_spec(
        8, model="Qwen/Qwen2-7B-Instruct", verl={"image": "x", "version": version}, overrides=RUN_QWEN2_7B
    )
    result = plan_job(spec, make_nodes(1))
    assert result.plan is not None, result.violations
    plan = result.plan
    # Global micro-batches of 128 over 8 data-parallel ranks become 16 per GPU.
    assert plan.batching.ppo_micro_batch_size_per_gpu == 16
    assert plan.batching.log_prob_micro_batch_size_per_gpu == 16
    assert (plan.rollout.tensor_parallel_size, plan.rollout.gpu_memory_utilization) == (2, 0.6)
    out = plan.overrides
    assert f"{ARR}.actor.ppo_micro_batch_size=128" not in out
    assert f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=16" in out
    for kept in (
        "trainer.total_epochs=15",
        "algorithm.kl_ctrl.kl_coef=0.001",
        "trainer.logger=['console','wandb']",
    ):
        assert kept in out
    assert any("$HOME is passed to verl as written" in w for w in result.warnings)
    assert "data.train_files=$HOME/data/gsm8k/train.parquet" in out  # a single path stays a single path
