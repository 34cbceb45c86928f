"""Resolve a job spec into the planner's inputs: the model, pinned values (structured fields and overrides
merged, types checked) and the settings the planner does not support, as violations."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from verl_operator.api.plan import Violation
from verl_operator.api.settings_registry import ARR, SETTINGS, Registry
from verl_operator.api.spec import ModelShape, VerlJobSpec
from verl_operator.planner import (
    catalog,
    dialect,
    megatron,
    megatron_memory,
    megatron_models,
    megatron_options,
    rules_checkpoint,
    rules_dtype,
    rules_engines,
    rules_shape,
    verl_keys,
)
from verl_operator.planner.inputs import Fixed, Problem, merge_pins
from verl_operator.planner.overrides import Override, Pinned, parse_overrides, read_owned
from verl_operator.planner.reader import Reader as _Reader

#: Estimators that sample a group of responses per prompt; an unpinned rollout.n is 5 for them, else 1.
GROUP_ESTIMATORS = frozenset(
    {"grpo", "rloo", "grpo_passk", "gpg", "optimal_token_baseline", "drgrpo", "gspo"}
)


@dataclass(frozen=True)
class ModelFacts:
    """A model the job trains: its path, shape and parameter count."""

    path: str
    shape: ModelShape
    params: float


@dataclass(frozen=True)
class Resolved:
    """A spec resolved into inputs: everything but the cluster.

    Attributes:
        problem: The fixed facts, with ``gpu_memory_bytes`` and ``nvlink_domain`` still to be set per pool
            (among them the model path, verl's ``algorithm.adv_estimator`` and the critic's model path).
        fixed: The pinned values.
        default_rollout_n: ``rollout.n`` when unpinned (5 for group-based estimators, else 1).
        gpus_per_node: Pinned GPUs per node (the field, ``trainer.n_gpus_per_node`` or derived from
            ``trainer.nnodes``), or None.
        passthrough: User overrides the planner does not own, in order.
        warnings: What verl accepts but the user should know (a repeated override key).
    """

    problem: Problem
    fixed: Fixed
    default_rollout_n: int
    gpus_per_node: int | None
    passthrough: tuple[Override, ...] = field(default_factory=tuple)
    warnings: tuple[str, ...] = ()


def resolve(spec: VerlJobSpec) -> Resolved | list[Violation]:
    """Resolve a spec; the violations when it is invalid before any cluster fact is needed.

    Args:
        spec: The job spec.
    """
    parsed, violations, warnings = parse_overrides(spec.overrides)
    violations += rules_dtype.dtype_conflicts(spec, parsed)
    violations += rules_checkpoint.checkpoint_conflicts(spec, parsed)
    # The training engine: chosen before the keys are checked against its config's keys.
    cn_indices, cn_engine, cn_vs = megatron.config_name_entries(spec.overrides)
    violations = [v for v in violations if v.field not in {f"spec.overrides[{i}]" for i in cn_indices}]
    training, vs = _training_engine(spec, parsed, cn_engine)
    violations += cn_vs + vs
    keys_line = megatron.keys_line(spec.verl.version, training.engine)
    violations += verl_keys.key_violations(parsed, keys_line)
    violations += rules_engines.added_dataclass_fields(
        parsed, spec.verl.version, verl_keys.known_keys(keys_line), verl_keys.source_release(keys_line)
    )
    owned, passthrough, vs = read_owned(parsed, dialect.INPUT_KEYS)
    violations += vs
    reads, _, vs = read_owned(passthrough, dialect.READ_KEYS, owned=False)
    violations += vs
    pins, vs = merge_pins(spec, owned)
    violations += vs
    r = _Reader(pins, reads)

    model = _model_facts(r.get_str("model_path") or spec.model.path, spec.model.shape, "spec.model.shape")
    if isinstance(model, Violation):
        return [*violations, model]
    violations += rules_shape.check_spec_shapes(spec)
    mode, vs = _rollout_mode(spec, pins)
    violations += vs + _unsupported(r)
    engine, vs, engine_warnings = rules_engines.resolve_engine(spec.verl.version, mode, r)
    violations += vs
    warnings += engine_warnings
    adv = r.get_str("adv_estimator") or ("gae" if spec.algorithm.value == "ppo" else spec.algorithm.value)
    critic_enable = r.get_bool("critic_enable", reads=True)
    needs_critic = critic_enable if critic_enable is not None else adv == "gae"
    critic = _critic_facts(spec, r, model) if needs_critic else None
    if isinstance(critic, Violation):
        violations.append(critic)
        critic = None
    fixed = _fixed(r)
    r.check_paths("train_files")
    r.check_paths("val_files")
    violations += _expert_parallel(r, model.shape)
    gpn_val, vs = _resources(spec, r)
    violations += vs + r.violations
    if violations:
        return violations
    problem = _problem(spec, r, model, critic, mode, needs_critic, engine, adv, training.engine)
    if training.engine == "megatron":
        fixed = megatron.fixed_offload(
            fixed, r.get_bool("megatron_param_offload"), r.get_bool("megatron_optimizer_offload")
        )
        r.violations += megatron_memory.check_recompute(r, model.shape, problem.megatron_options)
        r.violations += megatron.check_engine(r, problem, needs_critic)
        r.violations += _megatron_models(spec, r, problem.version, model, critic)
    if r.violations:
        return r.violations
    if vs := _mean_lengths(problem):
        return vs
    return Resolved(
        problem=problem,
        fixed=fixed,
        default_rollout_n=5 if adv in GROUP_ESTIMATORS else 1,
        gpus_per_node=gpn_val,
        passthrough=tuple(passthrough),
        warnings=tuple(warnings),
    )


# -- the model ------------------------------------------------------------------------------------------------
def _megatron_models(
    spec: VerlJobSpec, r: _Reader, version: str, actor: ModelFacts, critic: ModelFacts | None
) -> list[Violation]:
    """Rule ``megatron-model`` (``megatron_models``): the actor's model, and a critic's other model, on the
    path their ``megatron`` settings build them through."""
    models = [(actor, "spec.model.shape.modelType" if spec.model.shape else "spec.model.path", "")]
    if critic is not None and critic.path != actor.path:
        pin, named = r.reads.get("critic_model_path"), spec.critic.model
        if named is not None:
            field = "spec.critic.model.shape.modelType" if named.shape else "spec.critic.model.path"
        else:
            field = pin.source if pin is not None else "spec.critic.model"
        models.append((critic, field, "critic_"))
    out = []
    for facts, field, who in models:
        path = megatron_models.model_path(
            version,
            r.get_bool(f"megatron_{who}use_mbridge", reads=True),
            r.get_bool(f"megatron_{who}vanilla_mbridge", reads=True),
        )
        section = "critic" if who else f"{ARR}.actor"
        if v := megatron_models.check_model(facts.shape.model_type, field, path, section):
            out.append(v)
    return out


def _model_facts(path: str, shape: ModelShape | None, shape_field: str) -> ModelFacts | Violation:
    """The model at ``path``: ``shape`` when given, else the built-in catalog's entry."""
    entry = catalog.lookup(path)
    if shape is not None and shape.effective_head_dim < 1:
        return Violation(
            field=f"{shape_field}.hiddenSize",
            rule="model-shape",
            message=(
                f"hiddenSize {shape.hidden_size} / attentionHeads {shape.attention_heads} = "
                f"{shape.effective_head_dim}: the model's head dimension must be at least 1"
            ),
            suggestions=[f"set {shape_field}.headDim, or copy hiddenSize from the model's config.json"],
        )
    if shape is not None:
        return ModelFacts(path, shape, catalog.count_params(shape)[0])
    if entry is not None:
        return ModelFacts(path, entry.shape, entry.params_total)
    return Violation(
        field=shape_field,
        rule="model-shape-required",
        message=f"{path!r} is not in the built-in catalog, so {shape_field} is required",
        suggestions=["copy layers, hiddenSize, attentionHeads, kvHeads, ... from the model's config.json"],
    )


