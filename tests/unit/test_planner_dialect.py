"""The output override list per verl release line."""

from __future__ import annotations

import difflib
import random
from typing import Any

import pytest
from conftest import make_nodes, make_spec

from verl_operator.planner import plan_job, verl_keys
from verl_operator.planner.budget import Budget, limited
from verl_operator.planner.dialect import INPUT_KEYS, format_value
from verl_operator.planner.overrides import Override, parse_override, parse_overrides


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


# -- the planner's keys cannot be undone by the user's overrides ----------------------------------------------
@pytest.mark.parametrize(
    "kw",
    [
        pytest.param({}, id="grpo"),
        pytest.param({"algorithm": "ppo"}, id="ppo-critic"),
        pytest.param(
            {"batching": {"dynamicBatchSize": True}, "parallelism": {"sequenceParallelSize": 2}}, id="dyn-sp"
        ),
    ],
)
@pytest.mark.parametrize("version", ["0.6", "0.9"])
def test_every_emitted_key_is_owned(version: str, kw: dict[str, Any]) -> None:
    emitted = overrides(version, **kw)
    assert set(emitted) <= set(INPUT_KEYS), set(emitted) - set(INPUT_KEYS)


def plan_of(*raws: str) -> Any:
    return plan_job(make_spec(8, overrides=list(raws)), make_nodes(1))


def test_dict_override_keeps_its_other_keys_after_the_plan() -> None:
    result = plan_of(
        "trainer={nnodes:1,n_gpus_per_node:8,total_epochs:3}", f"{ARR}.rollout={{n:4,temperature:0.7}}"
    )
    assert result.plan is not None, result.violations
    out = result.plan.overrides
    assert out[-2:] == ["trainer={total_epochs:3}", f"{ARR}.rollout={{temperature:0.7}}"]
    assert "trainer.nnodes=1" in out and f"{ARR}.rollout.n=4" in out


def test_force_add_dict_pin_is_the_plan() -> None:
    result = plan_of(f"++{ARR}.rollout={{n:64}}")
    assert result.plan is not None, result.violations
    assert f"{ARR}.rollout.n=64" in result.plan.overrides and result.plan.batching.rollout_n == 64
    assert not [o for o in result.plan.overrides if o.startswith("++")]


@pytest.mark.parametrize(
    ("raw", "rule", "field"),
    [
        pytest.param(
            "trainer={nnodes:5,n_gpus_per_node:3}",
            "resources-agree",
            "spec.overrides[0] (trainer.n_gpus_per_node, in trainer={...})",
            id="trainer-dict",
        ),
        pytest.param(
            f"{ARR}.rollout={{n:64,tensor_model_parallel_size:3}}",
            "rollout-tp-divides-world",
            f"spec.overrides[0] ({ARR}.rollout.tensor_model_parallel_size, in {ARR}.rollout={{...}})",
            id="rollout-dict",
        ),
        pytest.param(
            "data={train_batch_size:7}",
            "batch-divisible-by-world",
            "spec.overrides[0] (data.train_batch_size, in data={...})",
            id="data-dict",
        ),
        pytest.param("~trainer", "override-delete-owned", "spec.overrides[0] (trainer)", id="delete-trainer"),
        pytest.param(
            f"~{ARR}.rollout",
            "override-delete-owned",
            f"spec.overrides[0] ({ARR}.rollout)",
            id="delete-rollout",
        ),
        pytest.param(
            "trainer={nnodez:1}", "override-unknown-key", "spec.overrides[0] (trainer)", id="typo-in-dict"
        ),
    ],
)
def test_overrides_that_undid_the_plan_are_denied(raw: str, rule: str, field: str) -> None:
    result = plan_of(raw)
    assert not result.feasible
    assert (field, rule) in {(v.field, v.rule) for v in result.violations}, [
        v.one_line() for v in result.violations
    ]


# -- suggestions for unknown keys: the same as a full difflib search, at a bounded cost ----------------------
def suggestions_before(key: str, version: str) -> list[str]:
    """The suggestions as they were computed before the index: difflib over every known key."""
    keys = verl_keys.known_keys(version)
    leaf, head = key.rsplit(".", 1)[-1], key.split(".", 1)[0]
    same_leaf = sorted(k for k in keys if k.rsplit(".", 1)[-1] == leaf and k.split(".", 1)[0] == head)
    close = difflib.get_close_matches(key, sorted(keys), n=3, cutoff=0.75)
    return list(dict.fromkeys(same_leaf[:3] + close))[:3]


