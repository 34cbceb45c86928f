"""Model shapes that verl, megatron-core and HF transformers refuse or break on at start (pure).

Checked on a shape the job gives (``spec.model.shape``, ``spec.critic.model.shape``); the built-in catalog's
shapes are real configs. Rule ``model-shape-moe``: a top-k routes among the routed experts (megatron-core
0.14.0 ``transformer/moe/moe_utils.py`` lines 567 and 626, ``torch.topk(scores, k=topk)``: "selected index k
out of range"), a top-k without experts is no MoE model verl would build as one (0.6.1
``models/mcore/config_converter.py`` passes ``num_experts_per_tok`` as ``moe_router_topk`` only with
``num_moe_experts``), and ``first_k_dense_replace`` counts leading layers among ``num_hidden_layers`` (the
converter's ``moe_layer_freq``, lines 305-307). Rule ``model-shape-kv-heads``: the key/value heads divide the
attention heads (megatron-core 0.14.0 ``transformer/dot_product_attention.py`` lines 136-141 repeat each
query group ``heads // groups`` times; HF's ``repeat_kv`` the same with ``num_key_value_groups``).
"""

from __future__ import annotations

from verl_operator.api.plan import Violation
from verl_operator.api.spec import ModelShape, VerlJobSpec
from verl_operator.planner.arith import divisors, nearest_divisor, or_text


def check_shape(shape: ModelShape, field: str) -> list[Violation]:
    """The violations of ``shape`` given at ``field`` (``spec.model.shape``).

    Example: ``numExpertsPerTok: 9`` with ``numExperts: 8`` -> ``spec.model.shape.numExpertsPerTok:
    numExpertsPerTok 9 > numExperts 8: each token's top-k picks among the routed experts``, suggesting
    ``numExpertsPerTok 8 or less``.
    """
    out: list[Violation] = []
    experts, topk, dense = shape.num_experts, shape.num_experts_per_tok, shape.first_k_dense_replace
    if topk is not None and experts is None:
        out.append(
            Violation(
                field=f"{field}.numExpertsPerTok",
                rule="model-shape-moe",
                message=(
                    f"numExpertsPerTok {topk} without numExperts: a top-k routes among routed experts, and "
                    "without them the model would be planned as dense"
                ),
                suggestions=[
                    f"set {field}.numExperts (num_experts or n_routed_experts in config.json)",
                    "or drop numExpertsPerTok for a dense model",
                ],
            )
        )
    elif topk is not None and experts is not None and topk > experts:
        out.append(
            Violation(
                field=f"{field}.numExpertsPerTok",
                rule="model-shape-moe",
                message=(
                    f"numExpertsPerTok {topk} > numExperts {experts}: each token's top-k picks among the "
                    f"{experts} routed experts (megatron-core's and vLLM's top-k fail at start)"
                ),
                suggestions=[f"use numExpertsPerTok {experts} or less", f"or numExperts {topk} or more"],
            )
        )
    if dense is not None and dense > shape.layers:
        out.append(
            Violation(
                field=f"{field}.firstKDenseReplace",
                rule="model-shape-moe",
                message=(
                    f"firstKDenseReplace {dense} > layers {shape.layers}: it counts the leading dense layers "
                    f"among the model's {shape.layers}"
                ),
                suggestions=[
                    f"use firstKDenseReplace {shape.layers} or less",
                    "copy first_k_dense_replace and num_hidden_layers from the model's config.json",
                ],
            )
        )
    heads, kv = shape.attention_heads, shape.kv_heads
    if heads % kv:
        near = nearest_divisor(kv, heads)
        out.append(
            Violation(
                field=f"{field}.kvHeads",
                rule="model-shape-kv-heads",
                message=(
                    f"attentionHeads {heads} is not divisible by kvHeads {kv} ({heads} / {kv} = "
                    f"{heads / kv:.2f}): each key/value head serves a whole group of query heads "
                    f"(divisors of {heads}: {', '.join(map(str, divisors(heads)[:12]))})"
                ),
                suggestions=[f"use kvHeads {or_text(near)}"] if near else [],
            )
        )
    return out


def check_spec_shapes(spec: VerlJobSpec) -> list[Violation]:
    """:func:`check_shape` of the actor's and the critic's shapes the spec gives."""
    out = check_shape(spec.model.shape, "spec.model.shape") if spec.model.shape is not None else []
    critic = spec.critic.model
    if critic is not None and critic.shape is not None:
        out += check_shape(critic.shape, "spec.critic.model.shape")
    return out