def _critic_facts(spec: VerlJobSpec, r: _Reader, actor: ModelFacts) -> ModelFacts | Violation:
    """The critic's model (``critic.model.path``, or ``spec.critic.model``; the actor's when neither names one)."""
    path = r.get_str("critic_model_path") or actor.path
    shape = spec.critic.model.shape if spec.critic.model is not None else None
    if shape is None and path == actor.path:
        return ModelFacts(path, actor.shape, actor.params)
    return _model_facts(path, shape, "spec.critic.model.shape")


# -- version-specific and unsupported settings -----------------------------------------------------------------
#: verl's ``rollout.mode`` for each ``spec.rollout.mode``.
SPEC_MODES = {"spmd": "sync", "server": "async"}


def _rollout_mode(spec: VerlJobSpec, pins: Mapping[str, Pinned]) -> tuple[str, list[Violation]]:
    """verl's ``rollout.mode``: pinned (override or ``spec.rollout.mode``), else the release line's default.

    verl 0.6 has both modes (``sync``: SPMD inside the training workers; ``async``: vLLM servers driven by
    the agent loop); verl 0.7 removed ``sync``.
    """
    version = spec.verl.version
    allowed = ("sync", "async") if version == "0.6" else ("async",)
    wanted: list[tuple[str, str]] = []
    if spec.rollout.mode is not None:
        wanted.append((SPEC_MODES[spec.rollout.mode], "spec.rollout.mode"))
    pin = pins.get("rollout_mode")
    if pin is not None:
        wanted.append((str(pin.value), pin.source))
    violations = [
        Violation(
            field=source,
            rule="rollout-mode",
            message=f"verl {version} has no rollout.mode={value}"
            + (" (sync was removed in 0.7)" if version != "0.6" else ""),
            suggestions=[f"use rollout.mode={' or '.join(allowed)}, or drop the setting"],
        )
        for value, source in wanted
        if value not in allowed
    ]
    values = {value for value, _ in wanted}
    if not violations and len(values) > 1:
        violations.append(
            Violation(
                field="spec.rollout.mode",
                rule="override-conflict",
                message=f"spec.rollout.mode = {spec.rollout.mode} but {wanted[-1][1]} = {wanted[-1][0]}",
                suggestions=["set one of them"],
            )
        )
    return (wanted[-1][0] if wanted else dialect.rollout_mode_value(version)), violations


