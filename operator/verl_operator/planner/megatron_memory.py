"""Per-GPU memory of a verl Megatron (megatron-core) actor, stage by stage, for ``memory.estimate``.

The parts that differ from FSDP; the rollout engine's budget, the CUDA reserve and vLLM's residual are
``memory.py``'s. Notation: TP, PP, CP, EP, ETP, VPP the Megatron sizes, ``DP = W / (TP x PP x CP)``,
the experts' data-parallel size ``EDP = W / (EP x ETP x PP)`` (megatron-core ``parallel_state``), T the tokens
of one micro-batch per GPU, h hidden, V vocabulary, A the activation bytes per token per layer
(``memory.activation_bytes_per_token_layer``).

- **Weights**: bf16, 2 bytes per parameter of the stage: the stage's layers' dense parts over TP (the
  embedding on the first stage, the LM head on the last), the routed experts over ``EP x ETP``.
- **Gradients**: megatron-core's DDP grad buffer in fp32 (verl sets ``grad_reduce_in_fp32``), 4 bytes per
  stage parameter.
- **Distributed optimizer** (verl's ``megatron.use_distributed_optimizer`` default True,
  ``trainer/config/engine/megatron.yaml`` line 35): fp32 master weights and Adam's two moments, 12 bytes per
  parameter (10 with ``use_precision_aware_optimizer``: the master weights' 2-byte remainder, unless the
  hybrid CPU optimizer updates them: it keeps fp32 copies), the dense ones split over DP, the experts' over
  EDP. ``optim.override_optimizer_config`` ``optimizer_cpu_offload=True`` with ``optimizer_offload_fraction``
  f keeps ``1 - f`` of it on the GPU (the hybrid CPU optimizer of verl's large-MoE scripts);
  ``megatron.optimizer_offload`` moves Adam's moments to the CPU outside the update (the hybrid optimizer's
  fp32 masters stay), ``param_offload`` / ``grad_offload`` the weights / gradients (verl 0.6.1
  ``workers/megatron_workers.py``: loaded back for the update and the log-prob passes).
- **Activations under 1F1B**: pipeline stage ``i`` (0 first) holds ``min(PP - i, micro-batches)`` micro-batches'
  activations at its peak (the first stage the most); with VPP the interleaved schedule keeps
  ``1 + (PP - 1) / (PP x VPP)`` times that (Korthikanti et al. 2022, section 4.2.3). Per layer and token, with
  sequence parallelism over TP and CP splitting the tokens: ``A / TP`` without recompute; with
  ``override_transformer_config.recompute_granularity=full`` the layer's bf16 input ``2h / TP`` per recompute
  chunk (``recompute_method=uniform``: chunks of ``recompute_num_layers``; ``block``: the first
  ``recompute_num_layers`` layers of the stage recomputed, the rest kept), plus one chunk's recomputed
  activations in the backward; ``selective`` keeps A less what its ``recompute_modules`` free
  (:func:`selective_savings`), plus one layer's recomputed submodules in the backward.
- **MoE routing**: the fp32 router probabilities ``T / TP x experts x 4`` per kept MoE layer, and the
  dispatch and combine buffers of one layer in flight ``2 x T / TP x top_k x h x 2``.
- **Logits** on the last stage: ``T / CP x V / TP`` fp32, with their gradient in the update (8 bytes; 12 with an
  entropy term) and the log-probs' and entropy's copy in the forward pass (8 bytes).
- **Reference** model: its bf16 stage weights unless ``ref.megatron.param_offload``.

Stage layers: ``num_layers_in_first_pipeline_stage`` / ``num_layers_in_last_pipeline_stage`` when pinned,
the rest even; ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split`` count the
embedding / the loss as one layer of the first / last stage (megatron-core ``transformer_block.py``
``get_num_layers_to_build``).
"""

from __future__ import annotations

import difflib
import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from verl_operator.api.plan import Violation
from verl_operator.api.spec import ModelShape
from verl_operator.planner.catalog import count_params, effective_intermediate, mla_activation_bytes
from verl_operator.planner.megatron_options import (
    OPTIMIZER_BYTES,
    OPTION_SETTINGS,
    RECOMPUTE_GRANULARITIES,
    RECOMPUTE_METHODS,
    RECOMPUTE_MODULES,
    MegatronOptions,
)
from verl_operator.planner.reader import Reader

if TYPE_CHECKING:
    from verl_operator.planner.inputs import Problem, Settings

