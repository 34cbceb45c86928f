"""The settings registry: the CRD's fields, the override reader, the planner's generated views, the emitter and
the plan come from its rows, so a setting added as one row is read, bounded and emitted with no other edit,
and a row the plan has no value for is refused, never dropped."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import pytest
from conftest import make_nodes, make_problem, make_spec
from pydantic import ValidationError, create_model
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from verl_operator.api import settings_codegen
from verl_operator.api.plan import BatchingPlan
from verl_operator.api.settings_registry import SETTINGS, Bounds, Registry, SettingRow
from verl_operator.api.spec import SUPPORTED_VERL_VERSIONS, Algorithm, VerlJobSpec
from verl_operator.crdgen import build_crd
from verl_operator.planner import plan_job, resolve
from verl_operator.planner._settings_generated import Held
from verl_operator.planner.dialect import INPUT_KEYS, READ_KEYS, emit, format_value, unreachable
from verl_operator.planner.inputs import SPEC_PATHS, Problem, Settings, spec_value
from verl_operator.planner.megatron import FSDP_ONLY_SETTINGS, MEGATRON_SETTINGS
from verl_operator.planner.overrides import parse_overrides, read_owned
from verl_operator.planner.reader import Reader

#: The dummy setting: two spellings, each release line emitting its own, bounded 1 to 10.
DUMMY = SettingRow(
    name="dummy_knob",
    kind="int",
    description="A knob that exists only in this test.",
    spec="dummyKnob",
    keys=("trainer.dummy_knob", "trainer.old_dummy_knob"),
    emits_by_line={"0.6": ("trainer.old_dummy_knob",), "0.9": ("trainer.dummy_knob",)},
    bounds=Bounds(1, 10),
    plan="dummyKnob",
)
WITH_DUMMY = SETTINGS.with_rows(DUMMY)


@dataclass(frozen=True)
class DummySettings(Settings):
    """A candidate layout that also chose the dummy knob (as the search would once it decides it)."""

    dummy_knob: int = 7


def _settings(cls: type[Settings] = Settings) -> Settings:
    return cls(
        world=8,
        nnodes=1,
        gpus_per_node=8,
        train_batch_size=64,
        rollout_n=4,
        rollout_tp=2,
        gpu_memory_utilization=0.6,
        sequence_parallel_size=1,
        fsdp_size=-1,
        ppo_mini_batch_size=32,
        ppo_micro_batch_size_per_gpu=4,
        log_prob_micro_batch_size_per_gpu=8,
        dynamic_batch_size=False,
        max_token_len_per_gpu=None,
        log_prob_max_token_len_per_gpu=None,
        param_offload=False,
        optimizer_offload=False,
    )


# -- one row is enough ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["trainer.dummy_knob", "trainer.old_dummy_knob"])
def test_a_new_row_is_read_from_either_spelling(key: str) -> None:
    parsed, violations, _ = parse_overrides([f"{key}=7", "trainer.total_epochs=3"])
    pins, passthrough, vs = read_owned(parsed, WITH_DUMMY.input_keys())
    assert violations == vs == []
    assert Reader(pins, {}, WITH_DUMMY).get_int("dummy_knob") == 7
    assert [ov.key for ov in passthrough] == ["trainer.total_epochs"]  # the planner owns the new key
    # The product's own registry does not know the key: it passes through, nothing pins it.
    pins, passthrough, _ = read_owned(parsed, SETTINGS.input_keys())
    assert "dummy_knob" not in pins and [ov.key for ov in passthrough] == [key, "trainer.total_epochs"]


def test_a_new_row_bounds_a_pinned_override() -> None:
    parsed, _, _ = parse_overrides(["trainer.dummy_knob=11"])
    pins, _, _ = read_owned(parsed, WITH_DUMMY.input_keys())
    reader = Reader(pins, {}, WITH_DUMMY)
    assert reader.get_int("dummy_knob") is None
    assert [(v.rule, v.field) for v in reader.violations] == [
        ("out-of-range", "spec.overrides[0] (trainer.dummy_knob)")
    ]
    assert "1 to 10" in reader.violations[0].message


def test_two_spellings_of_a_new_row_must_agree() -> None:
    parsed, _, _ = parse_overrides(["trainer.dummy_knob=3", "trainer.old_dummy_knob=4"])
    _, _, violations = read_owned(parsed, WITH_DUMMY.input_keys())
    assert [v.rule for v in violations] == ["override-conflict"]


@pytest.mark.parametrize(
    ("version", "key"), [("0.6", "trainer.old_dummy_knob"), ("0.9", "trainer.dummy_knob")]
)
def test_a_new_row_is_emitted_in_each_release_lines_spelling(version: str, key: str) -> None:
    st, p = _settings(DummySettings), make_problem(version=version)
    with_dummy = emit(st, p, [], WITH_DUMMY)
    without = emit(st, p, [])
    assert [o for o in with_dummy if o not in without] == [f"{key}=7"]
    assert [o for o in with_dummy if o.startswith("trainer.")] == [
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=8",
        f"{key}=7",
    ]


def test_a_new_row_gives_its_spec_field_bounds_and_description() -> None:
    model: Any = create_model(
        "DummySpec", dummy_knob=(int | None, WITH_DUMMY.field("dummy_knob", default=None))
    )
    schema = model.model_json_schema()["properties"]["dummy_knob"]
    assert schema["description"] == DUMMY.description
    assert [b for b in schema["anyOf"] if b.get("type") == "integer"] == [
        {"type": "integer", "minimum": 1, "maximum": 10}
    ]
    with pytest.raises(ValidationError):
        model(dummy_knob=11)
    assert spec_value(model(dummy_knob=3), "dummy_knob") == 3
    assert WITH_DUMMY.spec_paths()["dummy_knob"] == "spec.dummyKnob"
    assert WITH_DUMMY.plan_fields() == {**SETTINGS.plan_fields(), "dummy_knob": "dummy_knob"}


def test_a_row_the_plan_has_no_value_for_fails_loudly() -> None:
    """An owned row whose setting no planner field carries would take the user's override out of the command
    line and write none: the emitter refuses it, naming the row."""
    orphan = SettingRow(
        name="orphan_knob",
        kind="int",
        description="A knob no planner field carries.",
        keys=("trainer.orphan_knob",),
        emits=("trainer.orphan_knob",),
    )
    st, p = _settings(), make_problem()
    with pytest.raises(LookupError, match=r"'orphan_knob' owns trainer\.orphan_knob"):
        emit(st, p, [], SETTINGS.with_rows(orphan))
    # Applying only to the other engine, it is not emitted, so not refused.
    assert emit(st, p, [], SETTINGS.with_rows(replace(orphan, engine="megatron"))) == emit(st, p, [])
    # The same check runs over the product's rows when the dialect is imported: none is unreachable.
    assert unreachable(SETTINGS.with_rows(orphan)) == ["orphan_knob"]
    assert unreachable(SETTINGS.with_rows(replace(orphan, emits=()))) == []
    assert unreachable() == []


@pytest.mark.parametrize(
    ("path", "render"),
    [
        (settings_codegen.PATH, settings_codegen.render),
        (settings_codegen.PLAN_PATH, settings_codegen.render_plan),
    ],
    ids=["planner", "plan"],
)
def test_the_generated_views_are_the_rows(path: str, render: Any) -> None:
    """``planner/_settings_generated.py`` and ``api/_plan_generated.py`` are what ``make settings`` writes from
    the rows now."""
    with open(Path(__file__).parents[2] / path, encoding="utf-8") as f:
        assert f.read() == render(), "run `make settings`"


def test_a_held_row_becomes_a_typed_field_of_the_job() -> None:
    """``held="value"``: required, or verl's default; ``held="pin"``: None unless set; paths as written."""
    held = replace(DUMMY, held="value")

    def job_fields(row: SettingRow) -> str:
        return settings_codegen.render(SETTINGS.with_rows(row)).split("class Held:")[1]

    assert "    dummy_knob: int\n" in job_fields(held)
    assert "    dummy_knob: int = 4\n" in job_fields(replace(held, verl_default=4))
    assert "    dummy_knob: int | None = None\n" in job_fields(replace(held, held="pin"))
    assert "    dummy_knob: Value | None = None\n" in job_fields(replace(held, held="pin", kind="paths"))
    with pytest.raises(ValueError, match="held by the job and also a candidate's"):
        SETTINGS.with_rows(replace(held, search="choose"))
    with pytest.raises(ValueError, match="cannot hold a value of kind 'any'"):
        settings_codegen.render(SETTINGS.with_rows(replace(held, kind="any")))


