"""Resolve a job spec into the planner's inputs: the model, pinned values (structured fields and overrides
merged, types checked) and the settings the planner does not support, as violations."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from verl_operator.api.limits import DEFAULT_INT_BOUNDS, INPUT_BOUNDS
from verl_operator.api.spec import VerlJobSpec
from verl_operator.planner import catalog, dialect
from verl_operator.planner.inputs import Fixed, Problem, merge_pins
from verl_operator.planner.overrides import Override, Pinned, parse_overrides, read_owned
from verl_operator.planner.result import Violation

#: Estimators that sample a group of responses per prompt; an unpinned rollout.n is 5 for them, else 1.
GROUP_ESTIMATORS = frozenset(
    {"grpo", "rloo", "grpo_passk", "gpg", "optimal_token_baseline", "drgrpo", "gspo"}
)


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

    def _out_of_range(self, pin: Pinned, shown: str, lo: str, hi: str) -> None:
        self.violations.append(
            Violation(
                field=pin.source,
                rule="out-of-range",
                message=f"{shown} is outside the supported range {lo} to {hi}",
                suggestions=[f"use a value from {lo} to {hi}"],
            )
        )

    def get_int(self, name: str, reads: bool = False) -> int | None:
        """The pinned integer ``name``, or None; a value past ``limits.INPUT_BOUNDS`` is a violation."""
        pin = (self.reads if reads else self.pins).get(name)
        if pin is None or pin.value is None:
            return None
        if isinstance(pin.value, bool) or not isinstance(pin.value, int):
            self._bad(pin, "an integer")
            return None
        lo, hi = INPUT_BOUNDS.get(name, DEFAULT_INT_BOUNDS)
        if not lo <= pin.value <= hi:
            digits = len(str(abs(pin.value)))
            shown = str(pin.value) if digits <= 20 else f"a {digits}-digit integer"
            self._out_of_range(pin, shown, str(lo), str(hi))
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

    def get_float(self, name: str, low: float, high: float) -> float | None:
        """The pinned number ``name`` in ``(low, high]``, or None (a value outside is a violation)."""
        pin = self.pins.get(name)
        if pin is None or pin.value is None:
            return None
        if isinstance(pin.value, bool) or not isinstance(pin.value, int | float):
            self._bad(pin, "a number")
            return None
        value = pin.value
        if not (isinstance(value, int) or math.isfinite(value)) or not low < value <= high:
            shown = repr(value) if len(repr(value)) <= 20 else f"a {len(str(value))}-digit number"
            self._out_of_range(pin, shown, f"{low} (exclusive)", str(high))
            return None
        return float(value)

    def get_str(self, name: str, reads: bool = False) -> str | None:
        pin = (self.reads if reads else self.pins).get(name)
        return None if pin is None or pin.value is None else str(pin.value)


@dataclass(frozen=True)
class Resolved:
    """A spec resolved into inputs: everything but the cluster.

    Attributes:
        problem: The fixed facts, with ``gpu_memory_bytes`` and ``nvlink_domain`` still to be set per pool.
        fixed: The pinned values.
        model_path: The model path (an override of ``actor_rollout_ref.model.path`` agrees with the spec).
        adv_estimator: verl's ``algorithm.adv_estimator``.
        default_n: ``rollout.n`` when unpinned (5 for group-based estimators, else 1).
        gpus_per_node: Pinned GPUs per node (the field, ``trainer.n_gpus_per_node`` or derived from
            ``trainer.nnodes``), or None.
        passthrough: User overrides the planner does not own, in order.
    """

    problem: Problem
    fixed: Fixed
    model_path: str
    adv_estimator: str
    default_n: int
    gpus_per_node: int | None
    passthrough: tuple[Override, ...] = field(default_factory=tuple)


def resolve(spec: VerlJobSpec) -> Resolved | list[Violation]:
    """Resolve a spec; the violations when it is invalid before any cluster fact is needed.

    Args:
        spec: The job spec.
    """
    violations: list[Violation] = []
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
        return violations
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
    for key, label, why in (
        (
            "rollout_pp",
            "pipeline_model_parallel_size",
            "verl's vLLM rollout does not implement pipeline parallelism",
        ),
        (
            "rollout_dp",
            "data_parallel_size",
            "the planner does not model data parallelism inside a rollout replica",
        ),
    ):
        val = r.get_int(key, reads=True)
        if val is not None and val > 1:
            violations.append(
                Violation(
                    field=reads[key].source,
                    rule="rollout-parallelism",
                    message=f"rollout {label} {val} is not supported: {why}",
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
        # vLLM's fraction of the GPU memory: more than 0, at most all of it.
        gpu_memory_utilization=r.get_float("gpu_memory_utilization", 0.0, 1.0),
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
        return violations

    # verl's default is 8192; 0.6 rejects less than max_model_len with chunked prefill, so raise it there.
    model_len = r.get_int("max_model_len") or (max_prompt + max_response)
    batched = r.get_int("max_num_batched_tokens") or (max(8192, model_len) if version == "0.6" else 8192)
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
        max_num_batched_tokens=batched,
        max_num_seqs=r.get_int("max_num_seqs", reads=True) or 256,
        ref_param_offload=bool(r.get_bool("ref_param_offload", reads=True)),
        critic_offload=bool(r.get_bool("critic_param_offload", reads=True))
        and bool(r.get_bool("critic_optimizer_offload", reads=True)),
        nvlink_required=spec.placement.nvlink == "required",
        use_remove_padding=r.get_bool("use_remove_padding"),
        critic_max_token_len_per_gpu=r.get_int("critic_max_token_len_per_gpu", reads=True),
        gpu_memory_bytes=0,
        nvlink_domain=1,
        pins=pins,
        max_position_embeddings=r.get_int("max_position_embeddings", reads=True),
        rollout_ep=ep,
        chunked_prefill=r.get_bool("enable_chunked_prefill", reads=True) is not False,
        critic_sequence_parallel_size=r.get_int("critic_sequence_parallel_size", reads=True) or 1,
    )
    if r.violations:
        return r.violations
    return Resolved(
        problem=problem,
        fixed=fixed,
        model_path=model_path,
        adv_estimator=adv,
        default_n=5 if adv in GROUP_ESTIMATORS else 1,
        gpus_per_node=gpn_val,
        passthrough=tuple(passthrough),
    )


def _or_near(gpus: int, gpn: int) -> str:
    lo = (gpus // gpn) * gpn
    return " or ".join(str(v) for v in (lo, lo + gpn) if v > 0)
