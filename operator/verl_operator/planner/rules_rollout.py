"""The rollout's rules: vLLM replicas (TP vs the world, the heads and the nodes), NVLink groups, the model
length and the SPMD rollout's token budget, expert parallelism."""

from __future__ import annotations

from verl_operator.api.plan import Violation
from verl_operator.planner.arith import divisors, nearest, nearest_divisor
from verl_operator.planner.arith import or_text as _or
from verl_operator.planner.inputs import SPEC_PATHS, Problem
from verl_operator.planner.mesh import (
    Mesh,
    fits_nvlink_domain,
    heads_allow_tp,
    replica_fits_nodes,
    rollout_tp_split,
)


def _field(p: Problem, name: str) -> str:
    return p.source(name, SPEC_PATHS.get(name, name))


def rollout_tp_divides_world(p: Problem, mesh: Mesh) -> list[Violation]:
    """Rule 16: the world size is a multiple of the rollout TP size."""
    tp = mesh.rollout_tp
    if mesh.divides_world(tp):
        return []
    return [
        Violation(
            field=_field(p, "rollout_tp"),
            rule="rollout-tp-divides-world",
            message=f"{mesh.world} GPUs are not divisible by rollout tensorParallelSize {tp}",
            suggestions=[f"use tensorParallelSize {_or(nearest_divisor(tp, mesh.world))}"],
        )
    ]


def rollout_tp_heads(p: Problem, mesh: Mesh) -> list[Violation]:
    """vLLM: the rollout TP size splits the attention heads, the KV heads and a dense MLP
    (:func:`~verl_operator.planner.mesh.rollout_tp_split`)."""
    tp = mesh.rollout_tp
    problems = rollout_tp_split(p.shape, tp)
    if not problems:
        return []
    fits = [d for d in divisors(mesh.world) if heads_allow_tp(p.shape, d)]
    near = nearest(tp, lambda v: v in fits) if fits else []
    return [
        Violation(
            field=_field(p, "rollout_tp"),
            rule="rollout-tp-heads",
            message="; ".join(problems),
            suggestions=[f"use tensorParallelSize {_or(near)}"] if near else [],
        )
    ]


def rollout_replica_node(p: Problem, mesh: Mesh) -> list[Violation]:
    """Rules 17-18: a replica larger than a node spans whole nodes; a smaller one must not straddle two."""
    tp, gpn = mesh.rollout_tp, mesh.gpus_per_node
    if mesh.replica_fits_nodes:
        return []
    kind = "a multiple of" if tp > gpn else "a divisor of"
    return [
        Violation(
            field=_field(p, "rollout_tp"),
            rule="rollout-replica-node",
            message=(
                f"rollout tensorParallelSize {tp} is not {kind} the {gpn} GPUs per node: a vLLM replica would "
                f"straddle nodes"
            ),
            suggestions=[f"use tensorParallelSize {_or(nearest(tp, lambda v: replica_fits_nodes(v, gpn)))}"],
        )
    ]


def nvlink_groups(p: Problem, mesh: Mesh) -> list[Violation]:
    """With ``placement.nvlink: required``, rollout TP and SP groups sit inside one NVLink domain; on nodes
    whose domains are partial (bridged pairs), a pod must take the whole node (as placement requires)."""
    if not p.nvlink_required:
        return []
    out: list[Violation] = _partial_domains(p, mesh)
    dom = p.nvlink_domain
    for name, size, label in (
        ("rollout_tp", mesh.rollout_tp, "rollout tensorParallelSize"),
        ("sequence_parallel_size", mesh.sequence_parallel_size, "sequenceParallelSize"),
    ):
        if fits_nvlink_domain(size, dom):
            continue
        out.append(
            Violation(
                field=_field(p, name),
                rule="nvlink-domain",
                message=(
                    f"{label} {size} does not fit the NVLink domain of {dom} GPUs (placement.nvlink: required "
                    f"needs groups inside one domain)"
                ),
                suggestions=[
                    f"use {label} {max(d for d in divisors(dom) if d <= size)}",
                    "or set spec.placement.nvlink: preferred",
                ],
            )
        )
    return out


