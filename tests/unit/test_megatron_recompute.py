"""Megatron settings checked before the model is loaded: megatron-core's recompute checks
(``megatron_memory.check_recompute``), what selective recompute's submodules free
(``megatron_memory.selective_savings``), and verl 0.9's Megatron engine checks (``megatron.check_engine``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import catalog_entry, make_nodes, make_spec

from verl_operator.api.plan import PlanResult
from verl_operator.planner import megatron_memory
from verl_operator.planner.job import plan_job
from verl_operator.planner.megatron_memory import MegatronMemory
from verl_operator.planner.megatron_options import MegatronOptions
from verl_operator.planner.memory import activation_bytes_per_token_layer

TC = "actor_rollout_ref.actor.megatron.override_transformer_config"
MOE = "Qwen/Qwen3-30B-A3B-Base"
DENSE = "Qwen/Qwen2.5-7B-Instruct"
SELECTIVE = f"{TC}.recompute_granularity=selective"
ARR = "actor_rollout_ref"
V06 = {"image": "example.com/verl:0.6.1", "version": "0.6"}


def _plan(model: str, *overrides: str) -> PlanResult:
    spec = make_spec(8, model=model, overrides=["--config-name=ppo_megatron_trainer", *overrides])
    return plan_job(spec, make_nodes(1, product="NVIDIA-H20", memory_mib=97871))


@pytest.mark.parametrize(
    ("model", "overrides", "field", "words"),
    [
        pytest.param(
            MOE,
            [f"{TC}.recompute_granularity=partial"],
            "recompute_granularity",
            "not full or selective",
            id="granularity",
        ),
        pytest.param(
            MOE,
            [f"{TC}.recompute_granularity=full", f"{TC}.recompute_num_layers=1"],
            "recompute_granularity",
            "needs recompute_method",
            id="full-without-method",
        ),
        pytest.param(
            MOE,
            [f"{TC}.recompute_granularity=full", f"{TC}.recompute_method=uniform"],
            "recompute_granularity",
            "needs recompute_num_layers",
            id="full-without-layers",
        ),
        pytest.param(
            MOE,
            [
                f"{TC}.recompute_granularity=full",
                f"{TC}.recompute_method=even",
                f"{TC}.recompute_num_layers=1",
            ],
            "recompute_method",
            "not uniform or block",
            id="method",
        ),
        pytest.param(
            MOE,
            [SELECTIVE, f"{TC}.recompute_num_layers=2"],
            "recompute_num_layers",
            "takes none",
            id="selective-with-layers",
        ),
        pytest.param(
            MOE,
            [SELECTIVE, f"{TC}.recompute_modules=[core_attn,moe_actt]"],
            "recompute_modules",
            "moe_actt: not among",
            id="unknown-module",
        ),
        pytest.param(
            MOE,
            [SELECTIVE, f"{TC}.recompute_modules=[moe_act]", f"+{TC}.moe_grouped_gemm=False"],
            "recompute_modules",
            "moe_grouped_gemm=False",
            id="moe-act-without-grouped-gemm",
        ),
        pytest.param(
            DENSE,
            [SELECTIVE, f"{TC}.recompute_modules=[moe_act]"],
            "recompute_modules",
            "dense model",
            id="moe-act-on-a-dense-model",
        ),
        pytest.param(
            DENSE,
            [SELECTIVE, f"{TC}.recompute_modules=[mla_up_proj]"],
            "recompute_modules",
            "multi-latent attention",
            id="mla-without-mla",
        ),
        pytest.param(
            DENSE,
            [SELECTIVE, f"{TC}.recompute_modules=core_attn"],
            "recompute_modules",
            "not a list",
            id="modules-not-a-list",
        ),
    ],
)
def test_megatron_cores_recompute_checks_are_made_at_admission(
    model: str, overrides: list[str], field: str, words: str
) -> None:
    result = _plan(model, *overrides)
    assert not result.feasible
    (v,) = [v for v in result.violations if v.rule in ("megatron-recompute", "override-type")]
    assert f"{TC}.{field})" in v.field and words in v.message, v
    assert v.suggestions


@pytest.mark.parametrize(
    ("model", "overrides"),
    [
        pytest.param(MOE, [SELECTIVE], id="selective-default-modules"),
        pytest.param(MOE, [SELECTIVE, f"{TC}.recompute_modules=[core_attn,moe_act,layernorm,moe]"], id="moe"),
        pytest.param(DENSE, [SELECTIVE, f"{TC}.recompute_modules=[mlp,layernorm]"], id="dense-mlp"),
        pytest.param(
            MOE,
            [
                f"{TC}.recompute_granularity=full",
                f"{TC}.recompute_method=uniform",
                f"{TC}.recompute_num_layers=1",
            ],
            id="full-uniform",
        ),
        # megatron-core reads the modules only for selective recompute
        pytest.param(DENSE, [f"{TC}.recompute_modules=[moe_act]"], id="modules-without-selective"),
    ],
)
def test_valid_recompute_settings_plan(model: str, overrides: list[str]) -> None:
    result = _plan(model, *overrides)
    assert result.feasible, result.violations


QWEN235 = catalog_entry("Qwen/Qwen3-235B-A22B").shape
QWEN7 = catalog_entry(DENSE).shape


def _selective(*modules: str) -> MegatronOptions:
    return MegatronOptions(recompute_granularity="selective", recompute_modules=modules)


@pytest.mark.parametrize(
    ("modules", "moe_bytes"),
    [
        pytest.param((), 0, id="no-modules"),
        pytest.param(("core_attn",), 0, id="core-attn-frees-nothing-with-fused-attention"),
        pytest.param(("moe_act",), 2 * 8 * 1536, id="moe-act"),
        pytest.param(("layernorm",), 2 * 4096, id="layernorm"),
        pytest.param(("moe",), 8 * 8 * 1536, id="moe"),
        pytest.param(("moe", "moe_act", "layernorm"), 8 * 8 * 1536 + 2 * 4096, id="moe-supersedes-moe-act"),
        pytest.param(("mlp",), 0, id="mlp-is-the-dense-layers"),
    ],
)
def test_selective_savings_of_a_moe_layer(modules: tuple[str, ...], moe_bytes: int) -> None:
    moe, dense = megatron_memory.selective_savings(QWEN235, _selective(*modules))
    assert moe == moe_bytes
    assert dense == (8 * 8 * 1536 if "mlp" in modules else 0)


def test_selective_savings_of_a_dense_layer() -> None:
    i = QWEN7.intermediate_size
    assert megatron_memory.selective_savings(QWEN7, _selective("mlp", "layernorm")) == (0.0, 8.0 * i)
    # full recompute and no recompute free nothing here
    assert megatron_memory.selective_savings(QWEN7, MegatronOptions(recompute_granularity="full")) == (0, 0)
    assert megatron_memory.selective_savings(QWEN7, MegatronOptions(recompute_modules=("mlp",))) == (0, 0)


DSV3 = catalog_entry("deepseek-ai/DeepSeek-V3").shape


def test_multi_latent_attention_keeps_its_own_query_key_and_value() -> None:
    """DeepSeek-V3's attention keeps 128 heads of 192-wide queries and keys and 128-wide values and outputs, not
    the hidden size over the heads (56) that a GQA formula would take for them, plus its latents."""
    shape = DSV3
    h, heads = shape.hidden_size, shape.attention_heads
    qk = shape.qk_nope_head_dim + shape.qk_rope_head_dim
    attention = 2 * heads * (2 * qk + 2 * shape.v_head_dim)
    latents = 2 * (2 * shape.q_lora_rank + 2 * shape.kv_lora_rank + shape.qk_rope_head_dim)
    i_eff = shape.moe_intermediate_size * (shape.num_experts_per_tok + shape.shared_experts)
    assert activation_bytes_per_token_layer(shape) == 8 * h + attention + latents + 8 * i_eff
    gqa = shape.model_copy(update={"kv_lora_rank": None, "q_lora_rank": None})
    assert activation_bytes_per_token_layer(gqa) == 8 * h + 8 * (h // heads) * heads + 8 * i_eff
    # a model without MLA is untouched: Qwen2.5-7B's 28 query and 4 KV heads of 128
    assert activation_bytes_per_token_layer(QWEN7) == 8 * 3584 + 4 * 28 * 128 + 4 * 4 * 128 + 8 * 18944


def test_mla_up_proj_frees_every_layers_query_key_value_and_normed_latents() -> None:
    qk = DSV3.qk_nope_head_dim + DSV3.qk_rope_head_dim
    up_proj = 2 * DSV3.attention_heads * (2 * qk + DSV3.v_head_dim) + 2 * (
        DSV3.q_lora_rank + DSV3.kv_lora_rank
    )
    assert megatron_memory.selective_savings(DSV3, _selective("mla_up_proj")) == (up_proj, up_proj)
    moe, dense = megatron_memory.selective_savings(DSV3, _selective("mla_up_proj", "moe"))
    assert (moe, dense) == (up_proj + 8 * 2048 * 9, up_proj)
    # DeepSeek-V2-Lite projects its query from the hidden state (no q_lora_rank): only the KV latent is normed
    lite = DSV3.model_copy(update={"q_lora_rank": None})
    assert (
        megatron_memory.selective_savings(lite, _selective("mla_up_proj"))[1]
        == up_proj - 2 * DSV3.q_lora_rank
    )


def test_selective_recompute_lowers_the_1f1b_activations_and_recomputes_one_layer() -> None:
    shape = QWEN235
    a = activation_bytes_per_token_layer(shape)
    plain = MegatronMemory(
        world=64, tp=4, pp=8, cp=1, ep=4, etp=1, vpp=None, options=MegatronOptions(), micro_batches=64
    )
    moe = replace(plain, options=_selective("moe", "layernorm"))
    st = megatron_memory.stages(shape, plain)[1]
    saved = megatron_memory.selective_savings(shape, moe.options)
    kept, extra = megatron_memory.kept_layer_bytes(plain, st, a, shape.hidden_size, 11680)
    kept_moe, extra_moe = megatron_memory.kept_layer_bytes(moe, st, a, shape.hidden_size, 11680, saved)
    per_tp = 11680 / 4
    assert kept - kept_moe == pytest.approx(st.moe_layers * saved[0] * per_tp)
    assert extra == 0 and extra_moe == pytest.approx(saved[0] * per_tp)
    plain_parts = megatron_memory.train_parts(shape, plain, st, a, 11680, False, False)
    moe_parts = megatron_memory.train_parts(shape, moe, st, a, 11680, False, False)
    assert moe_parts["activations"] < 0.5 * plain_parts["activations"]
    # the checkpointed MoE layers keep no router probabilities: one layer's dispatch and combine buffers remain
    dispatch = 2 * per_tp * 8 * shape.hidden_size * 2
    assert moe_parts["moeRouting"] == pytest.approx(dispatch)
    assert dispatch < plain_parts["moeRouting"]


M = "actor_rollout_ref.actor.megatron"


@pytest.mark.parametrize(
    ("overrides", "rule", "field"),
    [
        pytest.param([f"{M}.use_mbridge=False"], "megatron-mbridge", "use_mbridge", id="mbridge-off"),
        pytest.param(
            [f"{M}.dynamic_context_parallel=True", f"{M}.use_remove_padding=False"],
            "megatron-dynamic-cp",
            "use_remove_padding",
            id="dcp-with-padding",
        ),
        pytest.param(
            [f"{M}.dynamic_context_parallel=True", f"{M}.pad_to_length=True"],
            "megatron-dynamic-cp",
            "pad_to_length",
            id="dcp-with-bucket-padding",
        ),
        pytest.param(
            [
                f"{M}.dynamic_context_parallel=True",
                f"{M}.pipeline_model_parallel_size=2",
                f"{M}.virtual_pipeline_model_parallel_size=2",
            ],
            "megatron-dynamic-cp",
            "virtual_pipeline_model_parallel_size",
            id="dcp-with-vpp",
        ),
    ],
)
def test_verl_0_9_megatron_engine_checks(overrides: list[str], rule: str, field: str) -> None:
    """What verl 0.9.1's Megatron engine asserts when it is built (``transformer_impl.py`` lines 111-124, 191)."""
    spec = make_spec(8, overrides=["--config-name=ppo_megatron_trainer", *overrides])
    result = plan_job(spec, make_nodes(1))
    assert not result.feasible
    (v,) = [v for v in result.violations if v.rule == rule]
    assert v.field.endswith(f"{M}.{field})"), v


