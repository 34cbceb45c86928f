"""``plan_job``: a VerlJob spec plus the cluster's Node objects in, a plan or violations out."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from verl_operator.api.spec import VerlJobSpec
from verl_operator.planner import catalog, dialect, rules
from verl_operator.planner.cluster import Layout, Pool, layouts, select
from verl_operator.planner.facts import node_facts
from verl_operator.planner.inputs import Fixed, Problem, merge_pins
from verl_operator.planner.memory import GIB
from verl_operator.planner.overrides import Pinned, Value, parse_overrides, read_owned
from verl_operator.planner.result import (
    BatchingPlan,
    MemoryPhase,
    MemoryPlan,
    NodePoolPlan,
    PaddingPlan,
    Plan,
    PlanResult,
    RolloutPlan,
    Violation,
    infeasible,
)
from verl_operator.planner.search import Found, search

#: Algorithms that sample a group of responses per prompt; an unpinned rollout.n is 5 for them, else 1.
GROUP_ESTIMATORS = frozenset(
    {"grpo", "rloo", "grpo_passk", "gpg", "optimal_token_baseline", "drgrpo", "gspo"}
)
_INT_INPUTS = (
    "train_batch_size",
    "rollout_n",
    "rollout_tp",
    "sequence_parallel_size",
    "fsdp_size",
    "ppo_mini_batch_size",
    "ppo_micro_batch_size_per_gpu",
    "ppo_micro_batch_size_global",
    "log_prob_micro_batch_size_per_gpu",
    "log_prob_micro_batch_size_global",
    "max_token_len_per_gpu",
    "log_prob_max_token_len_per_gpu",
    "critic_ppo_micro_batch_size_per_gpu",
    "critic_ppo_micro_batch_size_global",
    "max_prompt_length",
    "max_response_length",
    "max_model_len",
    "nnodes",
    "n_gpus_per_node",
)
_BOOL_INPUTS = ("dynamic_batch_size", "param_offload", "optimizer_offload", "use_remove_padding")


class _Reader:
    """Typed access to pinned values; a value of the wrong type becomes a violation."""

    def __init__(self, pins: Mapping[str, Pinned], reads: Mapping[str, Pinned]) -> None:
        self.pins = pins
        self.reads = reads
        self.violations: list[Violation] = []

    def _bad(self, pin: Pinned, want: str) -> None:
        self.violations.append(
            Violation(
                field=pin.source,
                rule="override-type",
                message=f"{pin.value!r} is not {want}",
                suggestions=[f"write {want}"],
            )
        )

    def get_int(self, name: str, reads: bool = False) -> int | None:
        pin = (self.reads if reads else self.pins).get(name)
        if pin is None or pin.value is None:
            return None
        if isinstance(pin.value, bool) or not isinstance(pin.value, int):
            self._bad(pin, "an integer")
            return None
        return pin.value

    def get_bool(self, name: str, reads: bool = False) -> bool | None:
        pin = (self.reads if reads else self.pins).get(name)
        if pin is None or pin.value is None:
            return None
        if not isinstance(pin.value, bool):
            self._bad(pin, "True or False")
            return None
        return pin.value

    def get_float(self, name: str) -> float | None:
        pin = self.pins.get(name)
        if pin is None or pin.value is None:
            return None
        if isinstance(pin.value, bool) or not isinstance(pin.value, int | float):
            self._bad(pin, "a number")
            return None
        return float(pin.value)

    def get_str(self, name: str, reads: bool = False) -> str | None:
        pin = (self.reads if reads else self.pins).get(name)
        return None if pin is None or pin.value is None else str(pin.value)


def _files(value: Value | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, list):
        return [str(v) for v in value]
    return [str(value)]


def plan_job(spec: VerlJobSpec, nodes: Sequence[Mapping[str, Any]]) -> PlanResult:
    """Plan a VerlJob on the cluster's nodes.

    Pure: the same spec and nodes give the same result; no clock, environment, network or Kubernetes client.

    Algorithm:
        1. Resolve the model shape (``spec.model.shape`` or the built-in catalog), parse the overrides and merge
           them with the structured fields into pinned inputs (conflicts are violations).
        2. Read the nodes' facts, drop ineligible nodes (with reasons) and group the rest into pools of one GPU
           product; pools are tried smallest GPU memory first, layouts most GPUs per node first.
        3. For each layout, search the open settings (``search.search``) and return the first valid plan.
        Example: 8 H100 on one node, Qwen2.5-7B, GRPO -> 1 node x 8 GPUs, SP 1, TP 1, trainBatchSize 1025 ... the
        multiple of 8/gcd(8,5)=8 nearest 1024, i.e. 1024.

    Args:
        spec: The job spec.
        nodes: Kubernetes Node objects as camelCase dicts.

    Returns:
        The result: ``feasible`` with a plan, or the violations.
    """
    violations: list[Violation] = []
    warnings: list[str] = []
    version = spec.verl.version

    parsed, vs = parse_overrides(spec.overrides)
    violations += vs
    owned, passthrough, vs = read_owned(parsed, dialect.INPUT_KEYS)
    violations += vs
    reads, _, vs = read_owned(passthrough, dialect.READ_KEYS)
    violations += vs
    pins, vs = merge_pins(spec, owned)
    violations += vs
    r = _Reader(pins, reads)

    # The model.
    model_path = r.get_str("model_path") or spec.model.path
    shape = spec.model.shape
    params: float
    entry = catalog.lookup(model_path)
    if shape is None and entry is None:
        violations.append(
            Violation(
                field="spec.model.shape",
                rule="model-shape-required",
                message=f"{model_path!r} is not in the built-in catalog, so spec.model.shape is required",
                suggestions=[
                    "copy layers, hiddenSize, attentionHeads, kvHeads, ... from the model's config.json"
                ],
            )
        )
        return infeasible(violations, warnings)
    if shape is None:
        assert entry is not None
        shape, params = entry.shape, entry.params_total
    else:
        params = catalog.count_params(shape)[0]

    # Version-specific and unsupported settings.
    mode_pin = pins.get("rollout_mode")
    want_mode = dialect.rollout_mode_value(version)
    if spec.rollout.mode is not None and spec.rollout.mode != ("spmd" if version == "0.6" else "server"):
        violations.append(
            Violation(
                field="spec.rollout.mode",
                rule="rollout-mode",
                message=f"verl {version} runs vLLM in {'spmd' if version == '0.6' else 'server'} mode, not {spec.rollout.mode}",
                suggestions=[
                    f"use mode {'spmd' if version == '0.6' else 'server'}, or another spec.verl.version"
                ],
            )
        )
    if mode_pin is not None and mode_pin.value != want_mode:
        violations.append(
            Violation(
                field=mode_pin.source,
                rule="rollout-mode",
                message=f"verl {version} needs rollout.mode={want_mode}, not {mode_pin.value}"
                + (" (sync was removed in 0.7)" if version != "0.6" else ""),
                suggestions=[f"drop the override (the planner writes rollout.mode={want_mode})"],
            )
        )
    name_pin = pins.get("rollout_name")
    if name_pin is not None and name_pin.value != "vllm":
        violations.append(
            Violation(
                field=name_pin.source,
                rule="rollout-name",
                message=f"rollout engine {name_pin.value!r} is not supported; the planner models vLLM",
                suggestions=["use actor_rollout_ref.rollout.name=vllm"],
            )
        )
    for key in ("actor_strategy", "critic_strategy"):
        strat = r.get_str(key, reads=True)
        if strat is not None and strat not in ("fsdp", "fsdp2"):
            pin = reads[key]
            violations.append(
                Violation(
                    field=pin.source,
                    rule="strategy",
                    message=f"strategy {strat!r} is not supported; the planner models FSDP (fsdp, fsdp2)",
                    suggestions=["use strategy fsdp or fsdp2"],
                )
            )
    for key, label in (("rollout_pp", "pipeline_model_parallel_size"), ("rollout_dp", "data_parallel_size")):
        val = r.get_int(key, reads=True)
        if val is not None and val > 1:
            violations.append(
                Violation(
                    field=reads[key].source,
                    rule="rollout-parallelism",
                    message=f"rollout {label} {val} is not supported by the planner (rollout PP is not implemented in verl)",
                    suggestions=[f"drop the {label} override"],
                )
            )
    ep = r.get_int("rollout_ep", reads=True)

    adv = r.get_str("adv_estimator") or ("gae" if spec.algorithm.value == "ppo" else spec.algorithm.value)
    critic_enable = r.get_bool("critic_enable", reads=True)
    needs_critic = critic_enable if critic_enable is not None else adv == "gae"

    fixed = Fixed(
        train_batch_size=r.get_int("train_batch_size"),
        rollout_n=r.get_int("rollout_n"),
        rollout_tp=r.get_int("rollout_tp"),
        gpu_memory_utilization=r.get_float("gpu_memory_utilization"),
        sequence_parallel_size=r.get_int("sequence_parallel_size"),
        fsdp_size=r.get_int("fsdp_size"),
        ppo_mini_batch_size=r.get_int("ppo_mini_batch_size"),
        ppo_micro_batch_size_per_gpu=r.get_int("ppo_micro_batch_size_per_gpu"),
        ppo_micro_batch_size_global=r.get_int("ppo_micro_batch_size_global"),
        log_prob_micro_batch_size_per_gpu=r.get_int("log_prob_micro_batch_size_per_gpu"),
        log_prob_micro_batch_size_global=r.get_int("log_prob_micro_batch_size_global"),
        dynamic_batch_size=r.get_bool("dynamic_batch_size"),
        max_token_len_per_gpu=r.get_int("max_token_len_per_gpu"),
        log_prob_max_token_len_per_gpu=r.get_int("log_prob_max_token_len_per_gpu"),
        param_offload=r.get_bool("param_offload"),
        optimizer_offload=r.get_bool("optimizer_offload"),
        critic_ppo_micro_batch_size_per_gpu=r.get_int("critic_ppo_micro_batch_size_per_gpu"),
        critic_ppo_micro_batch_size_global=r.get_int("critic_ppo_micro_batch_size_global"),
    )
    for name in (
        "rollout_n",
        "rollout_tp",
        "sequence_parallel_size",
        "ppo_mini_batch_size",
        "train_batch_size",
    ):
        val = getattr(fixed, name)
        if val is not None and val < 1:
            violations.append(
                Violation(field=pins[name].source, rule="positive", message=f"{val} must be at least 1")
            )
    if ep is not None and ep > 1 and shape.num_experts is None:
        violations.append(
            Violation(
                field=reads["rollout_ep"].source,
                rule="rollout-expert-parallel",
                message=f"rollout expert_parallel_size {ep} needs a mixture-of-experts model",
                suggestions=["drop the expert_parallel_size override"],
            )
        )
    max_prompt = r.get_int("max_prompt_length") or spec.data.max_prompt_length
    max_response = r.get_int("max_response_length") or spec.data.max_response_length

    # trainer.nnodes / n_gpus_per_node must agree with the resources.
    nn_pin, gpn_val = r.get_int("nnodes"), r.get_int("n_gpus_per_node")
    gpus = spec.resources.gpus
    if gpn_val is not None and gpus % gpn_val:
        violations.append(
            Violation(
                field=pins["n_gpus_per_node"].source,
                rule="resources-agree",
                message=f"spec.resources.gpus {gpus} is not a multiple of {gpn_val} GPUs per node",
                suggestions=[f"use gpus {_or_near(gpus, gpn_val)}"],
            )
        )
    if nn_pin is not None:
        if gpn_val is not None and nn_pin * gpn_val != gpus:
            violations.append(
                Violation(
                    field=pins["nnodes"].source,
                    rule="resources-agree",
                    message=f"trainer.nnodes {nn_pin} x n_gpus_per_node {gpn_val} = {nn_pin * gpn_val} != spec.resources.gpus {gpus}",
                    suggestions=[f"set spec.resources.gpus: {nn_pin * gpn_val}, or drop trainer.nnodes"],
                )
            )
        elif gpn_val is None:
            if gpus % nn_pin:
                violations.append(
                    Violation(
                        field=pins["nnodes"].source,
                        rule="resources-agree",
                        message=f"spec.resources.gpus {gpus} does not split over trainer.nnodes {nn_pin}",
                        suggestions=["drop trainer.nnodes (the planner chooses the node count)"],
                    )
                )
            else:
                gpn_val = gpus // nn_pin
    violations += r.violations
    if violations:
        return infeasible(violations, warnings)

    # The cluster.
    facts = [node_facts(n) for n in nodes]
    pools, excluded = select(facts, spec)
    if not pools:
        reasons = sorted({v for v in excluded.values()})
        return infeasible(
            [
                Violation(
                    field="spec.resources",
                    rule="no-eligible-nodes",
                    message=f"none of the {len(facts)} nodes can host the job"
                    + (f" ({'; '.join(reasons[:5])})" if reasons else ""),
                    suggestions=["check spec.resources.gpuProduct, nodeSelector and tolerations"],
                )
            ]
        )

    group_n = 5 if adv in GROUP_ESTIMATORS else 1
    first_failure: list[Violation] | None = None
    any_layout = False
    for pool in pools:
        for layout in layouts(pool, spec, gpn_val):
            any_layout = True
            problem = Problem(
                version=version,
                shape=shape,
                params=params,
                needs_critic=needs_critic,
                uses_ref=bool(r.get_bool("use_kl_loss", reads=True))
                or bool(r.get_bool("use_kl_in_reward", reads=True)),
                lora=(r.get_int("lora_rank", reads=True) or 0) > 0,
                gradient_checkpointing=r.get_bool("gradient_checkpointing", reads=True) is not False,
                max_prompt_length=max_prompt,
                max_response_length=max_response,
                max_model_len=r.get_int("max_model_len"),
                max_num_batched_tokens=r.get_int("max_num_batched_tokens", reads=True) or 8192,
                max_num_seqs=r.get_int("max_num_seqs", reads=True) or 256,
                ref_param_offload=bool(r.get_bool("ref_param_offload", reads=True)),
                critic_offload=bool(r.get_bool("critic_param_offload", reads=True))
                and bool(r.get_bool("critic_optimizer_offload", reads=True)),
                nvlink_required=spec.placement.nvlink == "required",
                use_remove_padding=r.get_bool("use_remove_padding"),
                critic_max_token_len_per_gpu=r.get_int("critic_max_token_len_per_gpu", reads=True),
                gpu_memory_bytes=pool.memory_mib * 1024 * 1024,
                nvlink_domain=layout.nvlink_domain,
                pins=pins,
                max_position_embeddings=r.get_int("max_position_embeddings", reads=True),
                rollout_ep=ep,
            )
            outcome = search(problem, layout, fixed, group_n)
            if isinstance(outcome, Found):
                return _result(
                    spec, problem, layout, pool, excluded, outcome, passthrough, adv, model_path, r
                )
            if first_failure is None:
                first_failure = outcome.violations
    if not any_layout:
        biggest = max(len(p.nodes) for p in pools)
        return infeasible(
            [
                Violation(
                    field="spec.resources.gpus",
                    rule="not-enough-gpus",
                    message=(
                        f"{gpus} GPUs"
                        + (f" at {gpn_val} per node" if gpn_val else "")
                        + " do not fit the eligible nodes ("
                        + "; ".join(
                            f"{len(p.nodes)} x {p.product} with up to {max(n.gpus for n in p.nodes)} GPUs"
                            for p in pools
                        )
                        + ")"
                    ),
                    suggestions=[
                        "use a GPU count that is a multiple of the GPUs per node",
                        f"at most {biggest} nodes are eligible in one pool",
                    ],
                )
            ]
        )
    return infeasible(first_failure or [])


def _or_near(gpus: int, gpn: int) -> str:
    lo = (gpus // gpn) * gpn
    return " or ".join(str(v) for v in (lo, lo + gpn) if v > 0)


def _result(
    spec: VerlJobSpec,
    p: Problem,
    layout: Layout,
    pool: Pool,
    excluded: dict[str, str],
    found: Found,
    passthrough: Sequence[Any],
    adv: str,
    model_path: str,
    r: _Reader,
) -> PlanResult:
    s, est = found.settings, found.estimate
    dp = s.data_parallel_size
    warnings: list[str] = list(found.warnings)
    replicas = s.world // s.rollout_tp
    padded = rules.padded_trajectories(s, p.needs_critic)
    waste = padded - s.trajectories
    if waste and p.version != "0.6":
        warnings.append(
            f"verl pads {s.trajectories} trajectories to {padded} per step ({waste} zero-weight samples)"
        )
    seqs_per_replica = s.trajectories / replicas
    if seqs_per_replica * p.seq_len > est.kv_cache_tokens:
        warnings.append(
            f"each vLLM replica gets {seqs_per_replica:.0f} sequences of up to {p.seq_len} tokens but its KV cache "
            f"holds {est.kv_cache_tokens} tokens: vLLM will run them in waves"
        )
    if s.train_batch_size % s.ppo_mini_batch_size:
        warnings.append(
            f"trainBatchSize {s.train_batch_size} is not a multiple of ppoMiniBatchSize {s.ppo_mini_batch_size}"
        )
    per_gpu_mini = s.ppo_mini_batch_size * s.rollout_n // dp
    lp_per_gpu = (padded if p.version != "0.6" else s.trajectories) // dp
    micro = s.ppo_micro_batch_size_per_gpu
    lp_micro = s.log_prob_micro_batch_size_per_gpu
    overrides = dialect.emit(
        dialect.Emitted(
            version=p.version,
            model_path=model_path,
            adv_estimator=adv,
            train_files=_files(p.pins["train_files"].value) if "train_files" in p.pins else None,
            val_files=_files(p.pins["val_files"].value) if "val_files" in p.pins else None,
            train_batch_size=s.train_batch_size,
            max_prompt_length=p.max_prompt_length,
            max_response_length=p.max_response_length,
            nnodes=s.nnodes,
            gpus_per_node=s.gpus_per_node,
            rollout_n=s.rollout_n,
            rollout_tp=s.rollout_tp,
            gpu_memory_utilization=s.gpu_memory_utilization,
            max_model_len=p.max_model_len,
            sequence_parallel_size=s.sequence_parallel_size,
            fsdp_size=s.fsdp_size,
            ppo_mini_batch_size=s.ppo_mini_batch_size,
            ppo_micro_batch_size_per_gpu=micro,
            log_prob_micro_batch_size_per_gpu=lp_micro,
            dynamic_batch_size=s.dynamic_batch_size,
            max_token_len_per_gpu=s.max_token_len_per_gpu,
            log_prob_max_token_len_per_gpu=s.log_prob_max_token_len_per_gpu,
            param_offload=s.param_offload,
            optimizer_offload=s.optimizer_offload,
            critic=p.needs_critic,
            critic_ppo_micro_batch_size_per_gpu=s.critic_ppo_micro_batch_size_per_gpu,
        ),
        passthrough,
    )
    gpu_gib = p.gpu_memory_bytes / GIB

    def phase(ph: Any) -> MemoryPhase:
        return MemoryPhase(peak_gib=round(ph.peak_bytes / GIB, 2), parts_gib=ph.parts_gib())

    plan = Plan(
        verl_version=p.version,
        nodes=list(layout.candidates[: layout.nnodes]),
        nnodes=layout.nnodes,
        gpus_per_node=layout.gpus_per_node,
        candidate_nodes=list(layout.candidates),
        nvlink_group_size=max(s.rollout_tp, s.sequence_parallel_size) if p.nvlink_required else 1,
        world_size=s.world,
        data_parallel_size=dp,
        sequence_parallel_size=s.sequence_parallel_size,
        fsdp_size=s.fsdp_size,
        rollout=RolloutPlan(
            mode=dialect.rollout_mode_value(p.version),
            tensor_parallel_size=s.rollout_tp,
            replicas=replicas,
            prompts_per_replica=round(s.train_batch_size / replicas, 2),
            sequences_per_replica=round(seqs_per_replica, 2),
            gpu_memory_utilization=s.gpu_memory_utilization,
            max_model_len=p.max_model_len or p.seq_len,
            kv_cache_tokens_per_replica=est.kv_cache_tokens,
        ),
        batching=BatchingPlan(
            train_batch_size=s.train_batch_size,
            rollout_n=s.rollout_n,
            trajectories_per_step=s.trajectories,
            ppo_mini_batch_size=s.ppo_mini_batch_size,
            mini_batch_per_gpu=per_gpu_mini,
            ppo_micro_batch_size_per_gpu=micro,
            gradient_accumulation_steps=per_gpu_mini // micro if micro else None,
            log_prob_micro_batch_size_per_gpu=lp_micro,
            log_prob_passes_per_gpu=math.ceil(lp_per_gpu / lp_micro) if lp_micro else None,
            dynamic_batch_size=s.dynamic_batch_size,
            max_token_len_per_gpu=s.max_token_len_per_gpu,
            log_prob_max_token_len_per_gpu=s.log_prob_max_token_len_per_gpu,
            mini_batches_per_step=math.ceil(s.train_batch_size / s.ppo_mini_batch_size),
        ),
        memory=MemoryPlan(
            gpu_memory_gib=round(gpu_gib, 2),
            rollout_peak_gib=round(est.rollout.peak_bytes / GIB, 2),
            train_peak_gib=round(est.train.peak_bytes / GIB, 2),
            log_prob_peak_gib=round(est.log_prob.peak_bytes / GIB, 2),
            safety_factor=1.1,
            rollout=phase(est.rollout),
            train=phase(est.train),
            log_prob=phase(est.log_prob),
        ),
        padding=PaddingPlan(
            padded_trajectories=waste if p.version != "0.6" else 0,
            waste_fraction=round(waste / padded, 4) if padded and p.version != "0.6" else 0.0,
        ),
        node_pool=NodePoolPlan(
            gpu_product=pool.product,
            gpu_memory_mib=pool.memory_mib,
            nvlink_domain_size=layout.nvlink_domain,
            eligible_nodes=len(pool.nodes),
            excluded=dict(sorted(excluded.items())),
        ),
        overrides=overrides,
    )
    return PlanResult(feasible=True, violations=[], warnings=warnings, plan=plan)
