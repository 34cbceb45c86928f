"""Megatron rules found by judging verl's own Megatron scripts (tests/fidelity/test_fidelity_megatron_corpus.py):
the FSDP ``B x n % W`` rule does not apply to Megatron (verl checks Megatron's DP x micro-batch instead), and
Hydra's ``+key=value`` adds to a key whose value is null."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_problem, make_settings

from verl_operator.planner import rules, rules_megatron, verl_keys
from verl_operator.planner.mesh import Mesh
from verl_operator.planner.overrides import parse_override

#: 8 GPUs, TP 2 -> Megatron DP 4; 6 x 2 = 12 trajectories: 12 % 8 != 0 but 12 % (DP 4 x micro 1) == 0.
BATCH = {"train_batch_size": 6, "rollout_n": 2, "ppo_mini_batch_size": 6, "ppo_micro_batch_size_per_gpu": 1}


@pytest.mark.parametrize(
    ("engine", "extra", "expected"),
    [
        pytest.param("megatron", {"megatron_tp": 2}, set(), id="megatron-dp4-12-trajectories-ok"),
        pytest.param(
            "megatron",
            {"megatron_tp": 2, "train_batch_size": 5},
            {"megatron-minimal-batch"},
            id="megatron-dp4-10-trajectories",
        ),
        pytest.param("fsdp", {}, {"batch-divisible-by-world"}, id="fsdp-12-over-8-gpus"),
    ],
)
def test_megatron_batch_is_checked_against_dp_not_world(
    engine: str, extra: dict[str, Any], expected: set[str]
) -> None:
    p = make_problem(training_engine=engine)
    mesh = Mesh.of(p, make_settings(**{**BATCH, **extra}))
    found = {
        v.rule
        for rule in (rules.batch_divisible_by_world, rules_megatron.minimal_batch)
        for v in rule(p, mesh)
    }
    assert found == expected


RECOMPUTE = "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method"


@pytest.mark.parametrize(
    ("version", "raw", "refused"),
    [
        # null in verl 0.6.1's and 0.9.1's ppo_megatron_trainer: Hydra's + adds to it
        pytest.param("0.6/megatron", f"+{RECOMPUTE}=uniform", False, id="plus-on-null-0.6"),
        pytest.param("0.9/megatron", f"+{RECOMPUTE}=uniform", False, id="plus-on-null-0.9"),
        # a key with a value: Hydra refuses + (An item is already at ...)
        pytest.param("0.9/megatron", "+data.train_batch_size=8", True, id="plus-on-a-value"),
    ],
)
def test_plus_adds_to_a_null_key(version: str, raw: str, refused: bool) -> None:
    assert (RECOMPUTE in verl_keys.null_keys(version)) is True
    found = [v.rule for v in verl_keys.key_violations([parse_override(raw)], version)]
    assert found == (["override-add-existing"] if refused else [])


@pytest.mark.parametrize(
    ("version", "tp", "refused"),
    [
        pytest.param("0.6", 8, True, id="0.6-kv4-tp8"),  # megatron-core 0.14: KV heads a multiple of TP
        pytest.param("0.9", 8, False, id="0.9-kv4-tp8"),  # megatron-core 0.16: or a divisor of TP
        pytest.param("0.9", 16, False, id="0.9-heads32-tp16-kv4"),  # 32 % 16 == 0 and 16 % 4 == 0
        pytest.param("0.9", 3, True, id="0.9-tp3"),
    ],
)
def test_kv_heads_may_divide_tp_on_0_9(version: str, tp: int, refused: bool) -> None:
    from test_planner_megatron import MOE  # 32 heads, 4 KV heads

    p = make_problem(training_engine="megatron", version=version, shape=MOE)
    found = rules_megatron.heads_divisible(p, Mesh.of(p, make_settings(megatron_tp=tp)))
    assert bool(found) is refused, [v.message for v in found]


@pytest.mark.parametrize(
    ("pp", "pins", "refused"),
    [
        # Qwen2.5-7B's 28 layers; PP 4 divides them, but a pinned last stage of 6 leaves 22 for 3 stages
        pytest.param(4, {"last_stage_layers": 6}, True, id="pp-divides-layers-pins-do-not"),
        pytest.param(4, {"last_stage_layers": 7}, False, id="pins-split-evenly"),
        pytest.param(
            3, {"first_stage_layers": 8, "last_stage_layers": 8}, False, id="pp3-pins-12-in-the-middle"
        ),
        # 28 + embedding + loss = 30: PP 4 does not split it, PP 5 and 6 do
        pytest.param(
            4, {"account_for_embedding": True, "account_for_loss": True}, True, id="accounted-30-over-4"
        ),
        pytest.param(
            5, {"account_for_embedding": True, "account_for_loss": True}, False, id="accounted-30-over-5"
        ),
        pytest.param(4, {}, False, id="even-split"),
    ],
)
def test_pinned_pipeline_split_decides(pp: int, pins: dict[str, Any], refused: bool) -> None:
    from verl_operator.planner.megatron_options import MegatronOptions

    p = make_problem(training_engine="megatron", megatron_options=MegatronOptions(**pins))
    mesh = Mesh.of(p, make_settings(megatron_pp=pp))
    found = rules_megatron.layers_divisible(p, mesh)
    assert bool(found) is refused, found
    if refused:
        assert found[0].rule == "megatron-layers-divisible"
        assert found[0].field == "spec.parallelism.megatron.pipelineParallelSize"
        assert "%" in found[0].message and found[0].suggestions


@pytest.mark.parametrize(
    ("pp", "vpp", "pins", "suggested"),
    [
        # Qwen2.5-7B's 28 layers + embedding + loss = 30 on PP 5: 6 per stage, so VPP 2, 3 or 6 build; 4 does not
        pytest.param(
            5, 2, {"account_for_embedding": True, "account_for_loss": True}, None, id="accounted-vpp2"
        ),
        pytest.param(
            5, 4, {"account_for_embedding": True, "account_for_loss": True}, "VPP 3 or 6", id="accounted-vpp4"
        ),
        # a last stage of 7 and three middle stages of 7 each: VPP 7 builds, 2 does not
        pytest.param(4, 7, {"last_stage_layers": 7}, None, id="pinned-vpp7"),
        pytest.param(4, 2, {"last_stage_layers": 7}, "VPP 7", id="pinned-vpp2"),
        # 28 layers with a last stage of 4 on PP 4: 8 per middle stage; VPP 4 builds, 3 does not
        pytest.param(4, 3, {"last_stage_layers": 4}, "VPP 2 or 4", id="pinned-vpp3"),
    ],
)
def test_a_virtual_pipeline_divides_each_stage_of_a_pinned_split(
    pp: int, vpp: int, pins: dict[str, Any], suggested: str | None
) -> None:
    """An uneven split with VPP is megatron-core's (each stage's layers divide by VPP), not ``L % (PP x VPP)``:
    Qwen3-235B-A22B's 94 layers with the embedding and loss on PP 8 x VPP 2 build, though 94 % 16 != 0."""
    from verl_operator.planner.megatron_options import MegatronOptions

    p = make_problem(training_engine="megatron", megatron_options=MegatronOptions(**pins))
    mesh = Mesh.of(p, make_settings(megatron_pp=pp, megatron_vpp=vpp))
    found = rules_megatron.layers_divisible(p, mesh)
    if suggested is None:
        assert found == []
        return
    (v,) = found
    assert v.rule == "megatron-layers-divisible" and f"VPP {vpp}" in v.message
    assert v.field == "spec.parallelism.megatron.virtualPipelineParallelSize"
    assert v.suggestions == [f"use {suggested}"]


