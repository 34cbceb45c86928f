"""The rules verl enforces for its asynchronous trainer modes, checked at admission.

Each rule cites the verl code that enforces it (0.9.1 wheel, 0.6.1 tag); verl checks them only after the
pods, Ray and the models are up. ``before_plan`` checks what the keys alone decide and returns the overrides
the trainer pool is planned with (the batch sizes the mode fixes); ``rollout_pool`` checks the standalone
rollout pool against the trainer plan's rollout replica.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from verl_operator.api.plan import RolloutPoolPlan, Violation
from verl_operator.planner.arith import nearest_divisor, nearest_multiple
from verl_operator.planner.pool_split import Split
from verl_operator.planner.pools import ARR, DEFAULTS, ModeInputs

TB = "data.train_batch_size"
MINI = f"{ARR}.actor.ppo_mini_batch_size"
PSS = "trainer.v1.separate_async.parameter_sync_step"
BACKEND = f"{ARR}.rollout.checkpoint_engine.backend"
RM_ENABLE = "reward.reward_model.enable"
RM_POOL = "reward.reward_model.enable_resource_pool"
SWITCH = "trainer.v1.separate_async.hybrid_rollout.enable_switch"
DISAGG = f"{ARR}.rollout.disaggregation.enabled"
HYBRID = f"{ARR}.hybrid_engine"
REQUIRE = "async_training.require_batches"
TRIGGER = "async_training.trigger_parameter_sync_step"
STALENESS = "async_training.staleness_threshold"
GEN_BATCH = "data.gen_batch_size"
#: The checkpoint engine verl's separate_async docs and the recipes' configs use.
SYNC_BACKEND = "nccl"


@dataclass(frozen=True)
class Before:
    """What the keys alone decide.

    Attributes:
        violations: Rules broken.
        extra: Overrides the trainer pool is planned with (the mode's batch sizes), appended to the user's.
        drop_keys: User keys the trainer pool's plan does not see (replaced by ``extra``).
        emit: Overrides the final plan adds for verl (a checkpoint engine the mode needs).
        replace: Keys whose emitted value differs from the trainer pool's (fully_async's train_batch_size 0).
        invariants: The mode's batch numbers for ``PoolsPlan.invariants``.
    """

    violations: list[Violation] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    drop_keys: frozenset[str] = frozenset()
    emit: list[str] = field(default_factory=list)
    replace: dict[str, str] = field(default_factory=dict)
    invariants: dict[str, int] = field(default_factory=dict)


def before_plan(version: str, inputs: ModeInputs, spec_rollout_mode: str | None = None) -> Before:
    """The mode's rules on the keys, and the batch sizes the trainer pool is planned with.

    Args:
        version: The release line.
        inputs: The mode and its keys.
        spec_rollout_mode: ``spec.rollout.mode`` (``spmd`` or ``server``), if set.
    """
    if inputs.mode == "separate_async":
        return _separate_async(inputs)
    if inputs.mode == "fully_async":
        before = _log_probs(_fully_async(version, inputs), version, inputs)
    elif inputs.mode == "one_step_off":
        before = Before()
    else:
        return Before()
    return _with_rollout_mode(_no_hybrid_engine(before, version, inputs), version, inputs, spec_rollout_mode)


def _no_hybrid_engine(before: Before, version: str, inputs: ModeInputs) -> Before:
    """fully_async and one_step_off train and roll out on separate GPUs: ``actor_rollout_ref.hybrid_engine``
    must be false (verl's default is true; unset, the plan emits false)."""
    where = {
        ("0.9", "fully_async"): "fully_async_trainer.py line 76, fully_async_rollouter.py line 350",
        ("0.9", "one_step_off"): "experimental/one_step_off_policy/ray_trainer.py line 88",
        ("0.6", "fully_async"): "recipe/fully_async_policy/fully_async_trainer.py line 65",
        ("0.6", "one_step_off"): "recipe/one_step_off_policy/fsdp_workers.py line 83",
    }[(version, inputs.mode)]
    return _require_bool(
        before,
        inputs,
        HYBRID,
        want=False,
        rule="async-hybrid-engine",
        why=f"{inputs.mode} trains and rolls out on separate pools",
        where=f"verl asserts not hybrid_engine: {where}",
    )


def _require_bool(
    before: Before, inputs: ModeInputs, key: str, *, want: bool, rule: str, why: str, where: str
) -> Before:
    """A boolean key the mode needs at ``want``: the other value refused (``why``, verl's assert at ``where``),
    unset emitted as ``want``, ``want`` kept."""
    value = _bool(inputs, key)
    if value is None:
        return replace(before, emit=[*before.emit, f"{key}={want}"])
    if value == want:
        return before
    return replace(
        before,
        violations=[
            *before.violations,
            Violation(
                field=inputs.source(key),
                rule=rule,
                message=f"{why}: {key} must be {str(want).lower()}, not {str(value).lower()} ({where})",
                suggestions=[f"set {key}={want}, or drop it"],
            ),
        ],
    )


LOG_PROBS = f"{ARR}.rollout.calculate_log_probs"


def _log_probs(before: Before, version: str, inputs: ModeInputs) -> Before:
    """fully_async trains on the rollout's own log-probs: ``actor_rollout_ref.rollout.calculate_log_probs``
    must be true (0.6.1's default is false, ``trainer/config/rollout/rollout.yaml`` line 197, 0.9.1's true, line
    237; unset, the plan emits true). verl asserts it in the rollouter's ``_validate_config`` (0.6.1
    ``recipe/fully_async_policy/fully_async_rollouter.py`` line 241, 0.9.1
    ``experimental/fully_async_policy/fully_async_rollouter.py`` line 733)."""
    where = (
        "recipe/fully_async_policy/fully_async_rollouter.py line 241"
        if version == "0.6"
        else "experimental/fully_async_policy/fully_async_rollouter.py line 733"
    )
    return _require_bool(
        before,
        inputs,
        LOG_PROBS,
        want=True,
        rule="fully-async-log-probs",
        why="fully_async trains on the rollout's log-probs",
        where=f"verl asserts it: {where}",
    )


MODE = f"{ARR}.rollout.mode"


def _with_rollout_mode(before: Before, version: str, inputs: ModeInputs, spec_mode: str | None) -> Before:
    """verl 0.6's rollout mode for a recipe: fully_async runs vLLM servers (``rollout.mode=async``, asserted by
    0.6.1 ``recipe/fully_async_policy/fully_async_rollouter.py`` line 283; unset, the plan emits it);
    one_step_off's Megatron workers run SPMD rollout only (``rollout.mode=sync``,
    ``recipe/one_step_off_policy/megatron_workers.py`` line 160). 0.9 has only ``async``."""
    if version != "0.6" or before.violations:
        return before
    pinned = inputs.text(MODE)
    source = inputs.source(MODE)
    if pinned is None and spec_mode is not None:
        pinned, source = {"spmd": "sync", "server": "async"}[spec_mode], "spec.rollout.mode"
    megatron = inputs.megatron_config or inputs.text(f"{ARR}.actor.strategy") == "megatron"
    need = "async" if inputs.mode == "fully_async" else ("sync" if megatron else None)
    if need is None:
        return before
    where = (
        "recipe/fully_async_policy/fully_async_rollouter.py line 283"
        if need == "async"
        else "recipe/one_step_off_policy/megatron_workers.py line 160"
    )
    if pinned is not None and pinned != need:
        return Before(
            violations=[
                Violation(
                    field=source,
                    rule="rollout-mode",
                    message=f"verl 0.6's {inputs.mode}{' (Megatron)' if need == 'sync' else ''} needs rollout.mode={need}, not {pinned} ({where})",
                    suggestions=[f"set {MODE}={need}, or drop it"],
                )
            ]
        )
    if pinned is None:
        return Before(
            violations=before.violations,
            extra=[*before.extra, f"{MODE}={need}"],
            drop_keys=before.drop_keys,
            emit=before.emit,
            replace=before.replace,
            invariants=before.invariants,
        )
    return before


def _bool(inputs: ModeInputs, key: str) -> bool | None:
    text = inputs.text(key)
    return None if text is None else text == "true"


def _colocated_reward(inputs: ModeInputs, where: str) -> list[Violation]:
    """No colocated reward model: the standalone rollout never pauses to free its GPUs."""
    if _bool(inputs, RM_ENABLE) and _bool(inputs, RM_POOL) is not True:
        return [
            Violation(
                field=inputs.source(RM_POOL if RM_POOL in inputs.texts else RM_ENABLE),
                rule="async-reward-model",
                message=(
                    f"{inputs.mode} refuses a colocated reward model ({RM_ENABLE}=true without "
                    f"{RM_POOL}=true): its rollout never pauses to free GPU memory ({where})"
                ),
                suggestions=[f"set {RM_POOL}=true (a reward model pool of its own)", f"or {RM_ENABLE}=false"],
            )
        ]
    return []


def _separate_async(inputs: ModeInputs) -> Before:
    """v1 separate_async: 0.9.1 ``trainer/ppo/v1/trainer_separate_async.py`` ``__init__`` (lines 55-103)."""
    out: list[Violation] = []
    pss = inputs.get_or_default(PSS)
    tb, mini = inputs.get(TB), inputs.get(MINI)
    extra: list[str] = []
    if pss < 1:
        out.append(
            Violation(
                field=inputs.source(PSS),
                rule="separate-async-batch",
                message=f"{PSS} {pss}: the trainer syncs weights every parameter_sync_step mini-batches (>= 1)",
                suggestions=[f"set {PSS}=1 or more (default 4)"],
            )
        )
        return Before(violations=out)
    if tb is not None and mini is not None and tb != pss * mini:
        suggestions = [f"set {TB}={pss * mini}"]
        if tb % pss == 0:
            suggestions.append(f"or {MINI}={tb // pss}")
        if mini > 0 and tb % mini == 0:
            suggestions.append(f"or {PSS}={tb // mini}")
        out.append(
            Violation(
                field=inputs.source(TB),
                rule="separate-async-batch",
                message=(
                    f"separate_async needs {TB} == {PSS} x ppo_mini_batch_size: {tb} != {pss} x {mini} = "
                    f"{pss * mini} (trainer_separate_async.py line 59)"
                ),
                suggestions=suggestions,
            )
        )
    elif tb is not None and mini is None:
        if tb % pss:
            out.append(
                Violation(
                    field=inputs.source(TB),
                    rule="separate-async-batch",
                    message=(
                        f"separate_async needs {TB} == {PSS} x ppo_mini_batch_size: {tb} is not a multiple of "
                        f"{pss} (trainer_separate_async.py line 59)"
                    ),
                    suggestions=[f"use {TB}={v}" for v in nearest_multiple(tb, pss)]
                    + [f"or {PSS}={d}" for d in nearest_divisor(pss, tb)],
                )
            )
        else:
            extra.append(f"{MINI}={tb // pss}")
    elif tb is None:
        mini = mini if mini is not None else int(DEFAULTS[MINI])
        extra += [f"{TB}={pss * mini}", f"{MINI}={mini}"]
    backend = inputs.text(BACKEND)
    if backend == "naive":
        out.append(
            Violation(
                field=inputs.source(BACKEND),
                rule="async-checkpoint-engine",
                message=(
                    "separate_async syncs weights to a standalone rollout pool: the naive checkpoint engine "
                    "(in-process, colocated only) cannot (trainer_separate_async.py line 68)"
                ),
                suggestions=[f"set {BACKEND}=nccl (or nixl, mooncake)"],
            )
        )
    emit = [f"{BACKEND}={SYNC_BACKEND}"] if backend is None else []
    out += _colocated_reward(inputs, "trainer_separate_async.py lines 71-76")
    if _bool(inputs, SWITCH) and _bool(inputs, HYBRID) is not False and _bool(inputs, DISAGG):
        out.append(
            Violation(
                field=inputs.source(SWITCH),
                rule="async-switch-disaggregation",
                message=(
                    f"{SWITCH}=true does not work with rollout prefill/decode disaggregation ({DISAGG}=true): "
                    "switching relies on paused replicas queueing new requests (trainer_separate_async.py "
                    "lines 95-103, ValueError)"
                ),
                suggestions=[f"set {SWITCH}=false", f"or {DISAGG}=false"],
            )
        )
    final_tb = tb if tb is not None else pss * (mini if mini is not None else int(DEFAULTS[MINI]))
    return Before(
        violations=out,
        extra=extra,
        emit=emit,
        invariants={"parameterSyncStep": pss, "trainBatchSize": final_tb, "miniBatchSize": final_tb // pss},
    )


def _fully_async(version: str, inputs: ModeInputs) -> Before:
    """fully_async: 0.9.1 ``experimental/fully_async_policy/fully_async_rollouter.py`` lines 350-365 (0.6.1
    ``recipe/fully_async_policy/fully_async_rollouter.py`` lines 65-70); its trainer consumes
    ``ppo_mini_batch_size x require_batches`` prompts per step (``fully_async_trainer.py`` lines 157-159)."""
    rollouter = (
        "fully_async_rollouter.py lines 351-356"
        if version == "0.9"
        else "recipe/fully_async_policy/fully_async_rollouter.py lines 66-70"
    )
    out: list[Violation] = []
    tb = inputs.get(TB)
    if tb is not None and tb != 0:
        out.append(
            Violation(
                field=inputs.source(TB),
                rule="fully-async-batch",
                message=(
                    f"fully_async streams prompts one at a time: {TB} must be 0 (got {tb}); the trainer's step "
                    f"is ppo_mini_batch_size x {REQUIRE} ({rollouter})"
                ),
                suggestions=[f"set {TB}=0 and size the step with {MINI} and {REQUIRE}"],
            )
        )
    gen = inputs.get(GEN_BATCH)
    if gen is not None and gen != 1:
        out.append(
            Violation(
                field=inputs.source(GEN_BATCH),
                rule="fully-async-batch",
                message=f"fully_async needs {GEN_BATCH}=1 (got {gen}; {rollouter})",
                suggestions=[f"set {GEN_BATCH}=1, or drop it (the recipe's config sets 1)"],
            )
        )
    for key, least in ((TRIGGER, 1), (REQUIRE, 1)):
        value = inputs.get_or_default(key)
        if value < least:
            out.append(
                Violation(
                    field=inputs.source(key),
                    rule="fully-async-batch",
                    message=f"{key} {value} must be at least {least} ({rollouter})",
                    suggestions=[f"set {key}={least} or more"],
                )
            )
    staleness = inputs.text(STALENESS)
    if staleness is not None and _negative(staleness):
        out.append(
            Violation(
                field=inputs.source(STALENESS),
                rule="fully-async-batch",
                message=f"{STALENESS} {staleness} must be >= 0 ({rollouter})",
                suggestions=[f"set {STALENESS}=0 (on-policy) or more (default 0.1)"],
            )
        )
    if version == "0.9":
        out += _colocated_reward(inputs, "fully_async_rollouter.py lines 360-365")
    if out:
        return Before(violations=out)
    mini = inputs.get_or_default(MINI)
    rb = inputs.get_or_default(REQUIRE)
    return Before(
        extra=[f"{TB}={mini * rb}", f"{MINI}={mini}"],
        drop_keys=frozenset({TB, MINI}),
        replace={TB: "0"},
        invariants={
            "miniBatchSize": mini,
            "requireBatches": rb,
            "trainerBatch": mini * rb,
            "triggerParameterSyncStep": inputs.get_or_default(TRIGGER),
        },
    )


def _negative(text: str) -> bool:
    try:
        return float(text) < 0
    except ValueError:
        return False


def removed_keys(version: str, keys: list[tuple[str, str]]) -> list[Violation]:
    """Keys a release removed that older scripts still set: 0.9.1 has no ``megatron.grad_offload`` (0.6.1's
    ``trainer/config/engine/megatron.yaml`` line 8 has it; 0.9.1's Hydra compose refuses the key)."""
    if version != "0.9":
        return []
    return [
        Violation(
            field=source,
            rule="removed-key",
            message=(
                f"{key}: verl 0.9.1 removed megatron.grad_offload (older scripts set it); "
                "Hydra refuses a key the config does not have"
            ),
            suggestions=[f"drop {key} (param_offload and optimizer_offload remain)"],
        )
        for key, source in keys
        if key.endswith("megatron.grad_offload")
    ]


def rollout_pool(
    version: str, inputs: ModeInputs, split: Split, tp: int, dp: int
) -> tuple[RolloutPoolPlan | None, list[Violation], list[str]]:
    """The standalone rollout pool's replicas of ``TP x DP`` GPUs.

    Rules: at least one replica; a replica larger than a node is whole nodes (0.9.1
    ``workers/rollout/replica.py`` line 114); GPUs that make no whole replica stay idle in 0.9.1
    (``workers/rollout/llm_server.py`` line 459: ``num_replicas = world_size // rollout_world_size``) and in
    0.6.1's fully_async (``agent_loop/agent_loop.py`` line 196), a warning; 0.6.1's one_step_off refuses them
    (``recipe/one_step_off_policy/fsdp_workers.py`` line 230, ``megatron_workers.py`` line 169).

    Returns:
        ``(the pool, violations, warnings)``.
    """
    replica = tp * dp
    gpus, gpn = split.rollout_gpus, split.rollout_gpn
    field_name = "spec.rollout.tensorParallelSize"
    if replica > gpus:
        return (
            None,
            [
                Violation(
                    field=field_name,
                    rule="rollout-pool",
                    message=(
                        f"a rollout replica of TP {tp} x DP {dp} = {replica} GPUs does not fit the rollout pool "
                        f"of {split.rollout_nnodes} x {gpn} = {gpus} GPUs"
                    ),
                    suggestions=[
                        f"give the rollout pool {replica}+ GPUs",
                        f"or a rollout TP of at most {gpus}",
                    ],
                )
            ],
            [],
        )
    if replica > gpn and replica % gpn:
        return (
            None,
            [
                Violation(
                    field=field_name,
                    rule="rollout-pool",
                    message=(
                        f"a rollout replica of {replica} GPUs spans nodes of the rollout pool's {gpn} GPUs per "
                        f"node: {replica} % {gpn} = {replica % gpn} (replica.py line 114)"
                    ),
                    suggestions=[f"use a replica of a multiple of {gpn} GPUs, or at most {gpn}"],
                )
            ],
            [],
        )
    replicas, idle = divmod(gpus, replica)
    violations: list[Violation] = []
    warnings: list[str] = []
    if idle and version == "0.6" and inputs.mode == "one_step_off":
        violations.append(
            Violation(
                field=field_name,
                rule="rollout-pool",
                message=(
                    f"verl 0.6's one_step_off asserts the rollout pool's {gpus} GPUs divide by the rollout TP "
                    f"{tp}: {gpus} % {tp} = {idle} (recipe/one_step_off_policy/fsdp_workers.py line 230)"
                ),
                suggestions=[f"use rollout TP {d}" for d in nearest_divisor(tp, gpus)]
                + [f"or a rollout pool of {v} GPUs" for v in nearest_multiple(gpus, replica)],
            )
        )
    elif idle:
        warnings.append(
            f"the rollout pool's {gpus} GPUs make {replicas} replicas of TP {tp} x DP {dp}; {idle} GPUs stay idle "
            f"(verl {version} starts gpus // {replica} replicas)"
        )
    plan = RolloutPoolPlan(
        gpus=gpus,
        nnodes=split.rollout_nnodes,
        gpus_per_node=gpn,
        mesh=f"{replicas} x tp{tp}" + (f" dp{dp}" if dp > 1 else ""),
        tensor_parallel_size=tp,
        data_parallel_size=dp,
        replicas=replicas,
        idle_gpus=idle,
    )
    return plan, violations, warnings
