"""The settings registry: one row per setting the planner pins, reads or emits.

A row says everything the operator knows about one setting: its logical name (the name of the planner's
input), the structured spec field that pins it (if any), the verl override keys that pin or feed it (every
spelling of every supported release line is accepted as input), the keys the planner emits for it per release
line, its bounds, the plan field it lands in and its description. The tables used elsewhere are derived from
the rows, never written again:

- the CRD's bounds, defaults and descriptions of those spec fields (:meth:`Registry.field`, used by
  ``api.spec``, which gives only each field's Python type);
- the planner's candidate and pins (``Chosen``, the base of ``planner.inputs.Settings``, and ``Fixed``) and
  the job's held settings (``Held``, the base of ``planner.inputs.Problem``), written as typed code by
  ``make settings`` (``api/settings_codegen.py``; a unit test fails on drift);
- the override reader's tables (``planner.dialect.INPUT_KEYS`` and ``READ_KEYS``), the spec paths named in
  violations (``planner.inputs.SPEC_PATHS``) and the structured fields merged into the pins;
- the integer bounds applied to pinned overrides (``planner.reader``);
- the keys the dialect emitter writes, in row order, for the jobs each row applies to (``engine``,
  ``batching``, ``critic_only``, ``optional``; ``planner.dialect.emit``, which refuses a row it has no value
  for; importing ``planner.dialect`` fails on such a row), and the engine's settings (``planner.megatron.MEGATRON_SETTINGS``, ``FSDP_ONLY_SETTINGS``);
- the plan fields that carry a setting as chosen (``planner.report``), and the batching ones' types and
  status-schema descriptions (``api/_plan_generated.py``, the base of ``api.plan.BatchingPlan``, also
  written by ``make settings``).

Adding a setting is adding a row, the rule or search step that uses it and its tests (see ``docs/planner.md``,
"Settings registry: adding a setting"). The rows are plain data: the api layer is the bottom of the import
layers, so the planner reads it and it imports no planner code.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from verl_operator.api import limits as L

#: The verl release lines a row's emitted keys are given for (``api.spec.SUPPORTED_VERL_VERSIONS``).
LINES: tuple[str, ...] = ("0.6", "0.9")

ARR = "actor_rollout_ref"

#: How the planner reads a pinned value (``planner.reader``): an integer in bounds, True/False, a number in
#: bounds, text, or a path or list of paths.
Kind = Literal["int", "bool", "float", "str", "paths", "any"]


@dataclass(frozen=True)
class Bounds:
    """The lowest and highest value; ``low_exclusive``: the lowest is not allowed (``gt`` instead of ``ge``)."""

    low: int | float
    high: int | float
    low_exclusive: bool = False


@dataclass(frozen=True)
class SettingRow:
    """One setting.

    Attributes:
        name: The logical name: the planner's input (``train_batch_size``).
        kind: How a pinned value is read (see :data:`Kind`).
        description: What it is; the CRD's description of the spec field when ``spec`` is set.
        spec: The spec field that pins it, as a camelCase path under ``spec`` (``data.trainBatchSize``); None
            for a setting pinned by overrides only.
        keys: The override keys that pin it (owned) or that the planner reads (not owned), every release
            line's spelling: all are accepted as input, and keys of one setting must agree.
        owned: The planner owns the keys: they pin the input, are taken out of the pass-through overrides and
            the planner emits its own value. Not owned: read (memory model, checks), passed through unchanged.
        emits: The keys the planner emits with the setting's value, for every release line.
        emits_by_line: Release line -> the emitted keys where the lines spell them differently.
        bounds: The bounds of a number (the spec field's and a pinned override's).
        plan: The plan field that carries the chosen value, as a camelCase path under ``status.plan``.
        engine: The training engine whose config has the keys: emitted for that engine only (``megatron``'s
            keys also select the engine); None: both.
        batching: Emitted only with dynamic batch size (``dynamic``: the token budgets) or only without it
            (``static``: the micro-batch sizes); None: either way.
        critic_only: Emitted only for a job with a critic.
        optional: Emitted only when the plan has a value (None leaves the keys out).
        search: ``choose``: the search decides the value (a field of the planner's ``Chosen``, the candidate,
            and of ``Fixed``, the pin); ``keep``: every candidate keeps the pin as it is (None unless pinned;
            the rules check it, the emitter writes it back: ``optional``); ``pin``: the search only reads the
            pin (a field of ``Fixed``); None: neither (``planner/_settings_generated.py``, ``make settings``).
        held: The job's value, held fixed while the search varies the candidate: a field of the planner's
            ``Held`` (the base of ``planner.inputs.Problem``; the emitter reads it there). ``value``: always
            set (``verl_default`` when the row has one and the job sets none); ``pin``: None unless set.
            ``planner.resolve`` reads a held row's pin as its ``kind`` unless it computes the value itself.
        verl_default: verl's default: the value a chosen setting has where the job does not use it, and a held
            setting's when the job sets none.
        spec_default: The spec field's default (None: the field is optional and pins nothing unless set; a
            ``paths`` field is an empty list, at most ``limits.MAX_FILES`` long).
    """

    name: str
    kind: Kind
    description: str
    spec: str | None = None
    keys: tuple[str, ...] = ()
    owned: bool = True
    emits: tuple[str, ...] = ()
    emits_by_line: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    bounds: Bounds | None = None
    plan: str | None = None
    engine: Literal["fsdp", "megatron"] | None = None
    batching: Literal["static", "dynamic"] | None = None
    critic_only: bool = False
    optional: bool = False
    search: Literal["choose", "keep", "pin"] | None = None
    held: Literal["value", "pin"] | None = None
    verl_default: int | float | bool | str | None = None
    spec_default: int | float | bool | str | None = None

    def emitted(self, line: str) -> tuple[str, ...]:
        """The keys emitted for the release line ``line`` (none: the planner does not emit it)."""
        return self.emits_by_line.get(line, self.emits)

    def applies(self, *, engine: str, dynamic: bool, critic: bool) -> bool:
        """The row's keys belong on the command line of a job with this engine, batching and critic."""
        return (
            self.engine in (None, engine)
            and self.batching in (None, "dynamic" if dynamic else "static")
            and (critic or not self.critic_only)
        )

    @property
    def unset_in_some_jobs(self) -> bool:
        """The setting has no value in some jobs (emitted only with some batching, with a critic or when set):
        its candidate field and its plan field may be None."""
        return self.batching is not None or self.critic_only or self.optional

    @property
    def spec_path(self) -> str | None:
        """The spec field as violations name it (``spec.data.trainBatchSize``)."""
        return f"spec.{self.spec}" if self.spec is not None else None