#: The dummy knob held by the job: its pin, else verl's default 4, in the job's facts.
HELD_DUMMY = SETTINGS.with_rows(replace(DUMMY, held="value", verl_default=4))


@dataclass(frozen=True, kw_only=True)
class DummyProblem(Problem):
    """The job's facts with the dummy knob held (as ``make settings`` would write it into ``Held``)."""

    dummy_knob: int = 4


@pytest.mark.parametrize(("overrides", "held"), [(["trainer.old_dummy_knob=9"], 9), ([], 4)])
def test_a_held_row_is_read_into_the_job_and_emitted_with_no_other_edit(
    overrides: list[str], held: int
) -> None:
    parsed, _, _ = parse_overrides(overrides)
    pins, _, _ = read_owned(parsed, HELD_DUMMY.input_keys())
    reader = Reader(pins, {}, HELD_DUMMY)
    # What the resolver gives itself: every product row it holds (none is left to the generic read).
    p = make_problem(version="0.9")
    given = {f.name: getattr(p, f.name) for f in fields(Held)}
    assert resolve._held(Reader({}, {}), given) == {}
    read = resolve._held(reader, given, HELD_DUMMY)
    assert read == {"dummy_knob": held} and reader.violations == []
    assert resolve._held(reader, {**given, "dummy_knob": 2}, HELD_DUMMY) == {}  # the resolver's value wins
    problem = DummyProblem(**{**{f.name: getattr(p, f.name) for f in fields(p)}, **read})
    out = emit(_settings(), problem, [], HELD_DUMMY)
    assert [o for o in out if o.startswith("trainer.")][-1] == f"trainer.dummy_knob={held}"


