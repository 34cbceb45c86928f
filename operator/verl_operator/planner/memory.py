"""Per-GPU memory estimate of a verl FSDP + vLLM (hybrid engine) job, phase by phase.

The formulas follow the project's memory model (ZeRO state accounting, activation and logits sizes, vLLM's
budget). Estimated parts are multiplied by ``SAFETY_FACTOR`` (the model came out 5-10% low against measured
runs); vLLM's budget ``gpu_memory_utilization x GPU memory`` is exact and is not.

Notation: P parameters, F FSDP shard group size, L layers, h hidden, V vocabulary, T tokens per GPU per
micro-batch (after Ulysses SP), M GPU memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_operator.api.spec import ModelShape
from verl_operator.planner import megatron_memory as mm
from verl_operator.planner.catalog import (
    effective_intermediate,
    kv_bytes_per_token,
    mla_activation_bytes,
)

GIB = 1024**3
#: Estimated parts are scaled by this (calibration came out 5-10% low).
SAFETY_FACTOR = 1.1
#: CUDA context, NCCL communicators and allocator fragmentation per process (memory model: "M - 2..4 GB").
CUDA_RESERVE_BYTES = int(2.0 * GIB)
#: vLLM memory that stays on the GPU while it sleeps during training (CUDA graphs, its context).
VLLM_RESIDUAL_BYTES = int(1.0 * GIB)
#: vLLM CUDA graph capture memory inside its budget (enforce_eager=False).
VLLM_CUDA_GRAPH_BYTES = int(0.5 * GIB)
#: Bytes per logit element (bf16 logits) in the actor's update: the logits and their gradient; with an entropy
#: term in the loss (``entropy_coeff`` not 0) also the softmax and the backward's temporaries, 7 bytes fitted to
#: the 1.5B and 7B LoRA searches of verl's tuning scripts (docs/fidelity.md).
LOGITS_TRAIN_BYTES = 4
LOGITS_TRAIN_ENTROPY_BYTES = 7
#: Bytes per logit element in a forward-only log-prob pass (with verl's entropy of the old log-probs).
LOGITS_FORWARD_BYTES = 7
#: Bytes per hidden unit per layer per token that gradient checkpointing keeps: each layer's bf16 input.
CHECKPOINT_BYTES_PER_HIDDEN = 2
#: What Ulysses SP adds to that, fitted to the 14B, 32B and 72B LoRA searches (all SP 2) of verl's tuning
#: scripts; the tensors behind it in verl's Ulysses path are not identified.
SP_CHECKPOINT_EXTRA_BYTES = 4


@dataclass(frozen=True)
class MemoryInputs:
    """Everything the estimate depends on."""

    shape: ModelShape
    params: float
    gpu_memory_bytes: int
    world: int
    fsdp_shard: int
    sequence_parallel_size: int
    rollout_tp: int
    gpu_memory_utilization: float
    seq_len: int
    train_tokens_per_gpu: int
    log_prob_tokens_per_gpu: int
    param_offload: bool
    optimizer_offload: bool
    ref_resident: bool
    ref_bytes_per_param: int
    critic: bool
    critic_offload: bool
    lora: bool
    gradient_checkpointing: bool
    max_num_batched_tokens: int
    max_num_seqs: int
    critic_params: float | None = None
    entropy: bool = False
    #: The rollout engine: vLLM's and SGLang's ``gpu_memory_utilization`` is a fraction of the GPU's
    #: total memory (SGLang's ``mem_fraction_static``); TensorRT-LLM's a fraction of the memory free after its
    #: weights (``free_gpu_memory_fraction``, verl 0.9.1 ``trtllm_async_server.py`` line 202).
    rollout_name: str = "vllm"
    #: The Megatron engine's sizes and options (``megatron_memory.py``); None: FSDP.
    megatron: mm.MegatronMemory | None = None


@dataclass(frozen=True)
class Phase:
    """One phase: exact parts (vLLM budget) and estimated parts, in bytes."""

    exact: dict[str, float]
    estimated: dict[str, float]

    @property
    def raw_bytes(self) -> float:
        """Sum of all parts without the safety factor."""
        return sum(self.exact.values()) + sum(self.estimated.values())

    @property
    def peak_bytes(self) -> float:
        """Exact parts plus ``SAFETY_FACTOR`` x estimated parts."""
        return sum(self.exact.values()) + SAFETY_FACTOR * sum(self.estimated.values())

    def parts_gib(self) -> dict[str, float]:
        """All parts in GiB, rounded to 0.01."""
        merged = {**self.exact, **self.estimated}
        return {k: round(v / GIB, 2) for k, v in merged.items() if v > 0}


@dataclass(frozen=True)
class Estimate:
    """The three phase estimates and the rollout KV-cache capacity."""

    rollout: Phase
    train: Phase
    log_prob: Phase
    kv_cache_bytes: float
    kv_cache_tokens: int

    def fits(self, gpu_memory_bytes: int) -> bool:
        """Every phase's peak is within the GPU's memory."""
        return (
            max(self.rollout.peak_bytes, self.train.peak_bytes, self.log_prob.peak_bytes) <= gpu_memory_bytes
        )


def activation_bytes_per_token_layer(shape: ModelShape) -> int:
    """``A = 8h + 4q + 4k + 8 I_eff`` bytes per token per layer (SwiGLU, GQA, FlashAttention); with multi-latent
    attention ``4q + 4k`` is the attention's own (:func:`catalog.mla_activation_bytes`)."""
    h = shape.hidden_size
    mla = mla_activation_bytes(shape)
    if mla is not None:
        attention = mla[0]
    else:
        attention = (
            4 * shape.attention_heads * shape.effective_head_dim
            + 4 * shape.kv_heads * shape.effective_head_dim
        )
    return 8 * h + attention + 8 * effective_intermediate(shape)


