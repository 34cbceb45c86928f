"""The Megatron memory model (``planner/megatron_memory.py``): stage splits, the state's split over DP, EP
and the pipeline, 1F1B activations, recompute, offloads, and the parts ``memory.estimate`` reports."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from verl_operator.planner import catalog, megatron_memory, megatron_options
from verl_operator.planner.megatron_memory import MegatronMemory
from verl_operator.planner.megatron_options import MegatronOptions, stage_layers
from verl_operator.planner.memory import GIB, MemoryInputs, estimate, max_gpu_memory_utilization

QWEN235 = catalog.lookup("Qwen/Qwen3-235B-A22B")
DSV3 = catalog.lookup("deepseek-ai/DeepSeek-V3")
QWEN7 = catalog.lookup("Qwen/Qwen2.5-7B-Instruct")
assert QWEN235 is not None and DSV3 is not None and QWEN7 is not None
H20 = 97871 * 1024**2


@pytest.mark.parametrize(
    ("layers", "pp", "kw", "expected"),
    [
        pytest.param(28, 4, {}, (7, 7, 7, 7), id="even"),
        pytest.param(94, 8, {}, None, id="qwen3-235b-pp8-uneven"),
        pytest.param(
            94,
            8,
            {"embedding": True, "loss": True},
            (11, 12, 12, 12, 12, 12, 12, 11),
            id="qwen3-235b-accounted",
        ),
        pytest.param(61, 12, {"last": 6}, (5,) * 11 + (6,), id="dsv3-pp12-last6"),
        pytest.param(61, 16, {"last": 1}, (4,) * 15 + (1,), id="dsv3-pp16-last1"),
        pytest.param(61, 8, {"last": 6}, None, id="dsv3-pp8-last6-no"),
        pytest.param(10, 3, {"first": 2, "last": 2}, (2, 6, 2), id="first-and-last"),
        pytest.param(10, 1, {}, (10,), id="pp1"),
        # a virtual pipeline size divides each stage's share (megatron-core's TransformerConfig)
        pytest.param(
            94, 8, {"embedding": True, "loss": True, "vpp": 4}, (11,) + (12,) * 6 + (11,), id="accounted-vpp4"
        ),
        pytest.param(94, 8, {"embedding": True, "loss": True, "vpp": 5}, None, id="accounted-vpp5-no"),
        pytest.param(61, 12, {"last": 6, "vpp": 2}, None, id="dsv3-middle-5-vpp2-no"),
        pytest.param(62, 12, {"last": 6, "vpp": 2}, None, id="middle-56-over-11-no"),
        pytest.param(64, 6, {"first": 4, "last": 4, "vpp": 2}, (4, 14, 14, 14, 14, 4), id="first-last-vpp2"),
        pytest.param(64, 6, {"first": 4, "last": 4, "vpp": 4}, None, id="middle-14-vpp4-no"),
    ],
)
def test_stage_layers(layers: int, pp: int, kw: dict[str, Any], expected: tuple[int, ...] | None) -> None:
    assert stage_layers(layers, pp, **kw) == expected


@pytest.mark.parametrize("entry", [QWEN235, DSV3, QWEN7], ids=["qwen3-235b", "deepseek-v3", "qwen2.5-7b"])
def test_layer_params_add_up_to_the_catalogs_count(entry: catalog.CatalogEntry) -> None:
    shape = entry.shape
    lp = megatron_memory.layer_params(shape)
    moe_layers = shape.layers - lp.dense_layers if shape.num_experts else 0
    total = (
        lp.embedding * (1 if shape.tie_word_embeddings else 2)
        + shape.layers * lp.attention
        + (lp.dense_layers if shape.num_experts else shape.layers) * lp.dense_mlp
        + moe_layers * (lp.moe_dense + lp.moe_routed)
        + shape.hidden_size
    )
    assert total == pytest.approx(catalog.count_params(shape)[0], rel=1e-9)


def meg(world: int = 32, tp: int = 4, pp: int = 8, ep: int = 4, **kw: Any) -> MegatronMemory:
    options = kw.pop("options", MegatronOptions(account_for_embedding=True, account_for_loss=True))
    base: dict[str, Any] = {"cp": 1, "etp": 1, "vpp": None, "micro_batches": 64}
    base.update(kw)
    return MegatronMemory(world=world, tp=tp, pp=pp, ep=ep, options=options, **base)


def inputs(shape_entry: catalog.CatalogEntry, m: MegatronMemory, **kw: Any) -> MemoryInputs:
    base: dict[str, Any] = {
        "shape": shape_entry.shape,
        "params": shape_entry.params_total,
        "gpu_memory_bytes": H20,
        "world": m.world,
        "fsdp_shard": m.tp * m.pp,
        "sequence_parallel_size": 1,
        "rollout_tp": 8,
        "gpu_memory_utilization": 0.85,
        "seq_len": 11680,
        "train_tokens_per_gpu": 11680,
        "log_prob_tokens_per_gpu": 11680,
        "param_offload": True,
        "optimizer_offload": True,
        "ref_resident": False,
        "ref_bytes_per_param": 2,
        "critic": False,
        "critic_offload": False,
        "lora": False,
        "gradient_checkpointing": True,
        "max_num_batched_tokens": 11680,
        "max_num_seqs": 256,
        "megatron": m,
    }
    base.update(kw)
    return MemoryInputs(**base)


def stage0(m: MegatronMemory, entry: catalog.CatalogEntry = QWEN235) -> megatron_memory.Stage:
    return megatron_memory.stages(entry.shape, m)[0]


def test_the_experts_split_over_ep_and_the_dense_parts_over_tp() -> None:
    st = stage0(meg())
    lp = megatron_memory.layer_params(QWEN235.shape)
    assert st.layers == 11 and st.moe_layers == 11  # the embedding counts as the first stage's twelfth layer
    assert st.expert_params == pytest.approx(11 * lp.moe_routed / 4)
    assert st.dense_params == pytest.approx((11 * (lp.attention + lp.moe_dense) + lp.embedding) / 4)
    doubled = stage0(meg(ep=8))
    assert doubled.expert_params == pytest.approx(st.expert_params / 2)


def test_the_distributed_optimizer_splits_over_dp_and_the_experts_over_expert_dp() -> None:
    one = stage0(meg(world=32))
    opt32 = megatron_memory.optimizer_state(meg(world=32), one)
    opt64 = megatron_memory.optimizer_state(meg(world=64), one)
    assert opt64 == pytest.approx(opt32 / 2)  # DP 1 -> 2 and expert DP 1 -> 2
    assert opt32 == pytest.approx(12 * one.params)  # DP 1: fp32 master + Adam m and v, 12 bytes


@pytest.mark.parametrize(
    ("options", "share"),
    [
        pytest.param(MegatronOptions(), 1.0, id="on-gpu"),
        pytest.param(
            MegatronOptions(optimizer_cpu_offload=True, optimizer_offload_fraction=0.5), 0.5, id="half"
        ),
        pytest.param(
            MegatronOptions(optimizer_cpu_offload=True, optimizer_offload_fraction=1.0), 0.0, id="all"
        ),
        pytest.param(MegatronOptions(optimizer_offload_fraction=1.0), 1.0, id="fraction-without-cpu-offload"),
    ],
)
def test_the_hybrid_cpu_optimizer_keeps_its_share_on_the_gpu(options: MegatronOptions, share: float) -> None:
    full = megatron_memory.optimizer_state(
        meg(options=MegatronOptions()), stage0(meg(options=MegatronOptions()))
    )
    m = meg(options=options)
    assert megatron_memory.optimizer_state(m, stage0(m)) == pytest.approx(share * full)


def test_the_precision_aware_optimizer_keeps_the_master_weights_remainder() -> None:
    assert MegatronOptions(precision_aware_optimizer=True).optimizer_bytes == 10
    assert MegatronOptions().optimizer_bytes == 12
    # the hybrid CPU optimizer updates fp32 copies of its GPU share, whatever the precision setting
    hybrid = MegatronOptions(precision_aware_optimizer=True, optimizer_cpu_offload=True)
    assert hybrid.optimizer_bytes == 12


def test_offloading_the_hybrid_optimizer_leaves_its_fp32_masters_on_the_gpu() -> None:
    hybrid = MegatronOptions(optimizer_cpu_offload=True, optimizer_offload_fraction=0.5)
    m = meg(options=hybrid, optimizer_offload=True)
    st = stage0(m)
    on_gpu = megatron_memory.optimizer_state(m, st)  # the GPU share during the update
    assert megatron_memory.resident_parts(m, st, param_offload=True, ref=False)["optimizer"] == pytest.approx(
        on_gpu * 4 / 12
    )
    plain = meg(options=MegatronOptions(), optimizer_offload=True)
    assert megatron_memory.resident_parts(plain, st, param_offload=True, ref=False)["optimizer"] == 0
    kept = replace(m, optimizer_offload=False)
    assert megatron_memory.resident_parts(kept, st, param_offload=True, ref=False)["optimizer"] == on_gpu


def test_1f1b_keeps_pp_minus_the_stage_index_micro_batches_in_flight() -> None:
    m = meg()
    first, second, last = megatron_memory.stages(QWEN235.shape, m)
    assert [megatron_memory.in_flight(m, s) for s in (first, second, last)] == [8, 7, 1]
    assert megatron_memory.in_flight(replace(m, micro_batches=3), first) == 3  # fewer micro-batches than PP
    interleaved = replace(m, vpp=2)
    assert megatron_memory.in_flight(interleaved, first) == pytest.approx(8 * (1 + 7 / 16))


def test_full_recompute_keeps_only_each_chunks_input() -> None:
    shape = DSV3.shape
    a = 400_000
    plain = meg(world=96, tp=8, pp=12, ep=8, options=MegatronOptions(last_stage_layers=6))
    full = replace(
        plain,
        options=MegatronOptions(
            last_stage_layers=6,
            recompute_granularity="full",
            recompute_method="uniform",
            recompute_num_layers=1,
        ),
    )
    st = megatron_memory.stages(shape, plain)[0]
    kept, extra = megatron_memory.kept_layer_bytes(plain, st, a, shape.hidden_size, 11680)
    kept_full, extra_full = megatron_memory.kept_layer_bytes(full, st, a, shape.hidden_size, 11680)
    assert kept == pytest.approx(st.layers * a * 11680 / 8) and extra == 0
    assert kept_full == pytest.approx(st.layers * 2 * shape.hidden_size * 11680 / 8)
    assert extra_full == pytest.approx(a * 11680 / 8)  # one layer recomputed in the backward
    assert kept_full < kept / 10


def test_logits_sit_on_the_last_stage_only_and_split_over_tp() -> None:
    m = meg()
    parts = [
        megatron_memory.train_parts(QWEN235.shape, m, st, 1000, 11680, False, False)
        for st in megatron_memory.stages(QWEN235.shape, m)
    ]
    assert "logits" not in parts[0] and "logits" not in parts[1]
    assert parts[-1]["logits"] == pytest.approx(11680 * 151936 / 4 * 8)


def test_param_offload_frees_weights_and_gradients_outside_the_update() -> None:
    m = meg(optimizer_offload=True)
    st = stage0(m)
    off = megatron_memory.resident_parts(m, st, param_offload=True, ref=False)
    on = megatron_memory.resident_parts(
        replace(m, optimizer_offload=False), st, param_offload=False, ref=True
    )
    assert off["actorWeights"] == 0 and off["gradients"] == 0 and off["optimizer"] == 0
    assert on["actorWeights"] == pytest.approx(2 * st.params) and on["gradients"] == pytest.approx(
        4 * st.params
    )
    assert on["ref"] == pytest.approx(2 * st.params)


def test_the_estimate_takes_megatron_buffers_as_exact_and_the_rest_with_the_safety_factor() -> None:
    cpu = MegatronOptions(
        account_for_embedding=True,
        account_for_loss=True,
        optimizer_cpu_offload=True,
        optimizer_offload_fraction=1.0,
    )
    m = meg(options=cpu, optimizer_offload=True)
    est = estimate(inputs(QWEN235, m))
    assert {"actorWeights", "gradients"} <= set(est.train.exact)
    assert "activations" in est.train.estimated and "optimizer" not in est.train.parts_gib()  # all on the CPU
    # The rollout: vLLM's budget beside nothing resident (every offload on) but the CUDA reserve.
    assert est.rollout.peak_bytes == pytest.approx(0.85 * H20 + 1.1 * 2 * GIB)
    assert max_gpu_memory_utilization(inputs(QWEN235, m)) == 0.9


def test_more_gpus_shrink_the_estimate_of_a_moe_job() -> None:
    no_offload = MegatronOptions(account_for_embedding=True, account_for_loss=True)
    small = estimate(inputs(QWEN235, meg(world=32, options=no_offload), param_offload=False))
    large = estimate(inputs(QWEN235, meg(world=256, options=no_offload), param_offload=False))
    assert large.train.peak_bytes < small.train.peak_bytes
    assert large.rollout.peak_bytes < small.rollout.peak_bytes


def test_megatron_lora_trains_the_adapters_only() -> None:
    """verl 0.9's Megatron LoRA (Megatron-Bridge PEFT): the base weights are frozen bf16, gradients and the
    optimizer cover the adapters, and the reference is the actor without its adapters (no second copy)."""
    shape = QWEN7.shape
    full = meg(world=8, tp=2, pp=1, ep=1, options=MegatronOptions())
    lora = meg(world=8, tp=2, pp=1, ep=1, options=MegatronOptions(lora_rank=16, lora_targets=("linear_qkv",)))
    (st_full,) = megatron_memory.stages(shape, full)
    (st,) = megatron_memory.stages(shape, lora)
    h, q, k = shape.hidden_size, shape.attention_heads * shape.effective_head_dim, shape.kv_heads * 128
    assert st.adapter_params == pytest.approx(16 * shape.layers * (h + q + 2 * k) / 2)
    assert st.params == pytest.approx(st_full.params + st.adapter_params)
    parts = megatron_memory.train_parts(shape, lora, st, 1000, 4096, False, True)
    assert parts["gradients"] == pytest.approx(4 * st.adapter_params)
    assert parts["optimizer"] == pytest.approx(12 * st.adapter_params / 4)  # DP 4
    assert parts["actorWeights"] == pytest.approx(2 * st.params)
    assert "ref" not in parts
    assert "ref" in megatron_memory.train_parts(shape, full, st_full, 1000, 4096, False, True)
    # every default target: the MLP's two projections add rank x (h + 2I) and rank x (I + h) per layer
    every = meg(
        world=8,
        tp=2,
        pp=1,
        ep=1,
        options=MegatronOptions(lora_rank=16, lora_targets=megatron_options.LORA_TARGETS),
    )
    (st_every,) = megatron_memory.stages(shape, every)
    i = shape.intermediate_size
    mlp = 16 * shape.layers * ((h + 2 * i) + (i + h)) / 2
    attention = 16 * shape.layers * ((h + q + 2 * k) + (q + h)) / 2
    assert st_every.adapter_params == pytest.approx(mlp + attention)


def test_megatron_lora_experts_split_over_ep() -> None:
    shape = QWEN235.shape
    m = meg(
        options=MegatronOptions(
            account_for_embedding=True, account_for_loss=True, lora_rank=8, lora_targets=("linear_fc1",)
        )
    )
    second = megatron_memory.stages(shape, m)[1]
    moe_i = shape.moe_intermediate_size
    assert second.adapter_params == pytest.approx(8 * 12 * 128 * (shape.hidden_size + 2 * moe_i) / 4)