def test_the_batching_plan_describes_each_setting_as_its_row_does() -> None:
    """The status schema's ``plan.batching`` fields that carry a setting: its row's description and type."""
    properties = BatchingPlan.model_json_schema(by_alias=True)["properties"]
    settings = SETTINGS.plan_fields("batching")
    assert {"trainBatchSize", "rolloutN", "ppoMiniBatchSize"} <= set(properties)
    for name, field in settings.items():
        wire = BatchingPlan.model_fields[field].alias
        assert properties[wire]["description"] == SETTINGS[name].description, name
        optional = "anyOf" in properties[wire]
        assert optional is SETTINGS[name].unset_in_some_jobs, name
    # A new row with a batching plan field is a new described field, no other edit.
    row = replace(DUMMY, plan="batching.dummyKnob", search="choose", batching="static")
    text = settings_codegen.render_plan(SETTINGS.with_rows(row))
    assert (
        f"    dummy_knob: int | None = Field(default=None, description={json.dumps(DUMMY.description)})\n"
        in text
    )


def test_a_chosen_row_becomes_a_typed_field_of_the_candidate_and_the_pin() -> None:
    chosen = replace(DUMMY, search="choose", verl_default=3)
    text = settings_codegen.render(SETTINGS.with_rows(chosen))
    candidate, pin = text.split("class Fixed:")
    assert "    dummy_knob: int = 3\n" in candidate and "    dummy_knob: int | None = None\n" in pin
    text = settings_codegen.render(SETTINGS.with_rows(replace(chosen, batching="dynamic")))
    assert "    dummy_knob: int | None = None\n" in text.split("class Fixed:")[0]
    kept = settings_codegen.render(SETTINGS.with_rows(replace(chosen, search="keep", optional=True)))
    assert '"dummy_knob",' in kept.split("KEPT: tuple[str, ...] = (")[1].split(")")[0]
    assert "    dummy_knob: int | None = None\n" in kept.split("class Fixed:")[0]
    with pytest.raises(ValueError, match="cannot choose a value of kind 'paths'"):
        settings_codegen.render(SETTINGS.with_rows(replace(chosen, kind="paths")))