def resident_state(m: MemoryInputs) -> dict[str, float]:
    """Training state that stays on the GPU outside the update (weights, optimizer, ref, critic)."""
    if m.megatron is not None:
        return _megatron_resident(m, m.megatron)
    p_shard = m.params / m.fsdp_shard
    parts: dict[str, float] = {}
    if m.lora:
        parts["actorWeights"] = 0.0 if m.param_offload else 2 * p_shard  # frozen bf16 base
    else:
        parts["actorWeights"] = 0.0 if m.param_offload else 4 * p_shard  # fp32 master weights
        parts["optimizer"] = 0.0 if m.optimizer_offload else 8 * p_shard  # Adam m and v
    if m.ref_resident and not m.lora:
        parts["ref"] = m.ref_bytes_per_param * p_shard
    if m.critic and not m.critic_offload:
        parts["critic"] = 12 * (m.critic_params or m.params) / m.fsdp_shard
    return parts


def estimate(m: MemoryInputs) -> Estimate:
    """Per-GPU peaks of the rollout, log-prob and training phases.

    Algorithm:
        rollout = resident state + gmu x M (+ CUDA reserve);
        train = full actor state (16P/F; LoRA 2P/F) + ref + critic + two gathered bf16 layers (4P/L) +
        activations (checkpointed: ``c hLT + 2AT``; else ``LAT``) + logits (``T V 4``, 7 with an entropy term)
        + vLLM residual;
        log-prob = resident state + gathered layers + one layer's activations + logits (``T V 7``).
        Example: Qwen2.5-7B (P 7.6e9), 8 GPUs, gmu 0.6 on 80 GB: rollout = 12 x 7.6e9 / 8 + 0.6 x 80e9 = 59.4 GB.

    Args:
        m: The inputs.
    """
    if m.rollout_name == "trtllm":
        return _trtllm_estimate(m)
    budget = m.gpu_memory_utilization * m.gpu_memory_bytes
    exact, estimated = split_exact(m, resident_state(m))
    rollout = Phase(
        exact={"vllmBudget": budget, **exact},
        estimated={**estimated, "cudaReserve": CUDA_RESERVE_BYTES},
    )
    kv, kv_tokens = _kv_cache(m, budget)
    return Estimate(
        rollout=rollout,
        train=_train_phase(m),
        log_prob=_log_prob_phase(m),
        kv_cache_bytes=kv,
        kv_cache_tokens=kv_tokens,
    )