class Registry:
    """The rows, in the order the planner emits their keys; the tables derived from them."""

    def __init__(self, rows: Iterable[SettingRow]) -> None:
        self.rows: tuple[SettingRow, ...] = tuple(rows)
        self._by_name = {row.name: row for row in self.rows}
        _check(self.rows)

    def __getitem__(self, name: str) -> SettingRow:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[SettingRow]:
        return iter(self.rows)

    def with_rows(self, *rows: SettingRow) -> Registry:
        """A copy with ``rows`` added at the end (a row of the same name is replaced in place)."""
        new = {row.name: row for row in rows}
        kept = [new.pop(row.name, row) for row in self.rows]
        return Registry([*kept, *new.values()])

    def input_keys(self) -> dict[str, str]:
        """Override key -> setting, for the keys the planner owns (``dialect.INPUT_KEYS``)."""
        return {key: row.name for row in self.rows if row.owned for key in row.keys}

    def read_keys(self) -> dict[str, str]:
        """Override key -> setting, for the keys the planner reads and passes through (``dialect.READ_KEYS``)."""
        return {key: row.name for row in self.rows if not row.owned for key in row.keys}

    def engine_settings(self, engine: str) -> tuple[str, ...]:
        """The owned settings that exist only in ``engine``'s config (``megatron``: their keys select it)."""
        return tuple(row.name for row in self.rows if row.owned and row.engine == engine)

    def spec_paths(self) -> dict[str, str]:
        """Setting -> the spec field that pins it (``spec.data.trainBatchSize``), for those with one."""
        return {row.name: row.spec_path for row in self.rows if row.spec_path is not None}

    def int_bounds(self) -> dict[str, tuple[int, int]]:
        """Setting -> ``(lowest, highest)`` of the integer settings with bounds."""
        return {
            row.name: (int(row.bounds.low), int(row.bounds.high))
            for row in self.rows
            if row.kind == "int" and row.bounds is not None
        }

    def emitted(self, line: str) -> list[tuple[str, tuple[str, ...]]]:
        """``(setting, keys)`` of every setting the planner emits for ``line``, in row order."""
        return [(row.name, keys) for row in self.rows if (keys := row.emitted(line))]

    def plan_fields(self, section: str = "") -> dict[str, str]:
        """Setting -> its snake_case plan field directly under ``section`` (``"batching"``; ``""``: the plan)."""
        prefix = f"{section}." if section else ""
        out: dict[str, str] = {}
        for row in self.rows:
            if row.plan is None or not row.plan.startswith(prefix):
                continue
            rest = row.plan[len(prefix) :]
            if "." not in rest:
                out[row.name] = _snake(rest)
        return out

    def field(self, name: str, **kwargs: Any) -> Any:
        """The pydantic ``Field`` of the spec field of ``name``: its description, bounds and default from the
        row (``api.spec`` gives only the Python type); ``kwargs`` add to them."""
        row = self[name]
        if row.spec is None:
            raise ValueError(f"setting {name!r} has no spec field (its row's spec is None)")
        args: dict[str, Any] = {"description": row.description}
        if row.bounds is not None:
            args["gt" if row.bounds.low_exclusive else "ge"] = row.bounds.low
            args["le"] = row.bounds.high
        if row.kind == "paths":
            args.update(default_factory=list, max_length=L.MAX_FILES)
        else:
            args["default"] = row.spec_default
            # A default given as text (an enum's value) becomes the field's type (``Algorithm.GRPO``).
            args["validate_default"] = row.spec_default is not None
        return Field(**{**args, **kwargs})


def _snake(camel: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)