# -- the product's tables, against verl's own spellings ------------------------------------------------------
def test_the_reader_tables_map_verls_keys_to_their_settings() -> None:
    """Keys spelt as in verl 0.6.1's and 0.9.1's ``ppo_trainer.yaml`` / ``ppo_megatron_trainer.yaml``."""
    owned = {
        "data.train_batch_size": "train_batch_size",
        "actor_rollout_ref.rollout.n": "rollout_n",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "sequence_parallel_size",
        "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size": "sequence_parallel_size",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": "dynamic_batch_size",
        "critic.use_dynamic_bsz": "dynamic_batch_size",
        "critic.megatron.pipeline_model_parallel_size": "megatron_pp",
        "actor_rollout_ref.actor.ppo_micro_batch_size": "ppo_micro_batch_size_global",
    }
    read = {
        "actor_rollout_ref.model.lora_rank": "lora_rank",
        "actor_rollout_ref.rollout.max_num_seqs": "max_num_seqs",
        "critic.ppo_mini_batch_size": "critic_ppo_mini_batch_size",
        "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity": (
            "megatron_recompute_granularity"
        ),
    }
    assert {k: INPUT_KEYS.get(k) for k in owned} == owned
    assert {k: READ_KEYS.get(k) for k in read} == read
    assert not set(INPUT_KEYS) & set(READ_KEYS)
    assert {k: SPEC_PATHS.get(k) for k in ("rollout_n", "megatron_tp", "param_offload", "adv_estimator")} == {
        "rollout_n": "spec.rollout.responsesPerPrompt",
        "megatron_tp": "spec.parallelism.megatron.tensorParallelSize",
        "param_offload": "spec.offload.params",
        "adv_estimator": "spec.algorithm",
    }


def test_the_engine_lists_are_the_configs_own_settings() -> None:
    """The settings of verl's Megatron config only (``*.megatron.*``) and of its FSDP config only."""
    sizes = ["megatron_tp", "megatron_pp", "megatron_vpp", "megatron_cp", "megatron_ep", "megatron_etp"]
    assert set(MEGATRON_SETTINGS) == {
        *sizes,
        *(f"critic_{s}" for s in sizes),
        "megatron_sequence_parallel",
        "megatron_param_offload",
        "megatron_optimizer_offload",
    }
    assert set(FSDP_ONLY_SETTINGS) == {
        "sequence_parallel_size",
        "fsdp_size",
        "param_offload",
        "optimizer_offload",
    }