def _partial_domains(p: Problem, mesh: Mesh) -> list[Violation]:
    group = mesh.nvlink_group_size  # called with placement.nvlink: required only
    if group <= 1 or not p.partial_domain_nodes or p.whole_node_fits >= mesh.nnodes:
        return []
    return [
        Violation(
            field="spec.resources.gpus",
            rule="nvlink-domain",
            message=(
                f"NVLink groups of {group} GPUs on nodes with NVLink domains of {p.nvlink_domain} GPUs only: a pod "
                f"must take a whole node to be sure of whole domains, and {p.whole_node_fits} of the nodes have "
                f"exactly {mesh.gpus_per_node} GPUs for the {mesh.nnodes} pods"
            ),
            suggestions=[
                "use whole nodes (spec.resources.gpus a multiple of the GPUs per node)",
                "or set spec.placement.nvlink: preferred",
            ],
        )
    ]


def max_model_len(p: Problem, mesh: Mesh) -> list[Violation]:
    """Rule 20: the rollout's max model length fits the model's ``max_position_embeddings``. verl 0.6's SGLang
    rollouts compare prompt + response, not a pinned ``max_model_len`` (``sglang_rollout.py`` lines 368-395; the
    async server replaces it, ``async_sglang_server.py`` line 83)."""
    pinned = p.max_model_len if not (p.rollout_name == "sglang" and p.version == "0.6") else None
    length = pinned if pinned is not None else p.seq_len
    limit = p.max_positions
    if length <= limit:
        return []
    name = "max_model_len" if pinned is not None else "max_response_length"
    return [
        Violation(
            field=_field(p, name),
            rule="max-model-len",
            message=(
                f"prompt {p.max_prompt_length} + response {p.max_response_length} = {p.seq_len} tokens"
                if pinned is None
                else f"max_model_len {pinned}"
            )
            + f" exceeds the model's max_position_embeddings {limit}",
            suggestions=[f"keep maxPromptLength + maxResponseLength <= {limit}"],
        )
    ]


def rollout_response_length(p: Problem, mesh: Mesh) -> list[Violation]:
    """A pinned ``rollout.response_length`` is at most ``data.max_response_length`` (verl's default takes it,
    0.6.1 ``trainer/config/rollout/rollout.yaml`` line 25). The rollout generates up to ``response_length``
    tokens and the server rollouts size the engine from the rollout's lengths (0.6.1
    ``vllm_async_server.py`` line 155: ``max_model_len = prompt_length + response_length``), while the
    planner's ``max_model_len``, KV cache, memory and token budgets count ``data.max_response_length``."""
    pinned = mesh.settings.rollout_response_length
    if pinned is None or pinned <= p.max_response_length:
        return []
    return [
        Violation(
            field=_field(p, "rollout_response_length"),
            rule="rollout-response-length",
            message=(
                f"rollout response_length {pinned} exceeds maxResponseLength {p.max_response_length}: the rollout "
                f"generates {p.max_prompt_length} + {pinned} = {p.max_prompt_length + pinned} tokens per sequence, "
                f"the plan sizes {p.max_prompt_length} + {p.max_response_length} = {p.seq_len}"
            ),
            suggestions=[
                f"set spec.data.maxResponseLength to {pinned} and drop the override",
                f"or use response_length {p.max_response_length} or less",
            ],
        )
    ]


