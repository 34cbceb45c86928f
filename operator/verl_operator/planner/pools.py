"""verl's trainer modes and their GPU pools: which mode a job runs, and how its GPUs split into a trainer pool
and a standalone rollout pool.

``spec.resources.gpus`` is all of a job's GPUs. verl's colocated trainer (0.6's ``main_ppo``, 0.9's v1
``sync`` and ``colocate_async`` modes) runs on one pool of them. Three modes run two pools, each a Ray resource
pool of ``nnodes x n_gpus_per_node``:

- v1 ``separate_async`` (0.9, ``verl.trainer.main_ppo`` with ``trainer.v1.trainer_mode=separate_async``):
  the trainer pool is ``trainer.nnodes x trainer.n_gpus_per_node`` (it also hosts hybrid rollout replicas),
  the standalone rollout pool ``actor_rollout_ref.rollout.nnodes x actor_rollout_ref.rollout.n_gpus_per_node``
  (0.9.1 ``trainer/config/rollout/rollout.yaml`` lines 10-14; ``trainer_separate_async.py`` lines 64-67).
- ``fully_async`` and ``one_step_off`` (their own entry points: ``verl.experimental.*`` in 0.9,
  ``recipe.*`` in 0.6): the trainer pool as above, the rollout pool the top-level ``rollout.nnodes x
  rollout.n_gpus_per_node`` (0.6.1 ``recipe/fully_async_policy/fully_async_main.py`` lines 48-66,
  ``recipe/one_step_off_policy/main_ppo.py`` lines 143-149; 0.9.1 copies them into
  ``actor_rollout_ref.rollout``: ``fully_async_main.py`` lines 235-236, ``one_step_off_policy/main_ppo.py``
  lines 121-122).

The trainer pool is planned by the colocated planner on its own GPUs (``job_pools.plan_modes``); this module
reads the mode and its keys (``pool_split`` sizes the pools and rewrites the spec for the trainer pool,
``split_model`` picks an open split).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from verl_operator.api.plan import TrainerMode, Violation
from verl_operator.api.spec import VerlJobSpec
from verl_operator.planner.overrides import Override, parse_override
from verl_operator.planner.overrides import OverrideError as _OverrideError

ARR = "actor_rollout_ref"
MAIN_PPO = "verl.trainer.main_ppo"

#: The entry points of each release line and the mode each runs (None: the mode comes from the keys).
ENTRYPOINTS: dict[str, dict[str, TrainerMode | None]] = {
    "0.9": {
        MAIN_PPO: None,
        "verl.experimental.fully_async_policy.fully_async_main": "fully_async",
        "verl.experimental.one_step_off_policy.main_ppo": "one_step_off",
    },
    "0.6": {
        MAIN_PPO: None,
        "recipe.fully_async_policy.fully_async_main": "fully_async",
        "recipe.one_step_off_policy.main_ppo": "one_step_off",
    },
}
#: v1 trainer modes (0.9.1 ``trainer/config/ppo_trainer.yaml`` ``trainer.v1.trainer_mode``, default sync;
#: ``trainer/main_ppo.py`` line 141 ``get_trainer_cls``).
V1_MODES: tuple[TrainerMode, ...] = ("sync", "colocate_async", "separate_async")
TWO_POOLS: frozenset[str] = frozenset({"separate_async", "fully_async", "one_step_off"})
RECIPES: frozenset[str] = frozenset({"fully_async", "one_step_off"})

#: The rollout pool's keys per mode.
ROLLOUT_POOL_KEYS = {
    "separate_async": (f"{ARR}.rollout.nnodes", f"{ARR}.rollout.n_gpus_per_node"),
    "fully_async": ("rollout.nnodes", "rollout.n_gpus_per_node"),
    "one_step_off": ("rollout.nnodes", "rollout.n_gpus_per_node"),
}
TRAINER_POOL_KEYS = ("trainer.nnodes", "trainer.n_gpus_per_node")
#: Sections of the recipes' own configs (``fully_async_ppo_trainer.yaml``, ``one_step_off_ppo_trainer.yaml``)
#: that verl's ``ppo_trainer`` does not have: read here, passed to verl as written.
RECIPE_SECTIONS = ("rollout.", "async_training.")
#: Keys of the fully_async configs beyond ppo_trainer's (0.9.1 ``fully_async_ppo_trainer.yaml``, 0.6.1's).
RECIPE_KEYS = frozenset(
    {
        f"{ARR}.rollout.standalone_gpu_memory_utilization",
        f"{ARR}.actor.use_rollout_log_probs",
        "data.gen_batch_size",
    }
)
_FA_09 = (
    "async_training.staleness_threshold",
    "async_training.trigger_parameter_sync_step",
    "async_training.require_batches",
    "async_training.partial_rollout",
    "async_training.use_trainer_do_validate",
    "async_training.use_dynamic_resource_scheduling",
    "async_training.dynamic_schedule_policy",
    "async_training.dynamic_schedule_deactivate_ratio",
    "async_training.dynamic_schedule_enable_rebalance",
    "async_training.concurrent_samples_per_replica",
    "rollout.total_rollout_steps",
    f"{ARR}.rollout.standalone_gpu_memory_utilization",
)
_FA_06 = (
    "async_training.staleness_threshold",
    "async_training.trigger_parameter_sync_step",
    "async_training.require_batches",
    "async_training.partial_rollout",
    "async_training.use_rollout_log_probs",
    "async_training.compute_prox_log_prob",
    "rollout.total_rollout_steps",
    "rollout.total_epochs",
    "rollout.test_freq",
)
_COMMON = ("rollout.nnodes", "rollout.n_gpus_per_node")
_FA_COMMON = ("rollout.n", f"{ARR}.actor.use_rollout_log_probs", "data.gen_batch_size")
#: The keys each recipe's config adds to verl's ppo_trainer (FSDP and Megatron configs alike): 0.9.1
#: ``experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml``, ``one_step_off_ppo_trainer.yaml``;
#: 0.6.1 ``recipe/*/config/*.yaml``. The fidelity tier composes them with verl's own Hydra.
RECIPE_CONFIG_KEYS: dict[tuple[str, str], frozenset[str]] = {
    ("0.9", "fully_async"): frozenset((*_FA_09, *_COMMON, *_FA_COMMON)),
    ("0.6", "fully_async"): frozenset((*_FA_06, *_COMMON, *_FA_COMMON)),
    ("0.9", "one_step_off"): frozenset(_COMMON),
    ("0.6", "one_step_off"): frozenset(_COMMON),
}
#: The recipes' Hydra configs (``--config-name``); the Megatron ones plan as ``ppo_megatron_trainer``.
RECIPE_CONFIGS = {
    "fully_async_ppo_trainer": "",
    "fully_async_ppo_megatron_trainer": "ppo_megatron_trainer",
    "one_step_off_ppo_trainer": "",
    "one_step_off_ppo_megatron_trainer": "ppo_megatron_trainer",
}
#: The Megatron config of each recipe entry point (verl's ``ppo_megatron_trainer`` for the others).
MEGATRON_CONFIGS = {
    "verl.experimental.fully_async_policy.fully_async_main": "fully_async_ppo_megatron_trainer",
    "recipe.fully_async_policy.fully_async_main": "fully_async_ppo_megatron_trainer",
    "verl.experimental.one_step_off_policy.main_ppo": "one_step_off_ppo_megatron_trainer",
    "recipe.one_step_off_policy.main_ppo": "one_step_off_ppo_megatron_trainer",
}
CONFIG_ARG = re.compile(r"^\s*(?P<flag>--config-name|-cn|--config-path|-cp)(?:=|\s+)(?P<value>\S+)\s*$")

#: Defaults of the keys read here when unset (0.9.1 / 0.6.1 configs named in each use).
DEFAULTS: dict[str, int | bool | str] = {
    "trainer.v1.separate_async.parameter_sync_step": 4,  # ppo_trainer.yaml trainer.v1.separate_async
    "async_training.require_batches": 1,  # fully_async_ppo_trainer.yaml
    "async_training.trigger_parameter_sync_step": 4,
    f"{ARR}.actor.ppo_mini_batch_size": 256,  # actor.yaml
    f"{ARR}.rollout.checkpoint_engine.backend": "naive",  # rollout.yaml line 282
}


@dataclass(frozen=True)
class Int:
    """An integer read from the overrides, with where it came from."""

    value: int
    source: str


@dataclass(frozen=True)
class ModeInputs:
    """The trainer mode of a job and the keys it reads.

    Attributes:
        mode: The trainer mode.
        entrypoint: ``spec.verl.entrypoint``.
        ints: Integer keys given in the overrides (last one wins), by key.
        texts: Other scalar keys given, as written (booleans lower-case), by key.
        recipe_indices: Override positions of the recipes' own sections and config arguments (planned here,
            passed to verl as written; the trainer pool's plan does not see them).
        megatron_config: A recipe's Megatron config was named (``--config-name ..._megatron_trainer``).
        emit: The overrides the plan adds for the spec's mode fields (``spec.verl.trainerMode`` when no
            override sets ``trainer.v1.trainer_mode``).
    """

    mode: TrainerMode
    entrypoint: str
    ints: dict[str, Int] = field(default_factory=dict)
    texts: dict[str, tuple[str, str]] = field(default_factory=dict)
    recipe_indices: tuple[int, ...] = ()
    megatron_config: bool = False
    emit: tuple[str, ...] = ()

    @property
    def two_pools(self) -> bool:
        """The mode runs a trainer pool and a standalone rollout pool."""
        return self.mode in TWO_POOLS

    def get(self, key: str) -> int | None:
        """An integer key's value, None when unset."""
        pin = self.ints.get(key)
        return pin.value if pin is not None else None

    def get_or_default(self, key: str) -> int:
        """An integer key's value, else verl's default."""
        value = self.get(key)
        return value if value is not None else int(DEFAULTS[key])

    def text(self, key: str) -> str | None:
        """A key's value as written (booleans lower-case, integers too), None when unset."""
        pin = self.texts.get(key)
        if pin is None and key in self.ints:
            return str(self.ints[key].value)
        return pin[0] if pin is not None else None

    def source(self, key: str, default: str = "spec.overrides") -> str:
        """How a violation names the key."""
        if key in self.ints:
            return self.ints[key].source
        if key in self.texts:
            return self.texts[key][1]
        return f"{default} ({key})"


