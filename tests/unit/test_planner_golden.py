"""Golden cases: verl's own example and tuning scripts (data/verl-example-configs.csv) ran on real hardware.

With matching simulated nodes the planner must accept every FSDP + vLLM row it can model. Rows left out, and
why (``skip_reason``): Megatron strategy (the planner models FSDP), SGLang/TRT-LLM rollout (it models vLLM),
Ascend NPUs (no GPU memory facts), no node count in the script, or a model without catalog facts
(Qwen2.5-Coder-14B, Qwen2.5-VL, GLM-4.1V, MiniCPM-o, Mistral-Nemo, Seed-OSS, local paths).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
from conftest import make_nodes, make_spec

from verl_operator.planner import plan_job
from verl_operator.planner.catalog import lookup

ROWS = list(csv.DictReader((Path(__file__).parent / "data" / "verl-example-configs.csv").open()))
ARR = "actor_rollout_ref"

# (CSV column, override key). A "global:N" value is the deprecated global micro-batch form.
COLUMNS = [
    ("train_batch_size", "data.train_batch_size"),
    ("rollout_n", f"{ARR}.rollout.n"),
    ("ppo_mini_batch_size", f"{ARR}.actor.ppo_mini_batch_size"),
    ("ppo_micro_batch_size_per_gpu", f"{ARR}.actor.ppo_micro_batch_size_per_gpu"),
    ("rollout_log_prob_micro_bsz_per_gpu", f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu"),
    ("ref_log_prob_micro_bsz_per_gpu", f"{ARR}.ref.log_prob_micro_batch_size_per_gpu"),
    ("rollout_tp", f"{ARR}.rollout.tensor_model_parallel_size"),
    ("gpu_memory_utilization", f"{ARR}.rollout.gpu_memory_utilization"),
    ("rollout_max_num_batched_tokens", f"{ARR}.rollout.max_num_batched_tokens"),
    ("ulysses_sp", f"{ARR}.actor.ulysses_sequence_parallel_size"),
    ("fsdp_size", f"{ARR}.actor.fsdp_config.fsdp_size"),
    ("use_dynamic_bsz", f"{ARR}.actor.use_dynamic_bsz"),
    ("ppo_max_token_len_per_gpu", f"{ARR}.actor.ppo_max_token_len_per_gpu"),
    ("max_prompt_length", "data.max_prompt_length"),
    ("max_response_length", "data.max_response_length"),
    ("actor_param_offload", f"{ARR}.actor.fsdp_config.param_offload"),
    ("actor_optimizer_offload", f"{ARR}.actor.fsdp_config.optimizer_offload"),
    ("ref_param_offload", f"{ARR}.ref.fsdp_config.param_offload"),
    ("lora_rank", f"{ARR}.model.lora_rank"),
    ("adv_estimator", "algorithm.adv_estimator"),
]
# verl's DAPO recipe raises Qwen2.5-Math-7B's 4096 positions for its 10k-token sequences.
EXTRA = {
    "examples/gmpo_trainer/test_dapo_7b_math.sh": [
        f"+{ARR}.model.override_config.max_position_embeddings=32768"
    ],
}


def skip_reason(row: dict[str, str]) -> str | None:
    if "megatron" in row["strategy"]:
        return "megatron strategy"
    if row["rollout_name"].strip() not in ("vllm", "sglang", "trtllm"):  # the rollout engines
        return f"{row['rollout_name']} rollout"
    if "NPU" in row["gpu_type"]:
        return "Ascend NPU"
    if not row["nnodes"].strip() or not row["n_gpus_per_node"].strip():
        return "no node count"
    if lookup(row["model"].split(" ")[0]) is None:
        return f"no catalog facts for {row['model']}"
    return None


def hardware(row: dict[str, str]) -> tuple[str, int]:
    gpu = row["gpu_type"]
    if "H20" in gpu:
        return "NVIDIA-H20", 97871
    if "141" in gpu:
        return "NVIDIA-H200", 143771
    return "NVIDIA-H100-80GB-HBM3", 81559  # H100/H800/A800 and unstated: 80 GB parts


def overrides(row: dict[str, str]) -> list[str]:
    out = []
    for column, key in COLUMNS:
        value = row[column].strip()
        if not value:
            continue
        if value.startswith("global:"):
            out.append(f"{key.removesuffix('_per_gpu')}={value.removeprefix('global:')}")
        else:
            out.append(f"{key}={value}")
    out += [f"trainer.nnodes={row['nnodes']}", f"trainer.n_gpus_per_node={row['n_gpus_per_node']}"]
    out.append(f"{ARR}.rollout.name={row['rollout_name'].strip()}")
    return out + EXTRA.get(row["source"].split(":", 1)[1], [])


CASES = [
    pytest.param(row, version, id=f"{version}-{row['source'].split('examples/')[-1]}")
    for row in ROWS
    if skip_reason(row) is None
    for version in ("0.6", "0.9")
    if not (row["rollout_name"].strip() == "trtllm" and version == "0.6")  # refused below
]
#: TensorRT-LLM rows on verl 0.6, which has no trtllm rollout.
TRTLLM_ON_0_6 = [
    pytest.param(row, id=row["source"].split("examples/")[-1])
    for row in ROWS
    if skip_reason(row) is None and row["rollout_name"].strip() == "trtllm"
]


def test_golden_table_is_not_empty() -> None:
    assert len(CASES) >= 40
    skipped = {skip_reason(r) for r in ROWS} - {None}
    assert "megatron strategy" in skipped


@pytest.mark.parametrize(("row", "version"), CASES)
def test_verl_example_is_accepted(row: dict[str, str], version: str) -> None:
    nnodes, gpn = int(row["nnodes"]), int(row["n_gpus_per_node"])
    product, memory = hardware(row)
    spec = make_spec(
        nnodes * gpn,
        model=row["model"].split(" ")[0],
        verl={"image": "x", "version": version},
        overrides=overrides(row),
    )
    result = plan_job(spec, make_nodes(nnodes, gpn, product, memory))
    assert result.feasible, [(v.rule, v.message) for v in result.violations]
    plan: Any = result.plan
    # The pinned numbers come back unchanged.
    assert (plan.nnodes, plan.gpus_per_node) == (nnodes, gpn)
    assert plan.batching.train_batch_size == int(row["train_batch_size"])
    if row["rollout_tp"].strip():
        assert plan.rollout.tensor_parallel_size == int(row["rollout_tp"])
    if row["ppo_mini_batch_size"].strip():
        assert plan.batching.ppo_mini_batch_size == int(row["ppo_mini_batch_size"])


@pytest.mark.parametrize("row", TRTLLM_ON_0_6)
def test_trtllm_example_is_refused_on_0_6(row: dict[str, str]) -> None:
    nnodes, gpn = int(row["nnodes"]), int(row["n_gpus_per_node"])
    product, memory = hardware(row)
    spec = make_spec(
        nnodes * gpn,
        model=row["model"].split(" ")[0],
        verl={"image": "x", "version": "0.6"},
        overrides=overrides(row),
    )
    result = plan_job(spec, make_nodes(nnodes, gpn, product, memory))
    assert {v.rule for v in result.violations} == {"rollout-engine-mode"}


def test_golden_table_has_every_engine() -> None:
    engines = {row.values[0]["rollout_name"].strip() for row in CASES}
    assert engines == {"vllm", "sglang", "trtllm"}
    assert TRTLLM_ON_0_6