def _check(rows: tuple[SettingRow, ...]) -> None:
    """A registry is consistent: names and keys unique, every emitted key one the planner owns (so that the
    user's own copy of it is taken out of the pass-through overrides), bounds in order."""
    names: set[str] = set()
    keys: dict[str, str] = {}
    for row in rows:
        if row.name in names:
            raise ValueError(f"setting {row.name!r} is registered twice")
        names.add(row.name)
        for key in row.keys:
            if key in keys:
                raise ValueError(f"override key {key!r} belongs to {keys[key]!r} and {row.name!r}")
            keys[key] = row.name
        if row.bounds is not None and not row.bounds.low <= row.bounds.high:
            raise ValueError(f"setting {row.name!r}: bounds {row.bounds} are not in order")
        if unknown := set(row.emits_by_line) - set(LINES):
            raise ValueError(f"setting {row.name!r}: no release line {sorted(unknown)}")
        if row.held is not None and row.search in ("choose", "keep"):
            raise ValueError(
                f"setting {row.name!r} is held by the job and also a candidate's (search={row.search!r})"
            )
        if row.search == "keep" and not row.optional:
            raise ValueError(
                f"setting {row.name!r} is kept as pinned (None unless pinned): it must be optional"
            )
    owned = {key for row in rows if row.owned for key in row.keys}
    for row in rows:
        for line in LINES:
            if stray := [k for k in row.emitted(line) if k not in owned]:
                raise ValueError(f"setting {row.name!r} emits {stray} for {line}, which no owned row reads")


def _row(name: str, kind: Kind, description: str, *keys: str, emit: bool = True, **kw: Any) -> SettingRow:
    """An owned row; ``emit``: the planner emits every one of its keys (else pass ``emits=``)."""
    if emit and "emits" not in kw:
        kw["emits"] = keys
    return SettingRow(name=name, kind=kind, description=description, keys=keys, **kw)


def _read(name: str, kind: Kind, description: str, *keys: str, **kw: Any) -> SettingRow:
    """A row the planner reads and passes through."""
    return SettingRow(name=name, kind=kind, description=description, keys=keys, owned=False, **kw)


def _int(low: int, high: int) -> Bounds:
    return Bounds(low, high)