def test_a_pinned_stage_that_does_not_split_gets_its_nearest_counts() -> None:
    """docs/perf/dpsk.md's LAST_LAYER=6 for Qwen3-235B-A22B (94 layers, PP 8): 88 left for 7 stages. Besides
    other PP sizes, the suggestions give the last-stage counts that split on PP 8, and each of them builds."""
    from verl_operator.planner import catalog
    from verl_operator.planner.megatron_options import MegatronOptions, stage_layers

    entry = catalog.lookup("Qwen/Qwen3-235B-A22B")
    assert entry is not None and entry.shape.layers == 94
    p = make_problem(
        shape=entry.shape, training_engine="megatron", megatron_options=MegatronOptions(last_stage_layers=6)
    )
    mesh = Mesh.of(p, make_settings(megatron_pp=8))
    (v,) = rules_megatron.layers_divisible(p, mesh)
    assert "94 layers - 6 on the last stage = 88 left for 7 stages (88 % 7 = 4)" in v.message
    assert (
        v.suggestions[-1]
        == "on PP 8, set override_transformer_config.num_layers_in_last_pipeline_stage to 3 or 10"
    )
    assert stage_layers(94, 8, last=3) is not None and stage_layers(94, 8, last=10) is not None
    assert all(stage_layers(94, 8, last=n) is None for n in range(4, 10))