#: Bytes per parameter: bf16 weights, fp32 DDP gradients (verl 0.6.1 ``utils/megatron_utils.py`` line 141 sets
#: megatron-core's ``grad_reduce_in_fp32: True``), fp32 master + Adam m and v.
WEIGHT_BYTES = 2
GRAD_BYTES = 4
#: Of which the fp32 master weights.
MASTER_BYTES = 4
#: Bytes per hidden unit that full recompute keeps per chunk and token: the chunk's bf16 input.
RECOMPUTE_INPUT_BYTES = 2
#: fp32 logits and their gradient in the update; +4 with an entropy term; log-probs and entropy forward.
LOGITS_TRAIN_BYTES = 8
LOGITS_ENTROPY_EXTRA_BYTES = 4
LOGITS_FORWARD_BYTES = 8
#: The parts ``memory.py`` counts exactly (no safety factor): megatron-core's contiguous weight and grad buffers.
EXACT_PARTS = frozenset({"actorWeights", "gradients", "criticBuffers"})
#: fp32 router probabilities (verl's MoE scripts set ``moe_router_dtype=fp32``).
ROUTER_BYTES = 4


def check_recompute(r: Reader, shape: ModelShape, o: MegatronOptions) -> list[Violation]:
    """megatron-core's checks of the recompute settings (``TransformerConfig.__post_init__``, 0.14.0
    ``transformer/transformer_config.py`` lines 825-910, 0.16.1 lines 1154-1239), made before any GPU is held.

    A full recompute needs ``recompute_method`` (uniform or block) and ``recompute_num_layers``; a selective one
    takes no ``recompute_num_layers`` and only megatron-core's submodules, ``moe_act`` with grouped GEMM (verl's
    MoE model converters turn it on: 0.6.1 ``models/mcore/config_converter.py`` lines 204, 240, 269 and 339; a
    dense model's config leaves megatron-core's False), ``mla_up_proj`` with multi-latent attention, and
    ``shared_experts`` without ``moe_shared_expert_overlap``.
    """

    def bad(option: str, message: str, *suggestions: str) -> Violation:
        """A violation of the pinned ``option`` (each check below is of a value the job pins)."""
        source = r.reads[OPTION_SETTINGS[option]].source
        return Violation(
            field=source, rule="megatron-recompute", message=message, suggestions=list(suggestions)
        )

    g = o.recompute_granularity
    if g is None:
        return []
    if g not in RECOMPUTE_GRANULARITIES:
        return [
            bad(
                "recompute_granularity",
                f"recompute_granularity {g!r} is not full or selective",
                "use recompute_granularity=full (with recompute_method and recompute_num_layers) or selective",
            )
        ]
    out: list[Violation] = []
    if o.recompute_method is not None and o.recompute_method not in RECOMPUTE_METHODS:
        out.append(
            bad(
                "recompute_method",
                f"recompute_method {o.recompute_method!r} is not uniform or block",
                "use recompute_method=uniform or block",
            )
        )
    elif o.recompute_method is None and g == "full":
        out.append(
            bad(
                "recompute_granularity",
                "recompute_granularity=full needs recompute_method: uniform or block",
                "add recompute_method=uniform",
            )
        )
    if g == "full" and o.recompute_num_layers is None:
        out.append(
            bad(
                "recompute_granularity",
                "recompute_granularity=full needs recompute_num_layers (1 to the layers of a pipeline stage)",
                "add recompute_num_layers=1",
            )
        )
    if g != "selective":
        return out
    if o.recompute_num_layers is not None:
        out.append(
            bad(
                "recompute_num_layers",
                f"recompute_num_layers={o.recompute_num_layers} is set with recompute_granularity=selective, "
                "which takes none (it recomputes submodules of every layer)",
                "drop recompute_num_layers, or use recompute_granularity=full",
            )
        )
    modules = o.selective_modules
    unknown = sorted(modules - set(RECOMPUTE_MODULES))
    if unknown:
        near = sorted({m for u in unknown for m in difflib.get_close_matches(u, RECOMPUTE_MODULES, n=1)})
        out.append(
            bad(
                "recompute_modules",
                f"recompute_modules names {', '.join(unknown)}: not among megatron-core's "
                f"{', '.join(RECOMPUTE_MODULES)}",
                f"use {' or '.join(near)}" if near else f"use some of {', '.join(RECOMPUTE_MODULES)}",
            )
        )
    grouped = o.moe_grouped_gemm if o.moe_grouped_gemm is not None else bool(shape.num_experts)
    if "moe_act" in modules and not grouped:
        why = "moe_grouped_gemm=False" if o.moe_grouped_gemm is False else "a dense model has no grouped GEMM"
        out.append(
            bad(
                "recompute_modules",
                f"recompute_modules has moe_act, which needs grouped GEMM ({why})",
                "drop moe_act" if not shape.num_experts else "set moe_grouped_gemm=True or drop moe_act",
            )
        )
    if "mla_up_proj" in modules and shape.kv_lora_rank is None:
        out.append(
            bad(
                "recompute_modules",
                "recompute_modules has mla_up_proj, which needs multi-latent attention (the model has none)",
                "drop mla_up_proj",
            )
        )
    if "shared_experts" in modules and (shape.shared_experts or 0) > 0 and o.moe_shared_expert_overlap:
        out.append(
            bad(
                "recompute_modules",
                "recompute_modules has shared_experts, which cannot work with moe_shared_expert_overlap=True",
                "drop shared_experts, or set moe_shared_expert_overlap=False",
            )
        )
    return out