def _parse(raws: Sequence[str]) -> list[Override]:
    """The overrides that parse (the colocated planner reports the rest), the last of each key kept."""
    out: dict[str, Override] = {}
    for i, raw in enumerate(raws):
        try:
            ov = parse_override(raw, i)
        except _OverrideError:
            continue
        out.pop(ov.key, None)
        out[ov.key] = ov
    return list(out.values())


def _parse_all(raws: Sequence[str]) -> list[Override]:
    """Every override that parses, repeats included."""
    out = []
    for i, raw in enumerate(raws):
        try:
            out.append(parse_override(raw, i))
        except _OverrideError:
            continue
    return out


def read_mode(spec: VerlJobSpec) -> tuple[ModeInputs, list[Violation], list[str]]:
    """The trainer mode: ``spec.verl.entrypoint``, then (on ``verl.trainer.main_ppo``) ``trainer.use_v1`` and
    ``trainer.v1.trainer_mode``.

    An entry point of the other release line is a violation (0.9 moved the recipes to ``verl.experimental``);
    a module of neither table (a plugin's trainer) plans as ``main_ppo``.

    Returns:
        ``(inputs, violations, warnings)``.
    """
    version, module = spec.verl.version, spec.verl.entrypoint
    violations: list[Violation] = []
    warnings: list[str] = []
    parsed = _parse(spec.overrides)
    ints: dict[str, Int] = {}
    texts: dict[str, tuple[str, str]] = {}
    for ov in parsed:
        if ov.prefix == "~" or ov.value is None:
            continue
        if isinstance(ov.value, bool):
            texts[ov.key] = (str(ov.value).lower(), ov.source)
        elif isinstance(ov.value, int):
            ints[ov.key] = Int(ov.value, ov.source)
        elif isinstance(ov.value, str | float):
            texts[ov.key] = (str(ov.value), ov.source)
    for key, value, source in (
        ("data.train_batch_size", spec.data.train_batch_size, "spec.data.trainBatchSize"),
        (
            f"{ARR}.actor.ppo_mini_batch_size",
            spec.batching.ppo_mini_batch_size,
            "spec.batching.ppoMiniBatchSize",
        ),
    ):
        if value is not None and key not in ints:
            ints[key] = Int(value, source)
    table = ENTRYPOINTS.get(version, {})
    mode: TrainerMode = "sync"
    if module in table and table[module] is not None:
        mode = table[module] or "sync"
    elif module not in table:
        other = next((line for line, mods in ENTRYPOINTS.items() if line != version and module in mods), None)
        if other is not None:
            kind = ENTRYPOINTS[other][module]
            same = next((m for m, k in table.items() if k == kind), MAIN_PPO)
            violations.append(
                Violation(
                    field="spec.verl.entrypoint",
                    rule="entrypoint-release",
                    message=(
                        f"{module} is verl {other}'s entry point; verl {version} runs this trainer as {same}"
                        + (" (0.9 moved the recipes to verl.experimental)" if version == "0.9" else "")
                    ),
                    suggestions=[f"set spec.verl.entrypoint: {same}", f"or spec.verl.version: {other}"],
                ),
            )
    v1_mode = texts.get("trainer.v1.trainer_mode")
    use_v1 = texts.get("trainer.use_v1")
    emit: tuple[str, ...] = ()
    if spec.verl.trainer_mode is not None:
        problem = _spec_mode_problem(spec, table, v1_mode, use_v1)
        if problem is not None:
            violations.append(problem)
        elif v1_mode is None:
            v1_mode = (spec.verl.trainer_mode, SPEC_MODE)
            emit = (f"trainer.v1.trainer_mode={spec.verl.trainer_mode}",)
    if table.get(module) is None and version == "0.9":
        if v1_mode is not None:
            if v1_mode[0] not in V1_MODES:
                violations.append(
                    Violation(
                        field=v1_mode[1],
                        rule="trainer-mode",
                        message=f"trainer.v1.trainer_mode {v1_mode[0]!r} is not one of verl 0.9's v1 modes",
                        suggestions=[f"use {' or '.join(V1_MODES)}"],
                    )
                )
            elif use_v1 is not None and use_v1[0] == "false":
                warnings.append(
                    f"{v1_mode[1]} is ignored: trainer.use_v1=false runs the legacy colocated trainer "
                    "(0.9.1 trainer/main_ppo.py line 183)"
                )
            else:
                mode = next(m for m in V1_MODES if m == v1_mode[0])
    elif v1_mode is not None and mode in RECIPES:
        warnings.append(f"{v1_mode[1]} is ignored: {module} runs its own {mode} trainer")
    recipe_indices: list[int] = []
    megatron_config = False
    if mode in RECIPES:
        known = RECIPE_CONFIG_KEYS.get((version, mode), frozenset())
        for ov in _parse_all(spec.overrides):  # every occurrence: a repeated key leaves none behind
            if ov.key.startswith(RECIPE_SECTIONS) or (mode == "fully_async" and ov.key in RECIPE_KEYS):
                recipe_indices.append(ov.index)
                if ov.prefix in ("", "~") and ov.key not in known:
                    violations.append(_unknown_recipe_key(ov, module, known))
        for i, raw in enumerate(spec.overrides):
            match = CONFIG_ARG.match(raw)
            if match is None:
                continue
            config = str(match.group("value")).removesuffix(".yaml")
            if match.group("flag") in ("--config-path", "-cp"):
                recipe_indices.append(i)
            elif config in RECIPE_CONFIGS:
                recipe_indices.append(i)
                megatron_config = megatron_config or bool(RECIPE_CONFIGS[config])
    return (
        ModeInputs(
            mode=mode,
            entrypoint=module,
            ints=ints,
            texts=texts,
            recipe_indices=tuple(sorted(set(recipe_indices))),
            megatron_config=megatron_config,
            emit=emit,
        ),
        violations,
        warnings,
    )