# -- the Megatron engine -----------------------------------------------------------------------
#: The Megatron parallel sizes: ``(setting, McoreEngineConfig field, spec field under parallelism.megatron)``.
#: Both release lines spell them the same (0.6.1 and 0.9.1 ``trainer/config/engine/megatron.yaml``,
#: ``workers/config/engine.py`` ``McoreEngineConfig``); the actor's, the ref's and the critic's copies are one
#: setting (verl 0.6.1 ``workers/megatron_workers.py`` lines 210-219 initialise megatron-core's groups once per
#: process from the actor's values, so a colocated ref or critic with other sizes would be ignored).
MEGATRON_SIZES: tuple[tuple[str, str, str], ...] = (
    ("megatron_tp", "tensor_model_parallel_size", "tensorParallelSize"),
    ("megatron_pp", "pipeline_model_parallel_size", "pipelineParallelSize"),
    ("megatron_vpp", "virtual_pipeline_model_parallel_size", "virtualPipelineParallelSize"),
    ("megatron_cp", "context_parallel_size", "contextParallelSize"),
    ("megatron_ep", "expert_model_parallel_size", "expertParallelSize"),
    ("megatron_etp", "expert_tensor_parallel_size", "expertTensorParallelSize"),
)
_MEGATRON_DESCRIPTIONS = {
    "megatron_tp": "Megatron tensor parallel size of actor, ref and critic (a group inside one NVLink domain).",
    "megatron_pp": "Megatron pipeline parallel size (the layers divide by it).",
    "megatron_vpp": "Megatron virtual pipeline stages per pipeline rank (none unless set; needs PP > 1).",
    "megatron_cp": "Megatron context parallel size (long sequences).",
    "megatron_ep": "Megatron expert parallel size (mixture-of-experts models; the experts divide by it).",
    "megatron_etp": "Megatron expert tensor parallel size (the tensor parallel size unless set).",
}
#: The sizes verl leaves unset unless pinned (no virtual pipeline; ETP follows TP): emitted only when set.
_MEGATRON_UNSET = ("megatron_vpp", "megatron_etp")
MEGATRON_ROWS: tuple[SettingRow, ...] = (
    # Read from spec.parallelism.engine, actor.strategy / critic.strategy (their rows) and the
    # ``--config-name ppo_megatron_trainer`` of a pasted script; carried to the launcher as the config name.
    _row(
        "training_engine",
        "str",
        "The training engine: fsdp (default) or megatron (verl's ppo_megatron_trainer config).",
        spec="parallelism.engine",
        emit=False,
        plan="training.engine",
        held="value",
        verl_default="fsdp",
    ),
    *(
        _row(
            name,
            "int",
            _MEGATRON_DESCRIPTIONS[name],
            f"{ARR}.actor.megatron.{key}",
            f"{ARR}.ref.megatron.{key}",
            f"critic.megatron.{key}",
            spec=f"parallelism.megatron.{wire}",
            bounds=_int(1, L.MAX_PARALLEL),
            emits=(f"{ARR}.actor.megatron.{key}", f"{ARR}.ref.megatron.{key}"),
            plan=f"training.{wire}",
            engine="megatron",
            optional=name in _MEGATRON_UNSET,
            search="choose",
            verl_default=None if name in _MEGATRON_UNSET else 1,
        )
        for name, key, wire in MEGATRON_SIZES
    ),
    # The critic's copies, emitted only for a job with a critic (their keys pin the settings above).
    *(
        SettingRow(
            name=f"critic_{name}",
            kind="int",
            description=f"The critic's copy of {name}.",
            emits=(f"critic.megatron.{key}",),
            bounds=_int(1, L.MAX_PARALLEL),
            engine="megatron",
            critic_only=True,
            optional=name in _MEGATRON_UNSET,
        )
        for name, key, _ in MEGATRON_SIZES
    ),
    _row(
        "megatron_sequence_parallel",
        "bool",
        "Megatron sequence parallelism (on by default; verl turns it off at TP 1).",
        f"{ARR}.actor.megatron.sequence_parallel",
        f"{ARR}.ref.megatron.sequence_parallel",
        "critic.megatron.sequence_parallel",
        emit=False,
        engine="megatron",
        held="pin",
    ),
    _row(
        "megatron_param_offload",
        "bool",
        "The actor's Megatron parameter offload (spec.offload.params with the megatron engine).",
        f"{ARR}.actor.megatron.param_offload",
        engine="megatron",
    ),
    _row(
        "megatron_optimizer_offload",
        "bool",
        "The actor's Megatron optimizer offload (spec.offload.optimizer with the megatron engine).",
        f"{ARR}.actor.megatron.optimizer_offload",
        engine="megatron",
    ),
    # Read by the Megatron memory model (planner/megatron_memory.py) and passed through.
    _read(
        "megatron_grad_offload",
        "bool",
        "The actor's Megatron gradient offload.",
        f"{ARR}.actor.megatron.grad_offload",
    ),
    _read(
        "megatron_ref_param_offload",
        "bool",
        "The Megatron reference model's parameter offload.",
        f"{ARR}.ref.megatron.param_offload",
    ),
    _read(
        "megatron_optimizer_cpu_offload",
        "bool",
        "megatron-core's hybrid CPU optimizer (override_optimizer_config).",
        f"{ARR}.actor.optim.override_optimizer_config.optimizer_cpu_offload",
    ),
    _read(
        "megatron_precision_aware_optimizer",
        "bool",
        "megatron-core's precision-aware optimizer (override_optimizer_config).",
        f"{ARR}.actor.optim.override_optimizer_config.use_precision_aware_optimizer",
    ),
    _read(
        "megatron_optimizer_offload_fraction",
        "any",
        "The share of the optimizer state the hybrid CPU optimizer keeps on the CPU (0 to 1).",
        f"{ARR}.actor.optim.override_optimizer_config.optimizer_offload_fraction",
    ),
    _read(
        "megatron_recompute_granularity",
        "str",
        "Megatron activation recompute: full or selective (none by default).",
        f"{ARR}.actor.megatron.override_transformer_config.recompute_granularity",
    ),
    _read(
        "megatron_recompute_modules",
        "any",
        "The submodules selective Megatron recompute recomputes (verl's default [core_attn]).",
        f"{ARR}.actor.megatron.override_transformer_config.recompute_modules",
    ),
    _read(
        "megatron_use_mbridge",
        "bool",
        "The actor's Megatron model built through Megatron-Bridge (verl 0.9's engine requires it).",
        f"{ARR}.actor.megatron.use_mbridge",
    ),
    _read(
        "megatron_critic_use_mbridge",
        "bool",
        "The critic's Megatron model built through Megatron-Bridge.",
        "critic.megatron.use_mbridge",
    ),
    _read(
        "megatron_vanilla_mbridge",
        "bool",
        "verl 0.9's Megatron actor built through the legacy mbridge instead of Megatron-Bridge.",
        f"{ARR}.actor.megatron.vanilla_mbridge",
    ),
    _read(
        "megatron_critic_vanilla_mbridge",
        "bool",
        "verl 0.9's Megatron critic built through the legacy mbridge.",
        "critic.megatron.vanilla_mbridge",
    ),
    _read(
        "megatron_dynamic_cp",
        "bool",
        "verl 0.9's dynamic context parallelism of the Megatron actor.",
        f"{ARR}.actor.megatron.dynamic_context_parallel",
    ),
    _read(
        "megatron_remove_padding",
        "bool",
        "The Megatron actor packs sequences without padding (verl 0.9's engine setting).",
        f"{ARR}.actor.megatron.use_remove_padding",
    ),
    _read(
        "megatron_pad_to_length",
        "bool",
        "The Megatron actor rounds each packed micro-batch up to a bucket length.",
        f"{ARR}.actor.megatron.pad_to_length",
    ),
    _read(
        "megatron_lora_rank",
        "int",
        "verl 0.9's Megatron LoRA rank (Megatron-Bridge PEFT; 0: full fine-tuning).",
        f"{ARR}.model.lora.rank",
        bounds=_int(0, L.MAX_HIDDEN),
    ),
    _read(
        "megatron_lora_targets",
        "any",
        "The linear layers verl 0.9's Megatron LoRA adapts.",
        f"{ARR}.model.lora.target_modules",
    ),
    _read(
        "megatron_moe_grouped_gemm",
        "bool",
        "megatron-core's grouped GEMM for the experts (verl's MoE model converters turn it on).",
        f"{ARR}.actor.megatron.override_transformer_config.moe_grouped_gemm",
    ),
    _read(
        "megatron_moe_shared_expert_overlap",
        "bool",
        "megatron-core overlaps the shared experts with the token dispatch.",
        f"{ARR}.actor.megatron.override_transformer_config.moe_shared_expert_overlap",
    ),
    _read(
        "megatron_recompute_method",
        "str",
        "Megatron full recompute: uniform or block.",
        f"{ARR}.actor.megatron.override_transformer_config.recompute_method",
    ),
    _read(
        "megatron_recompute_num_layers",
        "int",
        "Layers per Megatron recompute chunk (uniform) or recomputed per stage (block).",
        f"{ARR}.actor.megatron.override_transformer_config.recompute_num_layers",
        bounds=_int(1, L.MAX_LAYERS),
    ),
    _read(
        "megatron_first_stage_layers",
        "int",
        "Transformer layers of the first pipeline stage.",
        f"{ARR}.actor.megatron.override_transformer_config.num_layers_in_first_pipeline_stage",
        bounds=_int(1, L.MAX_LAYERS),
    ),
    _read(
        "megatron_last_stage_layers",
        "int",
        "Transformer layers of the last pipeline stage.",
        f"{ARR}.actor.megatron.override_transformer_config.num_layers_in_last_pipeline_stage",
        bounds=_int(1, L.MAX_LAYERS),
    ),
    _read(
        "megatron_account_for_embedding",
        "bool",
        "The embedding counts as one layer of the first pipeline stage.",
        f"{ARR}.actor.megatron.override_transformer_config.account_for_embedding_in_pipeline_split",
    ),
    _read(
        "megatron_account_for_loss",
        "bool",
        "The loss counts as one layer of the last pipeline stage.",
        f"{ARR}.actor.megatron.override_transformer_config.account_for_loss_in_pipeline_split",
    ),
)