def rollout_prompt_length(p: Problem, mesh: Mesh) -> list[Violation]:
    """A pinned ``rollout.prompt_length`` is at most ``data.max_prompt_length`` (verl's default takes it,
    0.6.1 ``trainer/config/rollout/rollout.yaml``). verl's agent loop pads every prompt to the rollout's
    ``prompt_length`` (0.9.1 ``experimental/agent_loop/agent_loop.py`` ``_postprocess``), so each sequence the
    actor trains on is ``prompt_length + response_length`` tokens, while the planner's memory, micro-batches
    and token budgets count ``data.max_prompt_length``."""
    pinned = mesh.settings.rollout_prompt_length
    if pinned is None or pinned <= p.max_prompt_length:
        return []
    response = mesh.settings.rollout_response_length or p.max_response_length
    return [
        Violation(
            field=_field(p, "rollout_prompt_length"),
            rule="rollout-prompt-length",
            message=(
                f"rollout prompt_length {pinned} exceeds maxPromptLength {p.max_prompt_length}: verl pads each "
                f"prompt to it, so every sequence is {pinned} + {response} = {pinned + response} tokens where the "
                f"plan sizes {p.max_prompt_length} + {p.max_response_length} = {p.seq_len}"
            ),
            suggestions=[
                f"set spec.data.maxPromptLength to {pinned} and drop the override",
                f"or use prompt_length {p.max_prompt_length} or less",
            ],
        )
    ]


def max_model_len_covers_prompt(p: Problem, mesh: Mesh) -> list[Violation]:
    """A pinned ``max_model_len`` holds the longest prompt: verl's server rollout refuses a prompt longer
    than it (0.9.1 ``vllm_async_server.py`` ``generate``: "Prompt length ... exceeds the model's maximum
    context length"), and vLLM refuses such a request too."""
    pinned = p.max_model_len if not (p.rollout_name == "sglang" and p.version == "0.6") else None
    if pinned is None or pinned >= p.max_prompt_length:
        return []
    return [
        Violation(
            field=_field(p, "max_model_len"),
            rule="max-model-len",
            message=(
                f"max_model_len {pinned} is below maxPromptLength {p.max_prompt_length}: a prompt of up to "
                f"{p.max_prompt_length} tokens does not fit the rollout's context (refused at the first long "
                "prompt)"
            ),
            suggestions=[f"use max_model_len {p.seq_len} (prompt + response) or drop the override"],
        )
    ]


def batched_tokens_cover_model_len(p: Problem, mesh: Mesh) -> list[Violation]:
    """verl 0.6 SPMD vLLM rollout: with chunked prefill, ``max_num_batched_tokens >= max_model_len`` (SGLang's
    SPMD rollout does not pass ``max_num_batched_tokens`` to its engine)."""
    if (
        p.rollout_name != "vllm"
        or not p.spmd_rollout
        or not p.enable_chunked_prefill
        or p.max_num_batched_tokens >= p.model_len
    ):
        return []
    return [
        Violation(
            field=_field(p, "max_num_batched_tokens"),
            rule="batched-tokens-model-len",
            message=(
                f"rollout max_num_batched_tokens {p.max_num_batched_tokens} is below max_model_len {p.model_len} "
                f"(prompt {p.max_prompt_length} + response {p.max_response_length}); verl 0.6 rejects that "
                "with chunked prefill on"
            ),
            suggestions=[f"use max_num_batched_tokens {p.model_len} or more, or drop the override"],
        )
    ]


def rollout_expert_parallel(p: Problem, mesh: Mesh) -> list[Violation]:
    """Rule 15: rollout expert parallelism > 1 must equal rollout TP x rollout DP (0.6.1
    ``workers/config/rollout.py`` line 204, 0.9.1 line 292); not for
    TensorRT-LLM (0.9.1 ``workers/config/rollout.py`` line 294; ``rules_engines.trtllm_moe_split``)."""
    ep, dp = p.rollout_ep, p.rollout_dp or 1
    if p.rollout_name == "trtllm" or ep is None or ep <= 1 or ep == mesh.rollout_tp * dp:
        return []
    return [
        Violation(
            field="spec.overrides (actor_rollout_ref.rollout.expert_parallel_size)",
            rule="rollout-expert-parallel",
            message=(
                f"rollout expert_parallel_size {ep} must equal tensorParallelSize {mesh.rollout_tp} x rollout "
                f"data_parallel_size {dp} = {mesh.rollout_tp * dp}"
            ),
            suggestions=[
                f"use tensorParallelSize {ep // dp}" if ep % dp == 0 else f"use tensorParallelSize {ep}",
                "or drop expert_parallel_size",
            ],
        )
    ]