def _unsupported(r: _Reader) -> list[Violation]:
    """Settings the planner does not model: another strategy, rollout pipeline or data parallelism (the
    engine: ``rules_engines.resolve_engine``)."""
    out: list[Violation] = []
    for key in ("actor_strategy", "critic_strategy"):
        strat = r.get_str(key, reads=True)
        if strat is not None and strat not in ("fsdp", "fsdp2", "megatron"):  # megatron: the Megatron engine
            out.append(
                Violation(
                    field=r.reads[key].source,
                    rule="strategy",
                    message=f"strategy {strat!r} is not supported; the planner models fsdp, fsdp2 and megatron",
                    suggestions=["use strategy fsdp, fsdp2 or megatron"],
                )
            )
    for key, label, why in UNSUPPORTED_ROLLOUT:
        val = r.get_int(key, reads=True)
        if val is not None and val < 1:
            # verl sizes a replica as TP x DP x PP (0.9.1 ``workers/rollout/replica.py``): 0 GPUs, and the
            # world's division by it fails at start.
            out.append(
                Violation(
                    field=r.reads[key].source,
                    rule="rollout-parallelism",
                    message=(
                        f"rollout {label} {val}: a replica is tensor_model_parallel_size x data_parallel_size x "
                        f"{label} GPUs, so {val} makes it 0 GPUs (ZeroDivisionError at start)"
                    ),
                    suggestions=[f"use {label}=1 (verl's default) or drop the override"],
                )
            )
        elif val is not None and val > 1:
            out.append(
                Violation(
                    field=r.reads[key].source,
                    rule="rollout-parallelism",
                    message=f"rollout {label} {val} is not supported: {why}",
                    suggestions=[f"drop the {label} override"],
                )
            )
    return out


UNSUPPORTED_ROLLOUT = (
    (
        "rollout_pp",
        "pipeline_model_parallel_size",
        "verl's vLLM, SGLang and TensorRT-LLM rollouts do not implement pipeline parallelism",
    ),
)
# rollout_dp (data parallelism inside a replica) is checked per engine: rules_engines.rollout_data_parallel.


def _expert_parallel(r: _Reader, shape: ModelShape) -> list[Violation]:
    ep = r.get_int("rollout_ep", reads=True)
    if ep is None or ep <= 1 or shape.num_experts is not None:
        return []
    return [
        Violation(
            field=r.reads["rollout_ep"].source,
            rule="rollout-expert-parallel",
            message=f"rollout expert_parallel_size {ep} needs a mixture-of-experts model",
            suggestions=["drop the expert_parallel_size override"],
        )
    ]


