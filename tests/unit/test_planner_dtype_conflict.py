"""A user override never undoes ``spec.model.dtype``: a dtype key set to another dtype is refused, naming the
spec field and the override (rule ``override-conflict``)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_nodes

from verl_operator.api.spec import VerlJobSpec
from verl_operator.planner.job import plan_job

FP16 = {"path": "Qwen/Qwen2.5-7B-Instruct", "dtype": "float16"}
BF16 = {"path": "Qwen/Qwen2.5-7B-Instruct"}


def plan(model: dict[str, Any], overrides: list[str], **more: Any) -> Any:
    spec = VerlJobSpec.model_validate(
        {
            "verl": {"image": "example.com/verl:0.9.1"},
            "model": model,
            "resources": {"gpus": 8},
            "overrides": overrides,
            **more,
        }
    )
    return plan_job(spec, make_nodes(1))


@pytest.mark.parametrize(
    ("model", "overrides", "message"),
    [
        pytest.param(
            FP16,
            ["actor_rollout_ref.rollout.dtype=bfloat16"],
            "spec.model.dtype = 'float16' but spec.overrides[0] (actor_rollout_ref.rollout.dtype) = 'bfloat16'",
            id="bf16-rollout-under-fp16",
        ),
        pytest.param(
            FP16,
            ["actor_rollout_ref.actor.fsdp_config={dtype:bf16}"],
            "spec.overrides[0] (actor_rollout_ref.actor.fsdp_config.dtype, in actor_rollout_ref.actor.fsdp_config={...}) = 'bf16'",
            id="inside-a-dict",
        ),
        pytest.param(
            FP16,
            ["~actor_rollout_ref.ref.fsdp_config.dtype"],
            "spec.overrides[0] (actor_rollout_ref.ref.fsdp_config.dtype) deletes actor_rollout_ref.ref.fsdp_config.dtype",
            id="deleted",
        ),
        pytest.param(
            BF16,
            ["actor_rollout_ref.rollout.dtype=half"],
            "spec.model.dtype = 'bfloat16' but spec.overrides[0] (actor_rollout_ref.rollout.dtype) = 'half'",
            id="fp16-rollout-under-bf16",
        ),
    ],
)
def test_a_dtype_override_against_the_spec_is_refused(
    model: dict[str, Any], overrides: list[str], message: str
) -> None:
    result = plan(model, overrides)
    assert not result.feasible
    found = [v for v in result.violations if v.rule == "override-conflict"]
    assert len(found) == 1, [v.one_line() for v in result.violations]
    assert found[0].field == "spec.model.dtype"
    assert message in found[0].message
    assert found[0].suggestions[0].startswith("drop spec.overrides[0]")


def test_the_suggestion_names_the_other_dtype() -> None:
    (v,) = [
        v
        for v in plan(FP16, ["actor_rollout_ref.rollout.dtype=bfloat16"]).violations
        if v.rule == "override-conflict"
    ]
    assert v.suggestions == [
        "drop spec.overrides[0] (actor_rollout_ref.rollout.dtype), or set spec.model.dtype to 'bfloat16'"
    ]


@pytest.mark.parametrize(
    ("model", "overrides"),
    [
        pytest.param(FP16, ["actor_rollout_ref.rollout.dtype=float16"], id="same-dtype"),
        pytest.param(FP16, ["actor_rollout_ref.rollout.dtype=fp16"], id="alias"),
        pytest.param(BF16, ["actor_rollout_ref.rollout.dtype=bfloat16"], id="bf16-default"),
    ],
)
def test_an_override_that_agrees_is_planned(model: dict[str, Any], overrides: list[str]) -> None:
    result = plan(model, overrides)
    assert result.feasible, [v.one_line() for v in result.violations]