def test_verl_0_6_builds_megatron_without_mbridge() -> None:
    spec = make_spec(
        8,
        verl=V06,
        overrides=["--config-name=ppo_megatron_trainer", f"{M}.use_mbridge=False"],
    )
    assert plan_job(spec, make_nodes(1)).feasible


def test_the_search_picks_no_vpp_with_dynamic_cp() -> None:
    """Qwen2.5-72B on 4 x 8 H100: the search takes PP 2 with VPP 2, and no VPP with dynamic CP."""

    def mesh(*overrides: str) -> tuple[int, int, int | None]:
        spec = make_spec(
            32,
            model="Qwen/Qwen2.5-72B-Instruct",
            overrides=["--config-name=ppo_megatron_trainer", *overrides],
        )
        result = plan_job(spec, make_nodes(4))
        assert result.plan is not None and result.plan.training is not None, result.violations
        t = result.plan.training
        return t.tensor_parallel_size, t.pipeline_parallel_size, t.virtual_pipeline_parallel_size

    assert mesh() == (8, 2, 2)
    assert mesh(f"{M}.dynamic_context_parallel=True") == (8, 2, None)


@pytest.mark.parametrize(
    ("verl", "overrides", "refused"),
    [
        pytest.param(None, [f"{ARR}.model.lora_rank=32"], True, id="fsdp-key-0.9"),
        # verl 0.6.1's Megatron model config refuses the key itself
        pytest.param(V06, [f"+{ARR}.model.lora_rank=32"], True, id="fsdp-key-0.6"),
        pytest.param(
            None, [f"{ARR}.model.lora_rank=32", f"{ARR}.model.lora.rank=32"], False, id="both-keys-0.9"
        ),
        pytest.param(None, [f"{ARR}.model.lora.rank=32"], False, id="megatron-lora-0.9"),
    ],
)
def test_the_fsdp_lora_key_is_refused_with_megatron(
    verl: dict[str, str] | None, overrides: list[str], refused: bool
) -> None:
    """With model.lora_rank verl's Megatron workers train every weight and verl builds no reference model."""
    kw = {"verl": verl} if verl else {}
    result = plan_job(
        make_spec(8, overrides=["--config-name=ppo_megatron_trainer", *overrides], **kw), make_nodes(1)
    )
    assert result.feasible is not refused, result.violations
    found = [v for v in result.violations if v.rule == "megatron-lora"]
    if refused and verl is None:
        assert found[0].field.endswith(f"{ARR}.model.lora_rank)") and found[0].suggestions


@pytest.mark.parametrize(
    "override",
    [f"{ARR}.model.lora_rank=abc", f"{M}.dynamic_context_parallel=maybe"],
)
def test_a_bad_value_read_by_two_checks_is_one_violation(override: str) -> None:
    result = plan_job(make_spec(8, overrides=["--config-name=ppo_megatron_trainer", override]), make_nodes(1))
    assert [v.rule for v in result.violations] == ["override-type"], result.violations