def selective_savings(shape: ModelShape, o: MegatronOptions) -> tuple[float, float]:
    """Bytes per token that selective recompute frees of ``A`` ``(in a MoE layer, in a dense layer)``.

    megatron-core 0.14.0 with TransformerEngine's layer spec (the one verl builds) fuses the input norm into the
    QKV projection and a dense layer's pre-MLP norm into its first MLP projection, so ``layernorm`` frees only
    a MoE layer's pre-MLP norm output, ``2h`` (``transformer_layer.py`` lines 406-418: output-discarding); ``moe``
    frees the whole MoE layer's part of A, ``8 I_eff``, keeping its input (``moe/moe_layer.py`` line 116), else
    ``moe_act`` the activation's output, ``2 x top_k x moe_intermediate`` (``moe/experts.py`` lines 806-809), and
    ``shared_experts`` the shared experts' ``8 x shared x moe_intermediate``; ``mlp`` a dense layer's MLP part,
    ``8 I_eff`` (``transformer_layer.py`` lines 425-427); ``mla_up_proj`` every layer's multi-latent query, key,
    value and normed latents (:func:`catalog.mla_activation_bytes`). ``core_attn`` frees nothing with fused
    attention (it keeps no score matrix; megatron-core warns as much).
    """
    modules = o.selective_modules
    if not modules:
        return 0.0, 0.0
    mla = mla_activation_bytes(shape) if "mla_up_proj" in modules else None
    attention = float(mla[1]) if mla is not None else 0.0
    i_eff = effective_intermediate(shape)
    dense = attention + (8.0 * i_eff if "mlp" in modules else 0.0)
    if not shape.num_experts:
        return 0.0, dense
    moe_i = shape.moe_intermediate_size or shape.intermediate_size
    if "moe" in modules:
        moe = 8.0 * i_eff
    else:
        moe = 2.0 * moe_i * (shape.num_experts_per_tok or 1) if "moe_act" in modules else 0.0
        if "shared_experts" in modules:
            moe += 8.0 * moe_i * (shape.shared_experts or 0)
    if "layernorm" in modules:
        moe += 2.0 * shape.hidden_size
    return moe + attention, dense


@dataclass(frozen=True)
class LayerParams:
    """Parameters per layer kind (biases ignored as in ``catalog.count_params``)."""

    embedding: float  # the input embedding (the LM head is as large unless tied)
    attention: float  # attention and norms of one layer
    dense_mlp: float  # the MLP of a dense layer
    moe_dense: float  # shared experts and router of a MoE layer (split over TP)
    moe_routed: float  # the routed experts of a MoE layer (split over EP x ETP)
    dense_layers: int  # leading dense layers of a MoE model (``first_k_dense_replace``)


def layer_params(shape: ModelShape) -> LayerParams:
    """The per-layer parameter parts of ``shape``, consistent with ``catalog.count_params``."""
    h = shape.hidden_size
    total, _ = count_params(shape)
    embedding = float(shape.vocab_size * h)
    embed_all = embedding * (1 if shape.tie_word_embeddings else 2)
    dense_mlp = float(3 * h * shape.intermediate_size)
    if shape.num_experts:
        moe_i = shape.moe_intermediate_size or shape.intermediate_size
        routed = float(shape.num_experts * 3 * h * moe_i)
        moe_dense = float((shape.shared_experts or 0) * 3 * h * moe_i + h * shape.num_experts)
        dense_layers = shape.first_k_dense_replace or 0
        mlp_total = dense_layers * dense_mlp + (shape.layers - dense_layers) * (routed + moe_dense)
    else:
        routed = moe_dense = 0.0
        dense_layers = shape.layers
        mlp_total = shape.layers * dense_mlp
    attention = max(0.0, (total - embed_all - mlp_total - h) / shape.layers)
    return LayerParams(embedding, attention, dense_mlp, moe_dense, routed, dense_layers)