@pytest.mark.parametrize(
    ("engine", "dynamic", "critic", "present", "absent"),
    [
        (
            "fsdp",
            False,
            False,
            [
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                "actor_rollout_ref.actor.fsdp_config.fsdp_size",
            ],
            [
                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
                "critic.model.path",
                "critic.use_dynamic_bsz",
            ],
        ),
        (
            "fsdp",
            True,
            True,
            [
                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
                "critic.model.path",
                "critic.use_dynamic_bsz",
            ],
            ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "critic.ppo_micro_batch_size_per_gpu"],
        ),
        (
            "megatron",
            False,
            True,
            [
                "actor_rollout_ref.actor.megatron.tensor_model_parallel_size",
                "critic.megatron.tensor_model_parallel_size",
                "actor_rollout_ref.actor.megatron.param_offload",
                "critic.ppo_micro_batch_size_per_gpu",
            ],
            [
                "actor_rollout_ref.actor.fsdp_config.fsdp_size",
                "actor_rollout_ref.actor.fsdp_config.param_offload",
                "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size",  # unset: verl's none
            ],
        ),
        (
            "megatron",
            False,
            False,
            ["actor_rollout_ref.ref.megatron.tensor_model_parallel_size"],
            ["critic.megatron.tensor_model_parallel_size", "critic.model.path"],
        ),
    ],
)
def test_a_rows_keys_are_emitted_for_the_jobs_it_applies_to(
    engine: str, dynamic: bool, critic: bool, present: list[str], absent: list[str]
) -> None:
    settings = replace(
        _settings(),
        dynamic_batch_size=dynamic,
        max_token_len_per_gpu=4096 if dynamic else None,
        log_prob_max_token_len_per_gpu=4096 if dynamic else None,
        critic_ppo_micro_batch_size_per_gpu=2,
    )
    p = make_problem(version="0.9", needs_critic=critic, training_engine=engine)
    keys = [o.split("=", 1)[0] for o in emit(settings, p, [])]
    assert [k for k in present if k not in keys] == []
    assert [k for k in absent if k in keys] == []
    assert len(keys) == len(set(keys))


def _crd_node(path: str) -> dict[str, Any]:
    node: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"
    ]
    for part in path.split("."):
        node = node["properties"][part]
    return node


@pytest.mark.parametrize("row", [r for r in SETTINGS if r.spec is not None], ids=lambda r: r.name)
def test_the_crd_field_of_a_setting_has_the_rows_bounds(row: SettingRow) -> None:
    node = _crd_node(str(row.spec))
    # model.path is ModelSpec's, shared with the critic: its description is the model's, not the setting's.
    if row.spec not in ("model.path", "critic.model.path"):
        assert node["description"].startswith(row.description)  # crdgen may add "Default: ..."
    if row.bounds is None:
        assert "minimum" not in node and "maximum" not in node
    else:
        assert (node["minimum"], node["maximum"]) == (row.bounds.low, row.bounds.high)
        assert node.get("exclusiveMinimum", False) is row.bounds.low_exclusive


def _spec_field(path: str) -> FieldInfo:
    model: Any = VerlJobSpec
    info: FieldInfo | None = None
    for part in path.split("."):
        info = next(f for name, f in model.model_fields.items() if part in (f.alias, name))
        model = next((a for a in get_args(info.annotation) if isinstance(a, type)), info.annotation)
    assert info is not None
    return info


#: The Python types a spec field of each kind may have (an optional field adds None).
_KIND_TYPES: dict[str, set[Any]] = {
    "int": {int},
    "bool": {bool},
    "float": {float},
    "str": {str, Algorithm, Literal},
    "paths": {list},
}


@pytest.mark.parametrize("row", [r for r in SETTINGS if r.spec is not None], ids=lambda r: r.name)
def test_a_spec_field_takes_all_but_its_python_type_from_its_row(row: SettingRow) -> None:
    info = _spec_field(str(row.spec))
    annotation = info.annotation
    members = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    types = {get_origin(a) or a for a in members} - {type(None)}
    assert types <= _KIND_TYPES[row.kind], (row.name, info.annotation)
    if row.spec in ("model.path", "critic.model.path"):
        return  # ModelSpec's path, shared by the policy and the critic: the model's field
    assert info.description == row.description
    if row.kind == "paths":
        assert info.default_factory is list and info.default is PydanticUndefined
    else:
        assert info.default == row.spec_default


def test_a_rows_spec_default_is_the_spec_fields() -> None:
    spec = make_spec(8)
    assert (spec.data.max_prompt_length, spec.data.max_response_length) == (512, 512)
    assert spec.algorithm is Algorithm.GRPO and spec.data.train_files == []
    assert spec.rollout.responses_per_prompt is None