def _training_engine(
    spec: VerlJobSpec, parsed: list[Override], config_name: tuple[str, str] | None
) -> tuple[megatron.EngineChoice, list[Violation]]:
    """The training engine: ``spec.parallelism.engine``, the strategies, ``*.megatron.*`` keys and
    a pasted ``--config-name`` (``planner/megatron.py`` ``choose_engine``)."""
    spec_engine = spec.parallelism.engine
    keys = {key for key, name in dialect.INPUT_KEYS.items() if name in megatron.MEGATRON_SETTINGS}
    strategy_keys = (f"{ARR}.actor.strategy", "critic.strategy", f"{ARR}.ref.strategy")
    strategies = [
        (str(ov.value), ov.source) for ov in parsed if ov.key in strategy_keys and ov.value is not None
    ]
    mspec = spec.parallelism.megatron
    return megatron.choose_engine(
        (spec_engine, "spec.parallelism.engine") if spec_engine is not None else None,
        strategies,
        config_name,
        [ov.source for ov in parsed if ov.key in keys and ov.prefix != "~"]
        + (["spec.parallelism.megatron"] if mspec is not None and mspec.model_fields_set else []),
    )


# -- pinned values -----------------------------------------------------------------------------------------------
def _fixed(r: _Reader) -> Fixed:
    """Every field of ``Fixed``, read as its setting's kind (integers and numbers within their bounds):
    the integers first, then the booleans, then the numbers (the order of their violations)."""
    read: dict[str, Callable[[str], Any]] = {"int": r.get_int, "bool": r.get_bool, "float": r.get_float}
    names = sorted((f.name for f in fields(Fixed)), key=lambda name: list(read).index(SETTINGS[name].kind))
    return Fixed(**{name: read[SETTINGS[name].kind](name) for name in names})


# -- resources -----------------------------------------------------------------------------------------------------
def _resources(spec: VerlJobSpec, r: _Reader) -> tuple[int | None, list[Violation]]:
    """GPUs per node pinned by ``trainer.n_gpus_per_node`` or ``trainer.nnodes``, checked against the GPUs."""
    nn_pin, gpn_val = r.get_int("nnodes"), r.get_int("n_gpus_per_node")
    gpus = spec.resources.gpus
    if gpn_val is not None and gpus % gpn_val:
        return gpn_val, [
            Violation(
                field=r.pins["n_gpus_per_node"].source,
                rule="resources-agree",
                message=f"spec.resources.gpus {gpus} is not a multiple of {gpn_val} GPUs per node",
                suggestions=[f"use gpus {_or_near(gpus, gpn_val)}"],
            )
        ]
    if nn_pin is None:
        return gpn_val, []
    if gpn_val is not None and nn_pin * gpn_val != gpus:
        return gpn_val, [
            Violation(
                field=r.pins["nnodes"].source,
                rule="resources-agree",
                message=f"trainer.nnodes {nn_pin} x n_gpus_per_node {gpn_val} = {nn_pin * gpn_val} != spec.resources.gpus {gpus}",
                suggestions=[f"set spec.resources.gpus: {nn_pin * gpn_val}, or drop trainer.nnodes"],
            )
        ]
    if gpn_val is None and gpus % nn_pin:
        return None, [
            Violation(
                field=r.pins["nnodes"].source,
                rule="resources-agree",
                message=f"spec.resources.gpus {gpus} does not split over trainer.nnodes {nn_pin}",
                suggestions=["drop trainer.nnodes (the planner chooses the node count)"],
            )
        ]
    return gpn_val if gpn_val is not None else gpus // nn_pin, []


