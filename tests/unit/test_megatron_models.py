"""Rule ``megatron-model``: the models each of verl's Megatron paths builds (``planner.megatron_models``)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import catalog_entry, make_nodes

from verl_operator.api.plan import PlanResult
from verl_operator.api.spec import VerlJobSpec
from verl_operator.planner import megatron_models
from verl_operator.planner.job import plan_job

M = "actor_rollout_ref.actor.megatron"
GEMMA2 = "google/gemma-2-2b-it"
QWEN = "Qwen/Qwen2.5-7B-Instruct"


def _plan(version: str, model: dict[str, Any], *overrides: str, **sections: Any) -> PlanResult:
    doc = {
        "verl": {"image": "example.com/verl", "version": version},
        "model": model,
        "resources": {"gpus": 16},
        "parallelism": {"engine": "megatron"},
        "overrides": list(overrides),
        **sections,
    }
    return plan_job(VerlJobSpec.model_validate(doc), make_nodes(2))


def _shape(model_type: str | None) -> dict[str, Any]:
    wire = dict(catalog_entry(GEMMA2).shape.to_wire())
    wire["modelType"] = model_type
    return wire


def _rules(result: PlanResult) -> list[tuple[str, str]]:
    return [(v.field, v.rule) for v in result.violations]


def test_verl_0_6s_registry_does_not_build_gemma2() -> None:
    result = _plan("0.6", {"path": GEMMA2})
    assert _rules(result) == [("spec.model.path", "megatron-model")]
    v = result.violations[0]
    assert "gemma2" in v.message and "verl 0.6's own Megatron registry" in v.message
    assert "qwen3_moe" in v.message  # what it does build
    # mbridge has no gemma2 either: the only way out is FSDP
    assert v.suggestions == ["use the FSDP engine (spec.parallelism.engine: fsdp)"]
    assert not _rules(_plan("0.6", {"path": GEMMA2}, parallelism={"engine": "fsdp"}))


def test_a_model_only_mbridge_builds_gets_the_mbridge_switch_on_0_6() -> None:
    gemma3 = {"path": "/models/gemma3", "shape": _shape("gemma3")}
    result = _plan("0.6", gemma3)
    assert _rules(result) == [("spec.model.shape.modelType", "megatron-model")]
    assert result.violations[0].suggestions[0] == f"set {M}.use_mbridge=True (that path builds gemma3)"
    assert _plan("0.6", gemma3, f"{M}.use_mbridge=True").feasible
    # Qwen2 builds on both paths
    assert _plan("0.6", {"path": QWEN}, f"{M}.use_mbridge=True").feasible


def test_verl_0_9_builds_through_megatron_bridge_unless_vanilla_mbridge() -> None:
    assert _plan("0.9", {"path": GEMMA2}).feasible  # Megatron-Bridge has a gemma2 bridge
    result = _plan("0.9", {"path": GEMMA2}, f"{M}.vanilla_mbridge=True")
    assert _rules(result) == [("spec.model.path", "megatron-model")]
    assert result.violations[0].suggestions[0] == f"set {M}.vanilla_mbridge=False (that path builds gemma2)"
    assert _plan("0.9", {"path": QWEN}, f"{M}.vanilla_mbridge=True").feasible


def test_a_shape_without_a_model_type_is_not_checked() -> None:
    assert _plan("0.6", {"path": "/models/mine", "shape": _shape(None)}).feasible


def test_the_critics_other_model_is_checked_on_its_own_path() -> None:
    critic = {"model": {"path": "/models/critic", "shape": _shape("gemma2")}}
    result = _plan("0.6", {"path": QWEN}, algorithm="ppo", critic=critic)
    assert _rules(result) == [("spec.critic.model.shape.modelType", "megatron-model")]
    assert result.violations[0].suggestions == ["use the FSDP engine (spec.parallelism.engine: fsdp)"]
    assert _plan("0.6", {"path": QWEN}, algorithm="ppo").feasible  # the actor's own model as critic


@pytest.mark.parametrize(
    ("version", "mbridge", "vanilla", "name"),
    [
        ("0.6", None, None, "verl 0.6's own Megatron registry"),
        ("0.6", False, None, "verl 0.6's own Megatron registry"),
        ("0.6", True, None, "mbridge (use_mbridge=True)"),
        ("0.9", None, None, "Megatron-Bridge 0.5.2 (verl 0.9's default)"),
        ("0.9", True, False, "Megatron-Bridge 0.5.2 (verl 0.9's default)"),
        ("0.9", True, True, "mbridge (vanilla_mbridge=True)"),
    ],
)
def test_the_path_follows_the_overrides(
    version: str, mbridge: bool | None, vanilla: bool | None, name: str
) -> None:
    assert megatron_models.model_path(version, mbridge, vanilla).name == name


def test_megatron_bridge_refuses_the_moe_models_it_has_no_bridge_for() -> None:
    """Mixtral and Qwen2-MoE: no bridge in Megatron-Bridge 0.5.2, while mbridge builds both."""
    moe = dict(catalog_entry("Qwen/Qwen3-30B-A3B").shape.to_wire())
    for model_type in ("mixtral", "qwen2_moe"):
        model = {"path": f"/models/{model_type}", "shape": {**moe, "modelType": model_type}}
        result = _plan("0.9", model)
        assert _rules(result) == [("spec.model.shape.modelType", "megatron-model")], model_type
        v = result.violations[0]
        assert "Megatron-Bridge 0.5.2" in v.message and v.message.count(", ...)") == 1
        assert v.suggestions[0] == f"set {M}.vanilla_mbridge=True (that path builds {model_type})"
        assert _plan("0.9", model, f"{M}.vanilla_mbridge=True").feasible
        assert _plan("0.6", model).feasible  # verl 0.6's registry builds both
    # a model type the planner knows nothing of is not refused on this path
    assert _plan("0.9", {"path": "/models/new", "shape": {**moe, "modelType": "brand_new_moe"}}).feasible


def test_every_catalog_model_builds_on_verl_0_9s_default_path() -> None:
    from verl_operator.planner import catalog

    types = {e.shape.model_type for e in catalog.catalog()}
    assert types <= megatron_models.MEGATRON_BRIDGE
    assert {"gemma", "gemma2"} <= types - megatron_models.VERL_REGISTRY  # what 0.6's registry lacks
