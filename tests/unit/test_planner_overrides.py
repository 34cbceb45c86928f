"""Hydra override parsing and reading the planner's keys."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verl_operator.planner.dialect import INPUT_KEYS, format_value
from verl_operator.planner.overrides import OverrideError, Value, parse_override, parse_overrides, read_owned


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