# -- the problem ---------------------------------------------------------------------------------------------------
def _problem(
    spec: VerlJobSpec,
    r: _Reader,
    model: ModelFacts,
    critic: ModelFacts | None,
    mode: str,
    needs_critic: bool,
    engine: str,
    adv: str,
    training_engine: str,
) -> Problem:
    """The facts the search holds fixed (memory and topology are filled in per node pool). The held settings
    resolved here are given explicitly; any other held row is its pin read as its kind (``_held``)."""
    max_prompt = r.get_int("max_prompt_length") or spec.data.max_prompt_length
    max_response = r.get_int("max_response_length") or spec.data.max_response_length
    # verl's default is 8192; 0.6's SPMD rollout rejects less than max_model_len with chunked prefill.
    model_len = r.get_int("max_model_len") or (max_prompt + max_response)
    batched = r.get_int("max_num_batched_tokens") or (max(8192, model_len) if mode == "sync" else 8192)
    given: dict[str, Any] = dict(
        adv_estimator=adv,
        model_path=model.path,
        # As the user wrote them: a list from the spec, a list or a single path from an override.
        train_files=r.pins["train_files"].value if "train_files" in r.pins else None,
        val_files=r.pins["val_files"].value if "val_files" in r.pins else None,
        max_prompt_length=max_prompt,
        max_response_length=max_response,
        max_model_len=r.get_int("max_model_len"),
        max_num_batched_tokens=batched,
        max_num_seqs=r.get_int("max_num_seqs", reads=True) or SETTINGS["max_num_seqs"].verl_default,
        ref_param_offload=bool(r.get_bool("ref_param_offload", reads=True)),
        gradient_checkpointing=r.get_bool("gradient_checkpointing", reads=True) is not False,
        use_remove_padding=r.get_bool("use_remove_padding"),
        critic_max_token_len_per_gpu=r.get_int("critic_max_token_len_per_gpu", reads=True),
        max_position_embeddings=r.get_int("max_position_embeddings", reads=True),
        rollout_ep=r.get_int("rollout_ep", reads=True),
        enable_chunked_prefill=r.get_bool("enable_chunked_prefill", reads=True) is not False,
        critic_sequence_parallel_size=r.get_int("critic_sequence_parallel_size", reads=True) or 1,
        rollout_mode=mode,
        rollout_name=engine,
        rollout_moe_tp=r.get_int("rollout_moe_tp", reads=True),
        rollout_dp=r.get_int("rollout_dp", reads=True),
        critic_model_path=critic.path if critic is not None else None,
        training_engine=training_engine,
        megatron_sequence_parallel=r.get_bool("megatron_sequence_parallel"),
    )
    return Problem(
        **given,
        **_held(r, given),
        dtype=spec.model.dtype,
        version=spec.verl.version,
        shape=model.shape,
        params=model.params,
        needs_critic=needs_critic,
        uses_ref=bool(r.get_bool("use_kl_loss", reads=True))
        or bool(r.get_bool("use_kl_in_reward", reads=True)),
        lora=(r.get_int("lora_rank", reads=True) or 0) > 0,
        critic_offload=bool(r.get_bool("critic_param_offload", reads=True))
        and bool(r.get_bool("critic_optimizer_offload", reads=True)),
        nvlink_required=spec.placement.nvlink == "required",
        gpu_memory_bytes=0,
        nvlink_domain=1,
        pins=r.pins,
        rollout_dp_source=(
            r.reads["rollout_dp"].source if "rollout_dp" in r.reads else Problem.rollout_dp_source
        ),
        critic_params=critic.params if critic is not None else None,
        mean_prompt_length=spec.data.mean_prompt_length,
        mean_response_length=spec.data.mean_response_length,
        entropy=_entropy_on(r),
        megatron_options=megatron_options.options_of(r),
    )


def _held(r: _Reader, given: Mapping[str, Any], registry: Registry = SETTINGS) -> dict[str, Any]:
    """The held settings not in ``given``: each pin read as its row's kind (an owned row's from the pins, a
    read row's from the reads), else the row's ``verl_default`` (``held="value"``) or None (``"pin"``)."""
    read: dict[str, Callable[..., Any]] = {
        "int": r.get_int,
        "bool": r.get_bool,
        "str": r.get_str,
        "float": lambda name, reads: r.get_float(name),
    }
    out: dict[str, Any] = {}
    for row in registry:
        if row.held is None or row.name in given:
            continue
        if row.kind not in read:
            raise ValueError(
                f"held setting {row.name!r} of kind {row.kind!r}: the resolver must give its value"
            )
        value = read[row.kind](row.name, reads=not row.owned)
        out[row.name] = row.verl_default if value is None else value
    return out


def _mean_lengths(p: Problem) -> list[Violation]:
    """A mean length of the data cannot exceed its maximum."""
    out = []
    for name, mean, top in (
        ("Prompt", p.mean_prompt_length, p.max_prompt_length),
        ("Response", p.mean_response_length, p.max_response_length),
    ):
        if mean is not None and mean > top:
            out.append(
                Violation(
                    field=f"spec.data.mean{name}Length",
                    rule="mean-length",
                    message=f"mean{name}Length {mean} > max{name}Length {top}: a mean cannot exceed the maximum",
                    suggestions=[f"set mean{name}Length to at most {top}, or raise max{name}Length"],
                )
            )
    return out


def _entropy_on(r: _Reader) -> bool:
    """``actor.entropy_coeff`` is set and not 0 (a value that is not a number counts as on)."""
    pin = r.reads.get("entropy_coeff")
    if pin is None or pin.value is None:
        return False
    return not (isinstance(pin.value, int | float) and not isinstance(pin.value, bool) and pin.value == 0)


def _or_near(gpus: int, gpn: int) -> str:
    lo = (gpus // gpn) * gpn
    return " or ".join(str(v) for v in (lo, lo + gpn) if v > 0)