def _trtllm_free_bytes(m: MemoryInputs) -> float:
    """What TensorRT-LLM finds free once its weights are loaded beside the resident training state."""
    resident = sum(resident_state(m).values()) + CUDA_RESERVE_BYTES
    return m.gpu_memory_bytes - resident - 2 * m.params / m.rollout_tp


def _trtllm_estimate(m: MemoryInputs) -> Estimate:
    """TensorRT-LLM: weights plus ``gmu x`` the memory free after them, all of it KV cache."""
    weights = 2 * m.params / m.rollout_tp
    kv = m.gpu_memory_utilization * max(_trtllm_free_bytes(m), 0.0)
    exact, estimated = split_exact(m, resident_state(m))
    rollout = Phase(
        exact={"trtllmWeights": weights, "trtllmKvCache": kv, **exact},
        estimated={**estimated, "cudaReserve": CUDA_RESERVE_BYTES},
    )
    per_token = kv_bytes_per_token(m.shape, m.rollout_tp)
    return Estimate(
        rollout=rollout,
        train=_train_phase(m),
        log_prob=_log_prob_phase(m),
        kv_cache_bytes=kv,
        kv_cache_tokens=int(kv // per_token) if kv > 0 and per_token > 0 else 0,
    )


def checkpointed_bytes_per_hidden(m: MemoryInputs) -> float:
    """Bytes per hidden unit, layer and token that gradient checkpointing keeps (see the constants)."""
    return CHECKPOINT_BYTES_PER_HIDDEN + (SP_CHECKPOINT_EXTRA_BYTES if m.sequence_parallel_size > 1 else 0)


def _megatron_resident(m: MemoryInputs, meg: mm.MegatronMemory) -> dict[str, float]:
    """The Megatron stage with the most resident state: its weights, gradients, optimizer, ref, critic."""
    parts = mm.peak_stage(
        [mm.resident_parts(meg, st, m.param_offload, m.ref_resident) for st in mm.stages(m.shape, meg)]
    )
    if m.critic and not m.critic_offload:  # the critic's own state, sized like the actor's stage
        scale = (m.critic_params or m.params) / m.params
        st = max(mm.stages(m.shape, meg), key=lambda st: st.params)
        parts["criticBuffers"] = scale * (mm.WEIGHT_BYTES + mm.GRAD_BYTES) * st.params
        parts["criticOptimizer"] = scale * mm.optimizer_state(meg, st)
    return parts


def _megatron_phase(m: MemoryInputs, meg: mm.MegatronMemory, train: bool) -> Phase:
    """The update's or the log-prob pass's peak over the Megatron stages (``megatron_memory.py``)."""
    a = activation_bytes_per_token_layer(m.shape)
    ref = m.ref_resident
    if train:
        options = [
            mm.train_parts(m.shape, meg, st, a, m.train_tokens_per_gpu, m.entropy, ref)
            for st in mm.stages(m.shape, meg)
        ]
    else:
        options = [
            mm.log_prob_parts(m.shape, meg, st, a, m.log_prob_tokens_per_gpu, m.param_offload, ref)
            for st in mm.stages(m.shape, meg)
        ]
    parts = mm.peak_stage(options)
    resident = resident_state(m)
    parts.update({k: v for k, v in resident.items() if k.startswith("critic")})
    exact, estimated = split_exact(m, parts)
    return Phase(
        exact=exact,
        estimated={**estimated, "vllmResidual": VLLM_RESIDUAL_BYTES, "cudaReserve": CUDA_RESERVE_BYTES},
    )


def split_exact(m: MemoryInputs, parts: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """``(exact, estimated)`` parts: a Megatron actor's weights and gradients are exact (megatron-core allocates
    them as contiguous buffers of the stage's parameters, ``param_and_grad_buffer``); everything else of FSDP
    and Megatron is estimated."""
    if m.megatron is None:
        return {}, parts
    exact = {k: v for k, v in parts.items() if k in mm.EXACT_PARTS}
    return exact, {k: v for k, v in parts.items() if k not in mm.EXACT_PARTS}


def _train_phase(m: MemoryInputs) -> Phase:
    if m.megatron is not None:
        return _megatron_phase(m, m.megatron, train=True)
    shape, t = m.shape, m.train_tokens_per_gpu
    a = activation_bytes_per_token_layer(shape)
    p_shard = m.params / m.fsdp_shard
    # Checkpointing keeps each layer's input plus one layer's recomputed activations.
    if m.gradient_checkpointing:
        acts = checkpointed_bytes_per_hidden(m) * shape.hidden_size * shape.layers * t + 2 * a * t
    else:
        acts = shape.layers * a * t
    state = dict(resident_state(m))
    if m.lora:
        state["actorWeights"] = 2 * p_shard
    else:
        state.update(actorWeights=4 * p_shard, gradients=4 * p_shard, optimizer=8 * p_shard)
    logit_bytes = LOGITS_TRAIN_ENTROPY_BYTES if m.entropy else LOGITS_TRAIN_BYTES
    return Phase(
        exact={},
        estimated={
            **state,
            "layerBuffer": 2 * 2 * m.params / shape.layers,
            "activations": float(acts),
            "logits": float(t * shape.vocab_size * logit_bytes),
            "vllmResidual": VLLM_RESIDUAL_BYTES,
            "cudaReserve": CUDA_RESERVE_BYTES,
        },
    )


def _log_prob_phase(m: MemoryInputs) -> Phase:
    if m.megatron is not None:
        return _megatron_phase(m, m.megatron, train=False)
    shape, t = m.shape, m.log_prob_tokens_per_gpu
    a = activation_bytes_per_token_layer(shape)
    state = dict(resident_state(m))
    if m.param_offload:
        # Loaded back for the forward pass.
        state["actorWeights"] = (2 if m.lora else 4) * m.params / m.fsdp_shard
    return Phase(
        exact={},
        estimated={
            **state,
            "layerBuffer": 2 * 2 * m.params / shape.layers,
            "activations": float(2 * shape.hidden_size * t + 2 * a * t),
            "logits": float(t * shape.vocab_size * LOGITS_FORWARD_BYTES),
            "vllmResidual": VLLM_RESIDUAL_BYTES,
            "cudaReserve": CUDA_RESERVE_BYTES,
        },
    )


def _kv_cache(m: MemoryInputs, budget: float) -> tuple[float, int]:
    """vLLM's KV-cache bytes and tokens per GPU: the budget less weights, activation peak and CUDA graphs."""
    a = activation_bytes_per_token_layer(m.shape)
    weights = 2 * m.params / m.rollout_tp
    vllm_acts = m.max_num_batched_tokens * a / m.rollout_tp + m.max_num_seqs * m.shape.vocab_size * 4
    kv = budget - weights - vllm_acts - VLLM_CUDA_GRAPH_BYTES
    per_token = kv_bytes_per_token(m.shape, m.rollout_tp)
    return kv, int(kv // per_token) if kv > 0 and per_token > 0 else 0


def max_gpu_memory_utilization(m: MemoryInputs, cap: float = 0.9, step: float = 0.05) -> float:
    """The largest ``gpu_memory_utilization`` (a multiple of ``step``, at most ``cap``) whose rollout peak fits.

    vLLM's budget is a fraction of the GPU's total memory, so the resident training state and the CUDA reserve
    (with the safety factor) must fit beside it.

    Returns:
        The fraction, or 0.0 when not even ``step`` fits.
    """
    exact, estimated = split_exact(m, resident_state(m))
    resident = sum(estimated.values()) + CUDA_RESERVE_BYTES
    free = m.gpu_memory_bytes - SAFETY_FACTOR * resident - sum(exact.values())
    raw = free / m.gpu_memory_bytes
    if m.rollout_name == "trtllm":  # peak = W + g (M - R - W) + 1.1 R <= M
        weights = 2 * m.params / m.rollout_tp
        after = _trtllm_free_bytes(m)
        raw = (free - weights) / after if after > 0 else 0.0
    steps = int((min(raw, cap) + 1e-9) / step)
    return round(steps * step, 2) if steps > 0 else 0.0