@pytest.mark.parametrize(
    ("version", "typo", "first"),
    [
        ("0.9", "trainer.nnode", "trainer.nnodes"),
        ("0.9", "trainr.nnodes", "trainer.nnodes"),
        ("0.9", "trainer.n_gpu_per_node", "trainer.n_gpus_per_node"),
        ("0.9", f"{ARR}.rollout.tensor_model_paralel_size", f"{ARR}.rollout.tensor_model_parallel_size"),
        ("0.9", f"{ARR}.rolout.n", f"{ARR}.rollout.n"),
        ("0.9", f"{ARR}.actor.ppo_mini_batchsize", f"{ARR}.actor.ppo_mini_batch_size"),
        ("0.9", f"{ARR}.actor.ppo_micro_batch_size_per_gpus", f"{ARR}.actor.ppo_micro_batch_size_per_gpu"),
        ("0.9", f"{ARR}.ppo_mini_batch_size", f"{ARR}.actor.ppo_mini_batch_size"),
        ("0.9", "data.train_batch_sise", "data.train_batch_size"),
        ("0.9", "data.max_promt_length", "data.max_prompt_length"),
        ("0.9", "critic.model.fsdp_config.param_offload", "critic.fsdp.param_offload"),
        ("0.9", f"{ARR}.rollout.gpu_memory_utilisation", f"{ARR}.rollout.gpu_memory_utilization"),
        ("0.9", f"{ARR}.rollout.max_num_batched_token", f"{ARR}.rollout.max_num_batched_tokens"),
        ("0.9", f"{ARR}.actor.fsdp_config.paramoffload", f"{ARR}.actor.fsdp_config.param_offload"),
        ("0.9", "algorithm.adv_estimater", "algorithm.adv_estimator"),
        ("0.9", "reward_model.enable_", "reward_model.enable"),
        ("0.9", "trainer.logger_", "trainer.logger"),
        ("0.6", f"{ARR}.actor.ulysses_sequence_paralel_size", f"{ARR}.actor.ulysses_sequence_parallel_size"),
        (
            "0.6",
            f"{ARR}.rollout.log_prob_micro_batch_size_per_gp",
            f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu",
        ),
        ("0.6", f"{ARR}.actor.kl_loss_coeff", f"{ARR}.actor.kl_loss_coef"),
        ("0.6", "critic.ppo_micro_batch_size_per_gpu_", "critic.ppo_micro_batch_size_per_gpu"),
        ("0.6", "trainer.total_epoch", "trainer.total_epochs"),
    ],
)
def test_suggestions_are_the_same_as_before(version: str, typo: str, first: str) -> None:
    now = verl_keys.similar(typo, version)
    assert now[:1] == [first]
    assert now == suggestions_before(typo, version)