SPEC_MODE = "spec.verl.trainerMode"


def _spec_mode_problem(
    spec: VerlJobSpec,
    table: dict[str, TrainerMode | None],
    v1_mode: tuple[str, str] | None,
    use_v1: tuple[str, str] | None,
) -> Violation | None:
    """Why ``spec.verl.trainerMode`` cannot hold: no v1 trainer in the release, a recipe's entry point, or an
    override that says otherwise (named with the spec field, as for the other pinned settings)."""
    want, module = spec.verl.trainer_mode, spec.verl.entrypoint
    if spec.verl.version != "0.9":
        return Violation(
            field=SPEC_MODE,
            rule="trainer-mode",
            message=(
                f"{SPEC_MODE} {want!r}: verl {spec.verl.version} has no v1 trainer (trainer.v1.trainer_mode is "
                "verl 0.9's)"
            ),
            suggestions=['set spec.verl.version: "0.9"', f"or drop {SPEC_MODE}"],
        )
    if table.get(module) is not None:
        return Violation(
            field=SPEC_MODE,
            rule="override-conflict",
            message=(
                f"{SPEC_MODE} = {want!r} but spec.verl.entrypoint {module} runs its own {table[module]} trainer "
                "(the v1 modes run under verl.trainer.main_ppo)"
            ),
            suggestions=[f"drop {SPEC_MODE}", f"or set spec.verl.entrypoint: {MAIN_PPO}"],
        )
    if v1_mode is not None and v1_mode[0] != want:
        return Violation(
            field=SPEC_MODE,
            rule="override-conflict",
            message=f"{SPEC_MODE} = {want!r} but {v1_mode[1]} = {v1_mode[0]!r}",
            suggestions=[f"drop {v1_mode[1]}, or set {SPEC_MODE} to {v1_mode[0]!r}"],
        )
    if use_v1 is not None and use_v1[0] == "false":
        return Violation(
            field=SPEC_MODE,
            rule="override-conflict",
            message=(
                f"{SPEC_MODE} = {want!r} but {use_v1[1]} = false runs verl's legacy trainer, which has no "
                "v1 modes (0.9.1 trainer/main_ppo.py line 183)"
            ),
            suggestions=[f"drop {use_v1[1]}", f"or drop {SPEC_MODE}"],
        )
    return None


def _unknown_recipe_key(ov: Override, module: str, known: frozenset[str]) -> Violation:
    """A recipe key its config does not have: Hydra's struct mode refuses it (``+key=`` adds one)."""
    close = difflib.get_close_matches(ov.key, sorted(known), n=2)
    return Violation(
        field=ov.source,
        rule="override-unknown-key",
        message=f"{ov.key} is not a key of {module}'s config (Hydra refuses an unknown key)",
        suggestions=[f"use {c}" for c in close] + [f"or +{ov.key}=... to add it, or drop it"],
    )


def megatron_config_name(module: str) -> str:
    """The Hydra config a Megatron job of ``module`` runs with (``--config-name``)."""
    return MEGATRON_CONFIGS.get(module, "ppo_megatron_trainer")