@dataclass(frozen=True)
class MegatronMemory:
    """The Megatron side of one candidate's memory inputs (``memory.MemoryInputs.megatron``)."""

    world: int
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    vpp: int | None
    options: MegatronOptions
    #: Micro-batches of one mini-batch per GPU (caps the 1F1B micro-batches in flight).
    micro_batches: int
    #: The optimizer state is offloaded outside the update (``megatron.optimizer_offload``).
    optimizer_offload: bool = False

    @property
    def dp(self) -> int:
        """megatron-core's data-parallel size ``W / (TP x PP x CP)``."""
        return max(1, self.world // max(1, self.tp * self.pp * self.cp))

    @property
    def expert_dp(self) -> int:
        """The experts' data-parallel size ``W / (EP x ETP x PP)``."""
        return max(1, self.world // max(1, self.ep * self.etp * self.pp))


@dataclass(frozen=True)
class Stage:
    """One pipeline stage's share: its parameters per GPU and its place in the pipeline."""

    index: int
    layers: int
    dense_params: float  # per GPU, split over TP
    expert_params: float  # per GPU, split over EP x ETP
    moe_layers: int
    first: bool
    last: bool
    #: LoRA adapters on one GPU (0 without LoRA): the only trained parameters then.
    adapter_params: float = 0.0

    @property
    def params(self) -> float:
        """All of the stage's parameters on one GPU (with LoRA, the frozen base and the adapters)."""
        return self.dense_params + self.expert_params + self.adapter_params


def stages(shape: ModelShape, mm: MegatronMemory) -> list[Stage]:
    """The first, second and last pipeline stages (the others repeat the second's shape), per GPU."""
    return list(_stages(shape, mm.tp, mm.pp, mm.ep, mm.etp, mm.options))


@functools.lru_cache(maxsize=1024)
def _stages(
    shape: ModelShape, tp: int, pp: int, ep: int, etp: int, options: MegatronOptions
) -> tuple[Stage, ...]:
    """:func:`stages` for one mesh (cached: the search asks for the same mesh's stages once per estimate)."""
    mm = MegatronMemory(
        world=tp * pp, tp=tp, pp=pp, cp=1, ep=ep, etp=etp, vpp=None, options=options, micro_batches=1
    )
    split = mm.options.split(shape.layers, mm.pp)
    if split is None:  # the rules report it; the estimate takes the largest even share
        per = -(-shape.layers // mm.pp)
        split = tuple([per] * mm.pp)
    lp = layer_params(shape)
    out: list[Stage] = []
    start = 0
    for index, layers in enumerate(split):
        end = start + layers
        if index in (0, 1, mm.pp - 1):
            dense = max(0, min(end, lp.dense_layers) - start) if shape.num_experts else layers
            moe = layers - dense if shape.num_experts else 0
            tp_params = layers * lp.attention + dense * lp.dense_mlp + moe * lp.moe_dense
            if index == 0:
                tp_params += lp.embedding
            if index == mm.pp - 1 and not (shape.tie_word_embeddings and mm.pp == 1):
                tp_params += lp.embedding + shape.hidden_size
            out.append(
                Stage(
                    index=index,
                    layers=layers,
                    dense_params=tp_params / mm.tp,
                    expert_params=moe * lp.moe_routed / (mm.ep * mm.etp),
                    moe_layers=moe,
                    first=index == 0,
                    last=index == mm.pp - 1,
                    adapter_params=_adapters(shape, options, layers, dense, moe, mm.tp, mm.ep * mm.etp),
                )
            )
        start = end
    return tuple(out)


def _adapters(
    shape: ModelShape, o: MegatronOptions, layers: int, dense: int, moe: int, tp: int, experts_split: int
) -> float:
    """LoRA adapter parameters of a stage on one GPU: ``rank x (in + out)`` per targeted linear layer (the
    attention's QKV and output projections, each dense MLP's and each expert's two projections), the dense
    ones over TP and the experts' over ``EP x ETP``."""
    r = o.lora_rank
    if r <= 0:
        return 0.0
    h, q = shape.hidden_size, shape.attention_heads * shape.effective_head_dim
    k = shape.kv_heads * shape.effective_head_dim
    t = set(o.lora_targets)
    attention = ("linear_qkv" in t) * (h + q + 2 * k) + ("linear_proj" in t) * (q + h)

    def mlp(i: int) -> int:
        return ("linear_fc1" in t) * (h + 2 * i) + ("linear_fc2" in t) * (i + h)

    moe_i = shape.moe_intermediate_size or shape.intermediate_size
    shared = mlp(moe_i * shape.shared_experts) if shape.shared_experts else 0
    on_tp = layers * attention + dense * mlp(shape.intermediate_size) + moe * shared
    routed = moe * (shape.num_experts or 0) * mlp(moe_i)
    return r * (on_tp / tp + routed / experts_split)


def _trained(st: Stage) -> float:
    """The stage's parameters with gradients and optimizer state on one GPU: the adapters under LoRA."""
    return st.adapter_params if st.adapter_params else st.params


def optimizer_state(mm: MegatronMemory, st: Stage) -> float:
    """The GPU's share of the distributed optimizer's state of stage ``st`` on one GPU."""
    return mm.options.gpu_optimizer_share * _optimizer(mm, st)


def _optimizer(mm: MegatronMemory, st: Stage) -> float:
    """The distributed optimizer's state of the stage on one GPU (before any CPU offload)."""
    if st.adapter_params:
        return mm.options.optimizer_bytes * st.adapter_params / mm.dp
    return mm.options.optimizer_bytes * (st.dense_params / mm.dp + st.expert_params / mm.expert_dp)


def resident_parts(mm: MegatronMemory, st: Stage, param_offload: bool, ref: bool) -> dict[str, float]:
    """What stays on the GPU outside the update (the rollout phase): weights, gradients, optimizer, ref."""
    o = mm.options
    parts = {
        "actorWeights": 0.0 if param_offload else WEIGHT_BYTES * st.params,
        # verl's offload of the model frees the grad buffer too (0.6.1 ``utils/megatron_utils.py`` line 350).
        "gradients": 0.0 if o.grad_offload or param_offload else GRAD_BYTES * _trained(st),
        "optimizer": o.gpu_optimizer_share * _optimizer(mm, st) * _resident_share(mm),
    }
    if ref and not o.ref_param_offload and not o.lora_rank:  # LoRA's reference is the actor without adapters
        parts["ref"] = WEIGHT_BYTES * st.params
    return parts


def _resident_share(mm: MegatronMemory) -> float:
    """The share of the optimizer's GPU state that stays on the GPU outside the update: all of it without
    ``megatron.optimizer_offload``; none with it, but the hybrid CPU optimizer's fp32 master copies (verl
    0.6.1 ``utils/megatron_utils.py`` ``offload_megatron_optimizer``, lines 471-488, moves Adam's ``exp_avg``
    and ``exp_avg_sq`` only, and the hybrid optimizer keeps its masters outside that state's tensors)."""
    if not mm.optimizer_offload:
        return 1.0
    return MASTER_BYTES / OPTIMIZER_BYTES if mm.options.optimizer_cpu_offload else 0.0


def in_flight(mm: MegatronMemory, st: Stage) -> float:
    """Micro-batches whose activations stage ``st`` holds at its 1F1B peak (see the module)."""
    held = min(mm.pp - st.index, max(1, mm.micro_batches))
    if mm.vpp and mm.vpp > 1 and mm.pp > 1:
        return held * (1 + (mm.pp - 1) / (mm.pp * mm.vpp))
    return float(held)


def kept_layer_bytes(
    mm: MegatronMemory,
    st: Stage,
    a: int,
    h: int,
    tokens: float,
    savings: tuple[float, float] = (0.0, 0.0),
) -> tuple[float, float]:
    """``(bytes one micro-batch keeps for the stage's backward, the recompute's extra bytes)`` per GPU;
    ``savings`` are :func:`selective_savings`' (per token in a MoE and in a dense layer)."""
    o = mm.options
    per_tp = tokens / mm.tp
    if o.recompute_granularity != "full":
        moe, dense = savings
        dense_layers = st.layers - st.moe_layers
        kept = st.layers * a - st.moe_layers * moe - dense_layers * dense
        # The backward recomputes one layer's submodules at a time.
        extra = max(moe if st.moe_layers else 0.0, dense if dense_layers else 0.0)
        return kept * per_tp, extra * per_tp
    chunk = max(1, o.recompute_num_layers or 1)
    if o.recompute_method == "block":  # the first ``chunk`` layers recomputed, the rest kept
        recomputed = min(chunk, st.layers)
        kept = recomputed * RECOMPUTE_INPUT_BYTES * h * per_tp + (st.layers - recomputed) * a * per_tp
        return kept, (a * per_tp if recomputed else 0.0)
    chunks = -(-st.layers // chunk)
    return chunks * RECOMPUTE_INPUT_BYTES * h * per_tp, min(chunk, st.layers) * a * per_tp


def train_parts(
    shape: ModelShape, mm: MegatronMemory, st: Stage, a: int, tokens: int, entropy: bool, ref: bool
) -> dict[str, float]:
    """The update's peak on one GPU of stage ``st``: the full state, 1F1B activations, routing, logits."""
    o = mm.options
    t = tokens / mm.cp
    state = {
        "actorWeights": WEIGHT_BYTES * st.params,
        "gradients": GRAD_BYTES * _trained(st),
        "optimizer": o.gpu_optimizer_share * _optimizer(mm, st),
    }
    if ref and not o.ref_param_offload and not o.lora_rank:
        state["ref"] = WEIGHT_BYTES * st.params
    savings = selective_savings(shape, o)
    kept, recompute = kept_layer_bytes(mm, st, a, shape.hidden_size, t, savings)
    parts = {**state, "activations": in_flight(mm, st) * kept + recompute}
    if st.moe_layers and shape.num_experts:
        per_tp = t / mm.tp
        whole_layer = o.recompute_granularity == "full" or "moe" in o.selective_modules
        kept_moe = 0 if whole_layer else st.moe_layers
        parts["moeRouting"] = in_flight(mm, st) * kept_moe * per_tp * shape.num_experts * ROUTER_BYTES + (
            2 * per_tp * (shape.num_experts_per_tok or 1) * shape.hidden_size * 2
        )
    if st.last:
        logit = LOGITS_TRAIN_BYTES + (LOGITS_ENTROPY_EXTRA_BYTES if entropy else 0)
        parts["logits"] = t * math.ceil(shape.vocab_size / mm.tp) * logit
    return parts


def log_prob_parts(
    shape: ModelShape,
    mm: MegatronMemory,
    st: Stage,
    a: int,
    tokens: int,
    param_offload: bool,
    ref: bool,
) -> dict[str, float]:
    """A forward-only log-prob pass on one GPU of stage ``st``: the resident state with the weights loaded
    back, one layer's activations (nothing is kept for a backward) and the last stage's logits."""
    t = tokens / mm.cp
    parts = resident_parts(mm, st, False, ref)
    if param_offload:  # verl loads the weights back for the pass, not the gradients (load_grad=False)
        parts["gradients"] = 0.0
    parts["activations"] = 2 * a * t / mm.tp
    if st.last:
        parts["logits"] = t * math.ceil(shape.vocab_size / mm.tp) * LOGITS_FORWARD_BYTES
    return parts


def peak_stage(parts_of: list[dict[str, float]]) -> dict[str, float]:
    """The parts of the stage with the largest sum."""
    return max(parts_of, key=lambda parts: sum(parts.values()))


def of_candidate(p: Problem, s: Settings, mini_tokens: int, micro_tokens: int) -> MegatronMemory | None:
    """The Megatron memory inputs of a candidate (None for FSDP): its sizes, the job's options and the
    micro-batches of one per-GPU mini-batch (``mini_tokens / micro_tokens``, rounded up)."""
    if p.training_engine != "megatron":
        return None
    return MegatronMemory(
        world=s.world,
        tp=s.megatron_tp,
        pp=s.megatron_pp,
        cp=s.megatron_cp,
        ep=s.megatron_ep,
        etp=s.megatron_etp if s.megatron_etp is not None else s.megatron_tp,
        vpp=s.megatron_vpp,
        options=p.megatron_options,
        micro_batches=max(1, -(-mini_tokens // max(1, micro_tokens))),
        optimizer_offload=s.optimizer_offload,
    )


def uneven_split(p: Problem, pp: int, vpp: int | None = None) -> bool:
    """The job pins an uneven stage split that megatron-core can build for PP ``pp`` (and VPP ``vpp``)."""
    return p.megatron_options.uneven and p.megatron_options.split(p.shape.layers, pp, vpp) is not None