def one_edit_typos(version: str, count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    keys = verl_keys.known_keys(version)
    out: list[str] = []
    for key in rng.sample(sorted(keys), count):
        i = rng.randrange(len(key))
        letter = rng.choice("abcdefghijklmnopqrstuvwxyz_")
        typo = rng.choice(
            [key[:i] + key[i + 1 :], key[:i] + letter + key[i:], key[:i] + letter + key[i + 1 :]]
        )
        if typo not in keys and ".." not in typo and not typo.startswith(".") and not typo.endswith("."):
            out.append(typo)
    return out


@pytest.mark.parametrize("version", ["0.6", "0.9"])
def test_suggestions_of_random_typos_mostly_match_a_full_search(version: str) -> None:
    typos = one_edit_typos(version, 40, seed=22)
    same_first = sum(verl_keys.similar(t, version)[:1] == suggestions_before(t, version)[:1] for t in typos)
    same_all = sum(verl_keys.similar(t, version) == suggestions_before(t, version) for t in typos)
    assert same_first == len(typos)
    assert same_all >= 0.9 * len(typos), f"{same_all} of {len(typos)}"


def typo_overrides(count: int) -> list[Override]:
    keys = sorted(k for k in verl_keys.known_keys("0.9") if len(k) > 12)
    return [
        parse_override(f"{k[:-1]}{'x' if k[-1] != 'x' else 'y'}=1", i) for i, k in enumerate(keys[:count])
    ]


def test_256_typo_keys_do_bounded_work() -> None:
    with limited(Budget()) as used:
        violations = verl_keys.key_violations(typo_overrides(256), "0.9")
    assert [v.rule for v in violations] == ["override-unknown-key"] * 256
    suggested = [v for v in violations if v.suggestions[0].startswith("use ")]
    assert len(suggested) == verl_keys.MAX_SUGGESTED
    # Each suggested key compares at most MAX_CANDIDATES keys in full, plus parent names on the way down.
    assert 0 < used.used <= verl_keys.MAX_SUGGESTED * 2 * verl_keys.MAX_CANDIDATES


def test_suggestions_stop_at_the_deadline() -> None:
    ticks = iter(range(10**6))
    late = Budget(clock=lambda: float(next(ticks)), deadline=0.5)  # past the deadline at its first look
    with limited(late):
        violations = verl_keys.key_violations(typo_overrides(64), "0.9")
    assert len(violations) == 64
    assert sum(v.suggestions[0].startswith("use ") for v in violations) <= 1


def test_a_request_of_256_typo_keys_is_answered_with_every_key() -> None:
    raws = [o.raw for o in typo_overrides(256)]
    budget = Budget()
    result = plan_job(make_spec(8, overrides=raws), make_nodes(1), budget=budget)
    assert {v.rule for v in result.violations} == {"override-unknown-key"}
    assert len(result.violations) == 256 and budget.used <= budget.steps


@pytest.mark.parametrize(
    ("raw", "rule"),
    [
        pytest.param("+trainer={nnodes:1}", None, id="add-dict-to-existing-merges"),
        pytest.param("+trainer.logger=[console]", None, id="add-list-to-existing"),
        pytest.param("+trainer.nnodes=1", "override-add-existing", id="add-scalar-to-existing"),
        pytest.param("trainer={total_epochs:3}", None, id="dict-of-known-keys"),
        pytest.param("trainer={nnodez:1}", "override-unknown-key", id="dict-with-typo"),
        pytest.param(
            f"{ARR}.model.override_config={{max_position_embeddings:4096}}",
            "override-unknown-key",
            id="struct",
        ),
        pytest.param(
            f"+{ARR}.model.override_config={{max_position_embeddings:4096}}", None, id="add-into-struct"
        ),
        pytest.param("++trainer={nnodez:1}", None, id="force-add-dict"),
    ],
)
def test_key_check_of_dict_values(raw: str, rule: str | None) -> None:
    assert [v.rule for v in verl_keys.key_violations([parse_override(raw)], "0.9")] == (
        [rule] if rule else []
    )


@pytest.mark.parametrize(
    ("raws", "rules"),
    [
        pytest.param(
            [f"~{ARR}.actor.clip_ratio", f"{ARR}.actor={{clip_ratio:0.2}}"],
            ["override-deleted-key"],
            id="dict-after",
        ),
        pytest.param(
            ["~trainer.v1", "trainer.v1.sync=True"], ["override-deleted-key"], id="below-a-deleted-node"
        ),
        pytest.param(["~trainer.v1", "~trainer.v1.sync"], ["override-deleted-key"], id="deleted-twice"),
        pytest.param(
            ["~trainer.v1", "+trainer.v1={sync:True}", "trainer.v1.sync=False"], [], id="added-again"
        ),
        pytest.param(
            ["~trainer.total_epochs", "trainer.total_epochs=3"], [], id="set-again-replaces-the-deletion"
        ),
    ],
)
def test_key_check_follows_deletions_in_order(raws: list[str], rules: list[str]) -> None:
    parsed, _, _ = parse_overrides(raws)
    assert [v.rule for v in verl_keys.key_violations(parsed, "0.9")] == rules


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param("data.train_files={}", id="files-dict"),
        pytest.param("data.val_files=[[a.parquet]]", id="files-nested-list"),
        pytest.param(f"{ARR}.model.path=[a,b]", id="model-path-list"),
        pytest.param("algorithm={adv_estimator:[grpo]}", id="estimator-list"),
    ],
)
def test_a_container_where_the_planner_needs_text_is_a_type_violation(raw: str) -> None:
    result = plan_of(raw)
    assert "override-type" in {v.rule for v in result.violations}, [v.one_line() for v in result.violations]
