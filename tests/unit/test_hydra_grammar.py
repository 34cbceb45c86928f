"""Overrides read by Hydra's grammar (``planner/hydra_grammar.py``): casts read as values, sweeps, unknown
functions, a space before ``=`` and characters Hydra's lexer has no token for refused at admission.
``tests/fidelity/test_fidelity_hydra_grammar.py`` compares the same reader with Hydra's own parser."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_nodes, make_spec

from verl_operator.planner.job import plan_job
from verl_operator.planner.overrides import OverrideError, parse_override, parse_overrides


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        pytest.param("trainer.nnodes=int(1)", 1, id="int-cast"),
        pytest.param("trainer.nnodes=int('2')", 2, id="int-of-quoted"),
        pytest.param("actor_rollout_ref.rollout.gpu_memory_utilization=float(1)", 1.0, id="float-cast"),
        pytest.param("trainer.experiment_name=str(true)", "true", id="str-of-bool"),
        pytest.param("trainer.val_before_train=bool('False')", False, id="bool-of-quoted"),
        pytest.param("trainer.logger=sort([wandb,console])", ["console", "wandb"], id="sort-list"),
        pytest.param("data.train_batch_size=1_024", 1024, id="underscore-int"),
        pytest.param("trainer.nnodes= 1", 1, id="space-after-equal"),
        pytest.param("trainer.val_before_train=none", "none", id="none-is-a-string"),
    ],
)
def test_values_as_hydra_reads_them(raw: str, value: Any) -> None:
    assert parse_override(raw).value == value


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param(
            "trainer.nnodes=1,2", "'1,2' is a sweep over 2 values, which requires --multirun", id="list-sweep"
        ),
        pytest.param(
            "trainer.nnodes=range(1,4)", "range(...) is a sweep, which requires --multirun", id="range"
        ),
        pytest.param(
            "data.train_files=glob(*.parquet)", "glob(...) is a sweep, which requires --multirun", id="glob"
        ),
        pytest.param("trainer.nnodes=choice(1,2)", "choice(...) is a sweep", id="choice"),
        pytest.param(
            "trainer.nnodes=nodes(1)",
            "unknown function 'nodes' (Hydra's functions: bool, choice",
            id="unknown",
        ),
        pytest.param(
            "trainer.nnodes = 1",
            "a space at character 15 is not allowed in a key (Hydra takes no space before '=')",
            id="space-before-equal",
        ),
        pytest.param(
            "trainer.default_local_dir=~/ckpt",
            "'~' at character 1 is not allowed unquoted (quote the value)",
            id="tilde",
        ),
        pytest.param("trainer.val_before_train=bool(yes)", "Cannot cast 'yes' to bool", id="bool-of-yes"),
    ],
)
def test_what_hydra_or_a_single_run_refuses(raw: str, message: str) -> None:
    with pytest.raises(OverrideError) as exc:
        parse_override(raw)
    assert message in str(exc.value)
    _, violations, _ = parse_overrides([raw])
    assert [(v.field, v.rule) for v in violations] == [("spec.overrides[0]", "override-syntax")]


def test_a_cast_pins_the_planner_s_key() -> None:
    spec = make_spec(8, overrides=["trainer.nnodes=int(1)", "data.train_batch_size=int(64)"])
    result = plan_job(spec, make_nodes(1))
    assert result.feasible, [v.one_line() for v in result.violations]
    assert result.plan is not None and result.plan.batching.train_batch_size == 64