def test_the_release_lines_are_the_apis() -> None:
    from verl_operator.api import settings_registry

    assert settings_registry.LINES == SUPPORTED_VERL_VERSIONS


@pytest.mark.parametrize("version", ["0.6", "0.9"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_a_settings_plan_field_holds_the_value_its_keys_are_emitted_with(version: str, dynamic: bool) -> None:
    spec = make_spec(8, verl={"image": "x", "version": version}, batching={"dynamicBatchSize": dynamic})
    result = plan_job(spec, make_nodes(1))
    assert result.plan is not None, result.violations
    plan = result.plan.model_dump(mode="json", by_alias=True)
    emitted = dict(o.split("=", 1) for o in result.plan.overrides)
    checked = 0
    for row in SETTINGS:
        if row.plan is None or not row.emitted(version):
            continue
        value: Any = plan
        for part in row.plan.split("."):
            value = value[part] if value is not None else None  # None: a section the plan leaves out
        if value is None:  # the other batching mode's setting (or the other training engine's)
            continue
        assert {emitted[k] for k in row.emitted(version)} == {format_value(value)}, row.name
        checked += 1
    assert checked >= 12


@pytest.mark.parametrize("version", ["0.6", "0.9"])
@pytest.mark.parametrize("length", ["response", "prompt"])
def test_a_kept_setting_is_read_checked_and_written_back(version: str, length: str) -> None:
    """``actor_rollout_ref.rollout.response_length`` / ``prompt_length`` (kept pins): taken out of the user's
    overrides, written back once among the planner's keys, refused above ``maxResponseLength`` /
    ``maxPromptLength``, left to verl's default unset."""
    key = f"actor_rollout_ref.rollout.{length}_length"

    def plan(*overrides: str) -> Any:
        spec = make_spec(
            8,
            verl={"image": "x", "version": version},
            data={"maxResponseLength": 1024, "maxPromptLength": 1024},
            overrides=[*overrides, "trainer.total_epochs=2"],
        )
        return plan_job(spec, make_nodes(1))

    shorter = plan(f"{key}=512")
    assert shorter.plan is not None, shorter.violations
    assert [o for o in shorter.plan.overrides if o.startswith(key)] == [f"{key}=512"]
    assert shorter.plan.overrides[-1] == "trainer.total_epochs=2"  # the planner's keys come first
    unset = plan()
    assert unset.plan is not None and not [o for o in unset.plan.overrides if o.startswith(key)]
    longer = plan(f"{key}=2048")
    assert longer.plan is None
    assert [(v.rule, v.field) for v in longer.violations] == [
        (f"rollout-{length}-length", f"spec.overrides[0] ({key})")
    ]


# -- a registry that contradicts itself is refused -------------------------------------------------------------
@pytest.mark.parametrize(
    ("row", "message"),
    [
        (SettingRow("other", "int", "x", keys=("data.train_batch_size",)), "belongs to"),
        (SettingRow("train_batch_size", "int", "x"), "registered twice"),
        (SettingRow("lost", "int", "x", emits=("trainer.lost",)), "no owned row reads"),
        (SettingRow("late", "int", "x", keys=("a.b",), emits_by_line={"0.7": ("a.b",)}), "no release line"),
        (SettingRow("upside", "int", "x", keys=("a.c",), bounds=Bounds(5, 1)), "not in order"),
        (SettingRow("kept", "int", "x", keys=("a.d",), emits=("a.d",), search="keep"), "must be optional"),
    ],
)
def test_an_inconsistent_row_is_refused(row: SettingRow, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Registry([*SETTINGS.rows, row])


def test_every_integer_setting_but_one_has_bounds() -> None:
    """An unbounded integer gets ``limits.DEFAULT_INT_BOUNDS``; only the critic's mini-batch size (which the
    planner reads for no arithmetic) has no bounds of its own."""
    unbounded = {r.name for r in SETTINGS if r.kind == "int" and r.bounds is None}
    assert unbounded == {"critic_ppo_mini_batch_size"}
