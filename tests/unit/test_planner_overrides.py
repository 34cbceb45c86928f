"""Hydra override parsing and reading the planner's keys."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verl_operator.api.plan import Violation
from verl_operator.planner.dialect import INPUT_KEYS, READ_KEYS, format_value
from verl_operator.planner.overrides import (
    Override,
    OverrideError,
    Pinned,
    Value,
    parse_override,
    parse_overrides,
    read_owned,
)


@pytest.mark.parametrize(
    ("raw", "prefix", "key", "value"),
    [
        pytest.param("trainer.total_epochs=15", "", "trainer.total_epochs", 15, id="int"),
        pytest.param("a.b=0.6", "", "a.b", 0.6, id="float"),
        pytest.param("a.b=True", "", "a.b", True, id="bool-cap"),
        pytest.param("a.b=false", "", "a.b", False, id="bool-lower"),
        pytest.param("a.b=null", "", "a.b", None, id="null"),
        pytest.param("+a.b=x", "+", "a.b", "x", id="add"),
        pytest.param("++a.b=1", "++", "a.b", 1, id="force-add"),
        pytest.param("~a.b", "~", "a.b", None, id="delete"),
        pytest.param("a.b='hello world'", "", "a.b", "hello world", id="single-quoted"),
        pytest.param('a.b="x=y"', "", "a.b", "x=y", id="double-quoted-with-equals"),
        pytest.param("a.b=[x,y]", "", "a.b", ["x", "y"], id="list"),
        pytest.param("a.b=['a,b',2]", "", "a.b", ["a,b", 2], id="list-quoted-comma"),
        pytest.param(
            "data.train_files=$HOME/data/gsm8k/train.parquet",
            "",
            "data.train_files",
            "$HOME/data/gsm8k/train.parquet",
            id="shell-var-stays-text",
        ),
        pytest.param(
            "trainer.logger=['console','wandb']", "", "trainer.logger", ["console", "wandb"], id="logger"
        ),
    ],
)
def test_parse_override(raw: str, prefix: str, key: str, value: object) -> None:
    ov = parse_override(raw)
    assert (ov.prefix, ov.key, ov.value) == (prefix, key, value)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param("novalue", id="no-equals"),
        pytest.param("=3", id="no-key"),
        pytest.param("a.b=[x,y", id="open-bracket"),
        pytest.param("a.b='abc", id="open-quote"),
        pytest.param("a b=1", id="space-in-key"),
    ],
)
def test_parse_override_rejects(raw: str) -> None:
    with pytest.raises(OverrideError):
        parse_override(raw)


def test_bad_overrides_are_violations_and_repeats_warnings() -> None:
    parsed, violations, warnings = parse_overrides(["a.b=1", "c=3", "a.b=2", "broken"])
    assert [(o.key, o.value) for o in parsed] == [("c", 3), ("a.b", 2)]  # Hydra: the last one wins
    assert [(v.rule, v.field) for v in violations] == [("override-syntax", "spec.overrides[3]")]
    assert warnings == [
        "spec.overrides[0] (a.b) is set again by spec.overrides[2]; the last value wins ('1' is ignored)"
    ]


def test_read_owned_splits_and_detects_conflicts() -> None:
    parsed, _, _ = parse_overrides(
        [
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=4",
            "trainer.total_epochs=15",
            "actor_rollout_ref.actor.use_dynamic_bsz=True",
            "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
        ]
    )
    pinned, passthrough, violations = read_owned(parsed, INPUT_KEYS)
    assert pinned["sequence_parallel_size"].value == 2
    assert pinned["dynamic_batch_size"].value is True
    assert [o.key for o in passthrough] == ["trainer.total_epochs"]
    assert len(violations) == 1 and violations[0].rule == "override-conflict"
    assert "spec.overrides[0]" in violations[0].message and "spec.overrides[1]" in violations[0].message


_scalars = st.one_of(
    st.integers(-(10**9), 10**9),
    st.booleans(),
    st.none(),
    st.floats(min_value=1e-4, max_value=1e4, allow_nan=False).map(lambda f: round(f, 4)),
    st.from_regex(r"[A-Za-z_/][A-Za-z0-9_./ -]{0,20}", fullmatch=True).filter(
        lambda t: t.strip() == t and t.lower() not in ("true", "false", "null", "none")
    ),
)


@given(st.one_of(_scalars, st.lists(_scalars, max_size=4)))
def test_emitted_values_parse_back(value: Value) -> None:
    assert parse_override(f"some.key={format_value(value)}").value == value


# -- dict values, as Hydra's override grammar writes them ----------------------------------------------------
@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param(
            "{n:64,tensor_model_parallel_size:3}", {"n": 64, "tensor_model_parallel_size": 3}, id="flat"
        ),
        pytest.param("{ n : 64 , name : vllm }", {"n": 64, "name": "vllm"}, id="spaces"),
        pytest.param(
            "{rollout:{n:8},actor:{lr:1e-6}}", {"rollout": {"n": 8}, "actor": {"lr": 1e-6}}, id="nested"
        ),
        pytest.param("{}", {}, id="empty"),
        pytest.param("{vllm:{}}", {"vllm": {}}, id="empty-inside"),
        pytest.param("{logger:[console,'wandb']}", {"logger": ["console", "wandb"]}, id="list-inside"),
        pytest.param("{name:'a, b: {c}'}", {"name": "a, b: {c}"}, id="quoted-specials"),
        pytest.param("{name:'it\\'s'}", {"name": "it's"}, id="escaped-quote"),
        pytest.param("{path:${oc.env:HOME}/x}", {"path": "${oc.env:HOME}/x"}, id="interpolation"),
        pytest.param("{a:b:c}", {"a": "b:c"}, id="colon-in-value"),
        pytest.param("{flag:True,none:null,x:''}", {"flag": True, "none": None, "x": ""}, id="typed"),
        pytest.param("[{a:1},{b:[2]}]", [{"a": 1}, {"b": [2]}], id="dicts-in-list"),
    ],
)
def test_parse_dict_values(text: str, value: Value) -> None:
    assert parse_override(f"trainer={text}").value == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("{nnodes:1", "unbalanced braces: ',' or '}' expected, found the end", id="open-brace"),
        pytest.param("{nnodes:1}}", "unbalanced braces: unexpected '}' at character 11", id="extra-brace"),
        pytest.param("{nnodes 1}", "':' after the dict key expected, found '}'", id="no-colon"),
        pytest.param("{:1}", "a dict key expected, found ':'", id="no-key"),
        pytest.param("{a.b:1}", "the dict key 'a.b' is not a name", id="dotted-key"),
        pytest.param("{n:1,n:2}", "the dict key 'n' appears twice", id="repeated-key"),
        pytest.param("{n:[1,2}", "unbalanced brackets", id="bracket-in-dict"),
        pytest.param("{n:'a}", "unbalanced quotes", id="open-quote"),
        pytest.param("{n:1} x", "unexpected 'x' at character 6", id="trailing-text"),
        pytest.param("a}", "unbalanced braces: unexpected '}'", id="close-without-open"),
        pytest.param("{a:" * 17 + "1" + "}" * 17, "dicts nested deeper than 16 levels", id="deep"),
    ],
)
def test_parse_dict_values_rejects(text: str, message: str) -> None:
    with pytest.raises(OverrideError, match=re.escape(message)):
        parse_override(f"trainer={text}")


def test_unparsable_dict_is_a_syntax_violation() -> None:
    _, violations, _ = parse_overrides(["trainer={nnodes:5"])
    assert [(v.field, v.rule) for v in violations] == [("spec.overrides[0]", "override-syntax")]
    assert "unbalanced braces" in violations[0].message


def test_a_later_dict_does_not_hide_an_earlier_override_of_its_key() -> None:
    parsed, _, warnings = parse_overrides(
        ["trainer={total_epochs:3}", "trainer={nnodes:1}", "a.b=1", "a.b=2"]
    )
    assert [o.raw for o in parsed] == ["trainer={total_epochs:3}", "trainer={nnodes:1}", "a.b=2"]
    assert len(warnings) == 1 and warnings[0].startswith(
        "spec.overrides[2] (a.b) is set again by spec.overrides[3]"
    )


ROLLOUT = "actor_rollout_ref.rollout"


def read(*raws: str) -> tuple[dict[str, Pinned], list[Override], list[Violation]]:
    parsed, violations, _ = parse_overrides(raws)
    assert not violations
    return read_owned(parsed, INPUT_KEYS)


#: Each override of the hostile-input campaign that undid the plan, read as Hydra applies it: the keys it
#: pins (logical input -> value), as if each had been written as its own leaf.
PINS = [
    pytest.param(
        ["trainer={nnodes:5,n_gpus_per_node:3}"], {"nnodes": 5, "n_gpus_per_node": 3}, id="trainer-dict"
    ),
    pytest.param(
        [f"{ROLLOUT}={{n:64,tensor_model_parallel_size:3}}"],
        {"rollout_n": 64, "rollout_tp": 3},
        id="rollout-dict",
    ),
    pytest.param([f"++{ROLLOUT}={{n:64}}"], {"rollout_n": 64}, id="force-add-dict"),
    pytest.param(["+trainer={nnodes:2}"], {"nnodes": 2}, id="add-dict"),
    pytest.param(["data={train_batch_size:7}"], {"train_batch_size": 7}, id="data-dict"),
    pytest.param(
        ["actor_rollout_ref={rollout:{n:8},actor:{use_dynamic_bsz:true}}"],
        {"rollout_n": 8, "dynamic_batch_size": True},
        id="nested-dict",
    ),
    pytest.param(["trainer.nnodes=2", "trainer={nnodes:5}"], {"nnodes": 5}, id="dict-after-leaf"),
    pytest.param(["trainer={nnodes:5}", "trainer.nnodes=2"], {"nnodes": 2}, id="leaf-after-dict"),
    pytest.param(["trainer={nnodes:5}", "trainer={nnodes:4}"], {"nnodes": 4}, id="dict-after-dict"),
    pytest.param(["trainer={nnodes:{}}"], {"nnodes": {}}, id="empty-dict-value"),
    pytest.param(["trainer={total_epochs:3}", "trainer={}"], {}, id="no-owned-leaf"),
]


@pytest.mark.parametrize(("raws", "pins"), PINS)
def test_owned_leaves_set_through_a_parent_are_pins(raws: list[str], pins: dict[str, Value]) -> None:
    pinned, _, violations = read(*raws)
    assert not violations
    assert {name: pin.value for name, pin in pinned.items()} == pins


def test_a_pin_through_a_parent_names_the_override_and_the_key() -> None:
    pinned, _, _ = read("trainer.total_epochs=3", "trainer={nnodes:5,n_gpus_per_node:3}")
    assert pinned["nnodes"].source == "spec.overrides[1] (trainer.nnodes, in trainer={...})"


#: Overrides that would delete or replace a key the planner sets: a denial naming the override and the keys.
DENIALS = [
    pytest.param("~trainer", "override-delete-owned", ["~trainer", "trainer.nnodes"], id="delete-trainer"),
    pytest.param(
        f"~{ROLLOUT}",
        "override-delete-owned",
        [f"~{ROLLOUT}", f"{ROLLOUT}.gpu_memory_utilization"],
        id="delete-rollout",
    ),
    pytest.param("~data", "override-delete-owned", ["data.max_prompt_length"], id="delete-data"),
    pytest.param("~trainer.nnodes", "override-delete-owned", ["trainer.nnodes"], id="delete-leaf"),
    pytest.param("~trainer.nnodes=1", "override-delete-owned", ["trainer.nnodes"], id="delete-leaf-value"),
    pytest.param(
        "~actor_rollout_ref", "override-delete-owned", ["actor_rollout_ref.actor"], id="delete-root"
    ),
    pytest.param(f"{ROLLOUT}=null", "override-replace-owned", [f"replaces {ROLLOUT}"], id="replace-null"),
    pytest.param("trainer=5", "override-replace-owned", ["trainer.n_gpus_per_node"], id="replace-scalar"),
    pytest.param("++trainer=[1]", "override-replace-owned", ["replaces trainer"], id="replace-list"),
    pytest.param(
        "actor_rollout_ref={rollout:null}",
        "override-replace-owned",
        [f"replaces {ROLLOUT}"],
        id="replace-inside-dict",
    ),
    pytest.param(
        "critic=megatron_critic",
        "override-replace-owned",
        ["replaces critic, which holds critic."],
        id="group-choice",
    ),
    pytest.param("trainer.nnodes.x=1", "override-inside-owned", ["inside trainer.nnodes"], id="below-a-leaf"),
    pytest.param("trainer={nnodes:{x:1}}", "override-inside-owned", ["trainer.nnodes.x"], id="below-in-dict"),
]


@pytest.mark.parametrize(("raw", "rule", "words"), DENIALS)
def test_undoing_the_plan_is_denied(raw: str, rule: str, words: list[str]) -> None:
    pinned, passthrough, violations = read(raw)
    assert [(v.rule, v.field.split(" ")[0]) for v in violations] == [(rule, "spec.overrides[0]")]
    assert all(w in violations[0].message for w in words), violations[0].message
    assert not pinned and not passthrough


@pytest.mark.parametrize(
    ("raw", "kept"),
    [
        pytest.param(
            "trainer={nnodes:1,total_epochs:3}", "trainer={total_epochs:3}", id="owned-leaf-taken-out"
        ),
        pytest.param("+trainer={nnodes:1,v1:{sync:true}}", "+trainer={v1:{sync:True}}", id="nested-rest"),
        pytest.param(
            f"++{ROLLOUT}={{n:4,temperature:0.7}}", f"++{ROLLOUT}={{temperature:0.7}}", id="force-add"
        ),
        pytest.param("trainer={nnodes:1}", None, id="all-owned"),
        pytest.param("trainer={total_epochs:3}", "trainer={total_epochs:3}", id="none-owned-verbatim"),
        pytest.param("trainer={}", "trainer={}", id="empty-merges-nothing"),
        pytest.param("~trainer.total_epochs", "~trainer.total_epochs", id="delete-other"),
        pytest.param(f"{ROLLOUT}.val_kwargs=null", f"{ROLLOUT}.val_kwargs=null", id="replace-other"),
    ],
)
def test_passthrough_keeps_only_what_the_planner_does_not_own(raw: str, kept: str | None) -> None:
    _, passthrough, violations = read(raw)
    assert not violations
    assert [o.raw for o in passthrough] == ([kept] if kept else [])
    for ov in passthrough:
        assert not [k for k, _ in ov.leaves() if k in INPUT_KEYS]


def test_read_keys_are_read_through_parents_and_never_refused() -> None:
    parsed, _, _ = parse_overrides(
        ["actor_rollout_ref.actor={use_kl_loss:true}", "~actor_rollout_ref.model.lora_rank"]
    )
    reads, passthrough, violations = read_owned(parsed, READ_KEYS, owned=False)
    assert reads["use_kl_loss"].value is True
    assert not violations and passthrough == parsed


def test_a_read_key_deleted_after_it_was_set_is_not_read() -> None:
    parsed, _, _ = parse_overrides(
        ["actor_rollout_ref.actor={use_kl_loss:true,entropy_coeff:0}", "~actor_rollout_ref.actor.use_kl_loss"]
    )
    reads, _, _ = read_owned(parsed, READ_KEYS, owned=False)
    assert set(reads) == {"entropy_coeff"}


def test_keys_of_one_input_through_parents_must_agree() -> None:
    _, _, violations = read(
        "actor_rollout_ref.actor={use_dynamic_bsz:true}", f"{ROLLOUT}.log_prob_use_dynamic_bsz=False"
    )
    assert [v.rule for v in violations] == ["override-conflict"]


_dicts = st.recursive(
    _scalars,
    lambda inner: st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), inner, max_size=3),
)


@given(_dicts)
def test_emitted_dict_values_parse_back(value: Value) -> None:
    assert parse_override(f"some.key={format_value(value)}").value == value