#: Every setting. Owned rows come first, in the order the planner emits their keys.
SETTINGS = Registry(
    [
        # -- emitted, in the order of the override list ------------------------------------------------------
        _row(
            "adv_estimator",
            "str",
            "RL algorithm; ppo brings a critic.",
            "algorithm.adv_estimator",
            spec="algorithm",
            spec_default="grpo",
            held="value",
        ),
        _row(
            "model_path",
            "str",
            "The policy model's path.",
            f"{ARR}.model.path",
            spec="model.path",
            held="value",
        ),
        _row(
            "train_files",
            "paths",
            "Training parquet files (data.train_files).",
            "data.train_files",
            spec="data.trainFiles",
            optional=True,
            held="pin",
        ),
        _row(
            "val_files",
            "paths",
            "Validation parquet files (data.val_files).",
            "data.val_files",
            spec="data.valFiles",
            optional=True,
            held="pin",
        ),
        _row(
            "train_batch_size",
            "int",
            "Prompts per step (data.train_batch_size); the planner decides if omitted.",
            "data.train_batch_size",
            spec="data.trainBatchSize",
            bounds=_int(1, L.MAX_BATCH),
            plan="batching.trainBatchSize",
            search="choose",
        ),
        _row(
            "max_prompt_length",
            "int",
            "data.max_prompt_length in tokens.",
            "data.max_prompt_length",
            spec="data.maxPromptLength",
            spec_default=512,
            bounds=_int(1, L.MAX_TOKENS),
            held="value",
        ),
        _row(
            "max_response_length",
            "int",
            "data.max_response_length in tokens.",
            "data.max_response_length",
            spec="data.maxResponseLength",
            spec_default=512,
            bounds=_int(1, L.MAX_TOKENS),
            held="value",
        ),
        _row(
            "nnodes",
            "int",
            "Nodes (Ray pods) of the job.",
            "trainer.nnodes",
            bounds=_int(1, L.MAX_GPUS),
            plan="nnodes",
        ),
        _row(
            "n_gpus_per_node",
            "int",
            "GPUs used on each node; the planner decides from the nodes if omitted.",
            "trainer.n_gpus_per_node",
            spec="resources.gpusPerNode",
            bounds=_int(1, L.MAX_GPUS_PER_NODE),
            plan="gpusPerNode",
        ),
        _row(
            "rollout_name",
            "str",
            "Rollout engine (actor_rollout_ref.rollout.name): vllm (the default), sglang, or trtllm (verl 0.9 "
            "only).",
            f"{ARR}.rollout.name",
            spec="rollout.name",
            held="value",
            verl_default="vllm",
        ),
        _row(
            "rollout_mode",
            "str",
            "verl's rollout.mode: sync (SPMD, verl 0.6) or async (vLLM servers).",
            f"{ARR}.rollout.mode",
            plan="rollout.mode",
            held="pin",
        ),
        _row(
            "rollout_n",
            "int",
            "Responses sampled per prompt: verl's rollout.n (actor_rollout_ref.rollout.n). Named in full because "
            "YAML 1.1 readers such as kubectl take a bare n key for the boolean false.",
            f"{ARR}.rollout.n",
            spec="rollout.responsesPerPrompt",
            bounds=_int(1, L.MAX_ROLLOUT_N),
            plan="batching.rolloutN",
            search="choose",
        ),
        _row(
            "rollout_tp",
            "int",
            "vLLM tensor parallel size per rollout replica; planner decides if omitted.",
            f"{ARR}.rollout.tensor_model_parallel_size",
            spec="rollout.tensorParallelSize",
            bounds=_int(1, L.MAX_PARALLEL),
            plan="rollout.tensorParallelSize",
            search="choose",
        ),
        _row(
            "gpu_memory_utilization",
            "float",
            "Fraction of total GPU memory vLLM may use (weights + KV cache).",
            f"{ARR}.rollout.gpu_memory_utilization",
            spec="rollout.gpuMemoryUtilization",
            bounds=Bounds(0, 1, low_exclusive=True),
            plan="rollout.gpuMemoryUtilization",
            search="choose",
        ),
        _row(
            "max_model_len",
            "int",
            "vLLM's longest sequence: prompt + response unless pinned.",
            f"{ARR}.rollout.max_model_len",
            bounds=_int(1, L.MAX_TOKENS),
            plan="rollout.maxModelLen",
            held="pin",
        ),
        _row(
            "max_num_batched_tokens",
            "int",
            "Tokens vLLM batches per step (at least max_model_len in verl 0.6's SPMD rollout).",
            f"{ARR}.rollout.max_num_batched_tokens",
            bounds=_int(1, L.MAX_TOKEN_BUDGET),
            held="value",
        ),
        _row(
            "rollout_response_length",
            "int",
            "Most tokens the rollout generates per response (verl: data.max_response_length unless set).",
            f"{ARR}.rollout.response_length",
            bounds=_int(1, L.MAX_TOKENS),
            search="keep",
            optional=True,
        ),
        _row(
            "rollout_prompt_length",
            "int",
            "The length the rollout pads each prompt to (verl: data.max_prompt_length unless set).",
            f"{ARR}.rollout.prompt_length",
            bounds=_int(1, L.MAX_TOKENS),
            search="keep",
            optional=True,
        ),
        _row(
            "sequence_parallel_size",
            "int",
            "Ulysses sequence parallel size of actor/ref/critic.",
            f"{ARR}.actor.ulysses_sequence_parallel_size",
            f"{ARR}.actor.fsdp_config.ulysses_sequence_parallel_size",
            f"{ARR}.ref.ulysses_sequence_parallel_size",
            f"{ARR}.ref.fsdp_config.ulysses_sequence_parallel_size",
            spec="parallelism.sequenceParallelSize",
            bounds=_int(1, L.MAX_PARALLEL),
            plan="sequenceParallelSize",
            # 0.6's worker reads the actor's top-level key; 0.9 reads fsdp_config's, for actor and ref.
            emits_by_line={
                "0.6": (f"{ARR}.actor.ulysses_sequence_parallel_size",),
                "0.9": (
                    f"{ARR}.actor.fsdp_config.ulysses_sequence_parallel_size",
                    f"{ARR}.ref.fsdp_config.ulysses_sequence_parallel_size",
                ),
            },
            emit=False,
            engine="fsdp",
            search="choose",
        ),
        _row(
            "use_remove_padding",
            "bool",
            "Micro-batches hold only real tokens (set by the planner with Ulysses SP).",
            f"{ARR}.model.use_remove_padding",
            optional=True,
            held="pin",
        ),
        _row(
            "fsdp_size",
            "int",
            "FSDP shard group size: -1 (whole world) or a divisor of the world size.",
            f"{ARR}.actor.fsdp_config.fsdp_size",
            spec="parallelism.fsdpSize",
            bounds=_int(-1, L.MAX_GPUS),
            plan="fsdpSize",
            engine="fsdp",
            search="choose",
        ),
        _row(
            "param_offload",
            "bool",
            "Offload actor/ref parameters to CPU between phases.",
            f"{ARR}.actor.fsdp_config.param_offload",
            spec="offload.params",
            engine="fsdp",
            search="choose",
        ),
        _row(
            "optimizer_offload",
            "bool",
            "Offload the optimizer state to CPU between phases.",
            f"{ARR}.actor.fsdp_config.optimizer_offload",
            spec="offload.optimizer",
            engine="fsdp",
            search="choose",
        ),
        _row(
            "ppo_mini_batch_size",
            "int",
            "Prompts per PPO mini-batch (actor.ppo_mini_batch_size), before x responsesPerPrompt (verl's rollout.n).",
            f"{ARR}.actor.ppo_mini_batch_size",
            spec="batching.ppoMiniBatchSize",
            bounds=_int(1, L.MAX_BATCH),
            plan="batching.ppoMiniBatchSize",
            search="choose",
        ),
        _row(
            "dynamic_batch_size",
            "bool",
            "Pack micro-batches by token count (use_dynamic_bsz) instead of sample count.",
            f"{ARR}.actor.use_dynamic_bsz",
            f"{ARR}.rollout.log_prob_use_dynamic_bsz",
            f"{ARR}.ref.log_prob_use_dynamic_bsz",
            "critic.use_dynamic_bsz",  # emitted with the critic only: see critic_dynamic_batch_size
            spec="batching.dynamicBatchSize",
            plan="batching.dynamicBatchSize",
            emits=(
                f"{ARR}.actor.use_dynamic_bsz",
                f"{ARR}.rollout.log_prob_use_dynamic_bsz",
                f"{ARR}.ref.log_prob_use_dynamic_bsz",
            ),
            search="choose",
        ),
        _row(
            "max_token_len_per_gpu",
            "int",
            "Token budget per GPU with dynamic batch size (ppo_max_token_len_per_gpu).",
            f"{ARR}.actor.ppo_max_token_len_per_gpu",
            spec="batching.maxTokenLenPerGpu",
            bounds=_int(1, L.MAX_TOKEN_BUDGET),
            plan="batching.maxTokenLenPerGpu",
            batching="dynamic",
            search="choose",
        ),
        _row(
            "log_prob_max_token_len_per_gpu",
            "int",
            "Log-prob token budget per GPU with dynamic batch size (rollout and ref).",
            f"{ARR}.rollout.log_prob_max_token_len_per_gpu",
            f"{ARR}.ref.log_prob_max_token_len_per_gpu",
            bounds=_int(1, L.MAX_TOKEN_BUDGET),
            plan="batching.logProbMaxTokenLenPerGpu",
            batching="dynamic",
            search="choose",
        ),
        _row(
            "ppo_micro_batch_size_per_gpu",
            "int",
            "Sequences per GPU per forward/backward (gradient accumulation unit).",
            f"{ARR}.actor.ppo_micro_batch_size_per_gpu",
            spec="batching.ppoMicroBatchSizePerGpu",
            bounds=_int(1, L.MAX_BATCH),
            plan="batching.ppoMicroBatchSizePerGpu",
            batching="static",
            search="choose",
        ),
        _row(
            "log_prob_micro_batch_size_per_gpu",
            "int",
            "Sequences per GPU per log-prob forward (rollout and ref).",
            f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu",
            f"{ARR}.ref.log_prob_micro_batch_size_per_gpu",
            spec="batching.logProbMicroBatchSizePerGpu",
            bounds=_int(1, L.MAX_BATCH),
            plan="batching.logProbMicroBatchSizePerGpu",
            batching="static",
            search="choose",
        ),
        _row(
            "critic_ppo_micro_batch_size_per_gpu",
            "int",
            "The critic's sequences per GPU per forward/backward.",
            "critic.ppo_micro_batch_size_per_gpu",
            bounds=_int(1, L.MAX_BATCH),
            batching="static",
            critic_only=True,
            search="choose",
        ),
        # The critic's copy of dynamic_batch_size: its key pins dynamic_batch_size (one input, keys that must
        # agree); this row only places the emitted key after the critic's micro-batch size.
        SettingRow(
            name="critic_dynamic_batch_size",
            kind="bool",
            description="The critic's use_dynamic_bsz: the actor's value.",
            emits=("critic.use_dynamic_bsz",),
            critic_only=True,
        ),
        _row(
            "critic_model_path",
            "str",
            "The critic's model path (the actor's unless named).",
            "critic.model.path",
            spec="critic.model.path",
            critic_only=True,
            held="pin",
        ),
        # -- owned, not emitted: verl's deprecated global forms (the planner emits the _per_gpu forms) ---------
        _row(
            "ppo_micro_batch_size_global",
            "int",
            "The actor's micro-batch size over all GPUs (deprecated form).",
            f"{ARR}.actor.ppo_micro_batch_size",
            emit=False,
            bounds=_int(1, L.MAX_BATCH),
            search="pin",
        ),
        _row(
            "log_prob_micro_batch_size_global",
            "int",
            "The log-prob micro-batch size over all GPUs (deprecated form).",
            f"{ARR}.rollout.log_prob_micro_batch_size",
            f"{ARR}.ref.log_prob_micro_batch_size",
            emit=False,
            bounds=_int(1, L.MAX_BATCH),
            search="pin",
        ),
        _row(
            "critic_ppo_micro_batch_size_global",
            "int",
            "The critic's micro-batch size over all GPUs (deprecated form).",
            "critic.ppo_micro_batch_size",
            emit=False,
            bounds=_int(1, L.MAX_BATCH),
            search="pin",
        ),
        # -- read (memory model, strategy checks) and passed through unchanged ------------------------------
        _read(
            "lora_rank",
            "int",
            "LoRA rank (0: full fine-tuning).",
            f"{ARR}.model.lora_rank",
            bounds=_int(0, L.MAX_HIDDEN),
        ),
        _read(
            "max_position_embeddings",
            "int",
            "The model's longest sequence, raised by override_config.",
            f"{ARR}.model.override_config.max_position_embeddings",
            bounds=_int(1, L.MAX_TOKENS),
            held="pin",
        ),
        _read(
            "gradient_checkpointing",
            "bool",
            "Activation recomputation (on unless switched off).",
            f"{ARR}.model.enable_gradient_checkpointing",
            held="value",
            verl_default=True,
        ),
        _read(
            "use_kl_loss", "bool", "A KL loss term (needs the reference model).", f"{ARR}.actor.use_kl_loss"
        ),
        _read(
            "entropy_coeff",
            "any",
            "Entropy bonus (not 0: the update computes the entropy).",
            f"{ARR}.actor.entropy_coeff",
        ),
        _read(
            "use_kl_in_reward",
            "bool",
            "KL in the reward (needs the reference model).",
            "algorithm.use_kl_in_reward",
        ),
        _read(
            "ref_param_offload",
            "bool",
            "Offload the reference model's parameters.",
            f"{ARR}.ref.fsdp_config.param_offload",
            held="value",
            verl_default=False,
        ),
        _read(
            "actor_strategy", "str", "The actor's training backend (fsdp, fsdp2).", f"{ARR}.actor.strategy"
        ),
        _read("critic_strategy", "str", "The critic's training backend (fsdp, fsdp2).", "critic.strategy"),
        _read("critic_enable", "bool", "A critic, whatever the estimator.", "critic.enable"),
        _read(
            "enable_chunked_prefill",
            "bool",
            "vLLM's chunked prefill (on unless switched off).",
            f"{ARR}.rollout.enable_chunked_prefill",
            held="value",
            verl_default=True,
        ),
        _read(
            "max_num_seqs",
            "int",
            "Sequences vLLM batches (256 by default).",
            f"{ARR}.rollout.max_num_seqs",
            bounds=_int(1, L.MAX_SEQS),
            held="value",
            verl_default=256,
        ),
        _read(
            "rollout_ep",
            "int",
            "The rollout's expert parallel size (mixture-of-experts models).",
            f"{ARR}.rollout.expert_parallel_size",
            bounds=_int(0, L.MAX_PARALLEL),
            held="pin",
        ),
        _read(
            "rollout_pp",
            "int",
            "The rollout's pipeline parallel size (not supported above 1).",
            f"{ARR}.rollout.pipeline_model_parallel_size",
            bounds=_int(0, L.MAX_PARALLEL),
        ),
        _read(
            "rollout_dp",
            "int",
            "Data parallelism inside a rollout replica (not supported above 1).",
            f"{ARR}.rollout.data_parallel_size",
            bounds=_int(0, L.MAX_PARALLEL),
            held="pin",
        ),
        _read(
            "critic_max_token_len_per_gpu",
            "int",
            "The critic's token budget per GPU with dynamic batch size.",
            "critic.ppo_max_token_len_per_gpu",
            bounds=_int(1, L.MAX_TOKEN_BUDGET),
            held="pin",
        ),
        _read(
            "critic_param_offload",
            "bool",
            "Offload the critic's parameters (0.6 spelling).",
            "critic.model.fsdp_config.param_offload",
        ),
        _read(
            "critic_optimizer_offload",
            "bool",
            "Offload the critic's optimizer state (0.6 spelling).",
            "critic.model.fsdp_config.optimizer_offload",
        ),
        _read(
            "critic_ppo_mini_batch_size",
            "int",
            "The critic's PPO mini-batch size.",
            "critic.ppo_mini_batch_size",
        ),
        _read(
            "critic_sequence_parallel_size",
            "int",
            "The critic's Ulysses sequence parallel size.",
            "critic.ulysses_sequence_parallel_size",
            "critic.model.fsdp_config.ulysses_sequence_parallel_size",
            bounds=_int(1, L.MAX_PARALLEL),
            held="value",
            verl_default=1,
        ),
        # -- rollout engines and the multi-turn agent loop: read for the engine rules, passed through.
        _read(
            "multi_turn_enable",
            "bool",
            "The multi-turn rollout (tool calls, interactions) of the SGLang SPMD rollout or the agent loop.",
            f"{ARR}.rollout.multi_turn.enable",
        ),
        _read(
            "multi_turn_tool_config_path",
            "str",
            "The tools' YAML of the multi-turn rollout.",
            f"{ARR}.rollout.multi_turn.tool_config_path",
        ),
        _read(
            "multi_turn_max_assistant_turns",
            "int",
            "Most assistant turns per trajectory (verl: max_model_len // 3 when unset).",
            f"{ARR}.rollout.multi_turn.max_assistant_turns",
            bounds=_int(1, L.MAX_TOKENS),
        ),
        _read(
            "multi_turn_max_tool_response_length",
            "int",
            "Tokens of one tool response the agent loop keeps (256 by default).",
            f"{ARR}.rollout.multi_turn.max_tool_response_length",
            bounds=_int(1, L.MAX_TOKENS),
        ),
        _read(
            "agent_default_agent_loop",
            "str",
            "The agent loop of a sample without an agent_name (single_turn_agent by default).",
            f"{ARR}.rollout.agent.default_agent_loop",
        ),
        _read(
            "multi_turn_max_user_turns",
            "int",
            "Most user (interaction) turns per trajectory (verl: max_model_len // 3 when unset).",
            f"{ARR}.rollout.multi_turn.max_user_turns",
            bounds=_int(1, L.MAX_TOKENS),
        ),
        _read(
            "multi_turn_interaction_config_path",
            "str",
            "The interactions' YAML of the multi-turn rollout (verl 0.6; 0.9 has no such key).",
            f"{ARR}.rollout.multi_turn.interaction_config_path",
        ),
        _read(
            "multi_turn_format",
            "str",
            "The tool-call format (verl's tool parser name, hermes by default).",
            f"{ARR}.rollout.multi_turn.format",
        ),
        _read(
            "agent_num_workers",
            "int",
            "The agent loop's worker processes (8 by default).",
            f"{ARR}.rollout.agent.num_workers",
            bounds=_int(1, L.MAX_PARALLEL),
        ),
        _read(
            "return_raw_chat",
            "bool",
            "The dataset keeps the raw chat (raw_prompt) that the multi-turn rollouts read.",
            "data.return_raw_chat",
        ),
        _read(
            "agent_loop_config_path",
            "str",
            "The YAML of named agent loops a sample's agent_name selects.",
            f"{ARR}.rollout.agent.agent_loop_config_path",
        ),
        _read(
            "rollout_moe_tp",
            "int",
            "TensorRT-LLM's MoE tensor parallel size (verl 0.9, trtllm only).",
            f"{ARR}.rollout.moe_tensor_parallel_size",
            bounds=_int(0, L.MAX_PARALLEL),
            held="pin",
        ),
        _read(
            "rollout_disaggregation",
            "bool",
            "Prefill/decode disaggregation of the rollout servers (verl 0.9, sglang or vllm only).",
            f"{ARR}.rollout.disaggregation.enabled",
        ),
        # -- verl 0.9's v1 trainer: the mode (planner/pools.py reads it; the planner emits it when the spec sets it)
        _read(
            "trainer_mode",
            "str",
            "verl 0.9's v1 trainer mode (trainer.v1.trainer_mode): sync, colocate_async (the rollout overlaps "
            "training on the same GPUs) or separate_async (a trainer pool and a standalone rollout pool, "
            "sized by resources.rolloutGpus or the planner). verl 0.6 has no v1 trainer; fully_async and "
            "one_step_off are chosen by verl.entrypoint. Omitted: the overrides' value, else sync.",
            "trainer.v1.trainer_mode",
            spec="verl.trainerMode",
        ),
        _read(
            "skip_tokenizer_init",
            "bool",
            "The rollout engine skips its tokenizer init (SGLang, vLLM servers).",
            f"{ARR}.rollout.skip_tokenizer_init",
        ),
        # -- the Megatron engine (planner/megatron.py) ---------------------------------------------
        *MEGATRON_ROWS,
    ]
)
