"""The Megatron search (``planner/megatron.py`` ``candidates``): its tie-break order, the topology it keeps
(TP inside an NVLink domain, EP inside a node, PP across nodes, CP only for long contexts, VPP where the
layers allow), and the shipped large-MoE example jobs planned and placed on the H20 profile."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import make_nodes, make_spec

from verl_operator.api.spec import VerlJobSpec
from verl_operator.commands.plan import load_nodes
from verl_operator.commands.render import render
from verl_operator.planner import catalog, megatron, plan_job
from verl_operator.planner.inputs import Fixed
from verl_operator.planner.megatron_options import MegatronOptions

ROOT = Path(__file__).resolve().parents[2]
H20 = ROOT / "examples" / "clusters" / "h20.yaml"
QWEN235 = catalog.lookup("Qwen/Qwen3-235B-A22B")
DSV3 = catalog.lookup("deepseek-ai/DeepSeek-V3")
QWEN7 = catalog.lookup("Qwen/Qwen2.5-7B-Instruct")
assert QWEN235 is not None and DSV3 is not None and QWEN7 is not None
ACCOUNTED = MegatronOptions(account_for_embedding=True, account_for_loss=True)


def meshes(*args: Any, count: int = 8, **kw: Any) -> list[tuple[int, int, int, int, int | None, int | None]]:
    return [(c.tp, c.pp, c.cp, c.ep, c.etp, c.vpp) for c in megatron.candidates(*args, **kw)][:count]


def test_tie_break_order_for_a_moe_model() -> None:
    """Smallest TP x PP x CP first; larger TP on ties; per mesh the largest EP inside a node with ETP 1."""
    got = meshes(QWEN235.shape, 32, 8, 8, Fixed(), seq_len=11680, options=ACCOUNTED)
    assert got == [
        (1, 1, 1, 8, 1, None),
        (2, 1, 1, 8, 1, None),
        (1, 2, 1, 8, 1, None),
        (4, 1, 1, 8, 1, None),
        (2, 2, 1, 8, 1, None),
        (1, 4, 1, 8, 1, None),
        (4, 2, 1, 8, 1, None),
        (2, 4, 1, 8, 1, None),
    ]


def test_tp_stays_inside_the_nvlink_domain_and_divides_the_kv_heads() -> None:
    tps = {
        c.tp
        for c in megatron.candidates(
            DSV3.shape, 96, 8, 4, Fixed(), options=MegatronOptions(last_stage_layers=6)
        )
    }
    assert tps == {1, 2, 4}  # a 4-GPU NVLink domain caps TP at 4
    qwen = {c.tp for c in megatron.candidates(QWEN235.shape, 32, 8, 8, Fixed(), options=ACCOUNTED)}
    assert qwen == {1, 2, 4}  # 4 KV heads


def test_ep_stays_inside_a_node() -> None:
    for c in megatron.candidates(DSV3.shape, 96, 8, 8, Fixed(), options=MegatronOptions(last_stage_layers=6)):
        assert c.ep * (c.etp or c.tp) <= 8 and (96 // c.pp) % (c.ep * (c.etp or c.tp)) == 0
    # A pinned ETP keeps EP x ETP within the node too.
    pinned = next(
        megatron.candidates(DSV3.shape, 96, 8, 8, Fixed(megatron_etp=2, megatron_tp=2, megatron_pp=12))
    )
    assert (pinned.ep, pinned.etp) == (4, 2)


def test_uneven_stage_splits_open_the_pps_the_layers_do_not_divide() -> None:
    plain = {c.pp for c in megatron.candidates(DSV3.shape, 96, 8, 8, Fixed())}
    last6 = {
        c.pp
        for c in megatron.candidates(
            DSV3.shape, 96, 8, 8, Fixed(), options=MegatronOptions(last_stage_layers=6)
        )
    }
    assert plain == {1}  # 61 layers: prime
    assert last6 == {1, 2, 6, 12}  # (61 - 6) / (PP - 1) whole, PP divides 96


@pytest.mark.parametrize(
    ("seq_len", "cps"),
    [pytest.param(8192, {1}, id="short-no-cp"), pytest.param(64 * 1024, {1, 2, 4, 8}, id="long-context-cp")],
)
def test_cp_only_for_long_contexts(seq_len: int, cps: set[int]) -> None:
    assert {c.cp for c in megatron.candidates(QWEN7.shape, 16, 8, 8, Fixed(), seq_len=seq_len)} == cps


def test_cp_comes_before_pp_on_equal_footprint() -> None:
    got = [(c.tp, c.pp, c.cp) for c in megatron.candidates(QWEN7.shape, 16, 8, 8, Fixed(), seq_len=65536)]
    assert got.index((4, 1, 2)) < got.index((4, 2, 1))


def test_vpp_where_the_search_chose_pp_and_the_layers_allow() -> None:
    by_pp = {c.pp: c.vpp for c in megatron.candidates(QWEN7.shape, 16, 8, 8, Fixed())}
    assert (
        by_pp[1] is None and by_pp[2] == 2 and by_pp[4] is None
    )  # 28 layers: 28 % (2 x 2) == 0, 28 % 8 != 0
    pinned = next(megatron.candidates(QWEN7.shape, 16, 8, 8, Fixed(megatron_pp=2)))
    assert pinned.vpp is None  # a pinned PP keeps verl's default
    uneven = {c.vpp for c in megatron.candidates(QWEN235.shape, 32, 8, 8, Fixed(), options=ACCOUNTED)}
    assert uneven == {None}


# -- the shipped example jobs on the H20 profile ------------------------------------------------------------------
EXAMPLES = {
    "megatron-qwen3-235b-h20.yaml": (32, 4),
    "megatron-deepseek-v3-h20.yaml": (96, 12),
}


def load_job(name: str) -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "jobs" / name).read_text())
    return job


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_large_moe_examples_plan_and_place_on_h20(name: str) -> None:
    gpus, nodes_wanted = EXAMPLES[name]
    job = load_job(name)
    nodes = load_nodes(str(H20))
    result = plan_job(VerlJobSpec.model_validate(job["spec"]), nodes)
    assert result.feasible and result.plan is not None, result.violations
    plan, t = result.plan, result.plan.training
    assert t is not None and t.engine == "megatron"
    assert plan.world_size == gpus and plan.nnodes == nodes_wanted
    assert t.tensor_parallel_size <= 8 and t.expert_parallel_size * (t.expert_tensor_parallel_size or 1) <= 8
    m = plan.memory
    assert max(m.rollout_peak_gib, m.train_peak_gib, m.log_prob_peak_gib) <= m.gpu_memory_gib
    pods = [c for c in render(job, nodes) if c["kind"] == "Pod"]
    placed = [p["metadata"]["annotations"]["verl-operator.io/node"] for p in pods]
    assert len(set(placed)) == len(pods) == nodes_wanted


def test_the_smallest_footprint_that_fits_wins() -> None:
    """Qwen3-235B-A22B on 4 x 8 H20 plans TP 4 x PP 4 (DP 2); the smaller footprint TP 4 x PP 2 does not fit."""
    job = load_job("megatron-qwen3-235b-h20.yaml")
    nodes = load_nodes(str(H20))
    plan = plan_job(VerlJobSpec.model_validate(job["spec"]), nodes).plan
    assert plan is not None and plan.training is not None
    t = plan.training
    assert (t.tensor_parallel_size, t.pipeline_parallel_size, t.data_parallel_size) == (4, 4, 2)
    smaller = {
        **job["spec"],
        "parallelism": {
            "engine": "megatron",
            "megatron": {"tensorParallelSize": 4, "pipelineParallelSize": 2},
        },
    }
    # The pinned token budget makes an over-the-GPU estimate a warning, not a violation.
    over = plan_job(VerlJobSpec.model_validate(smaller), nodes)
    assert over.plan is not None and over.plan.memory.train_peak_gib > over.plan.memory.gpu_memory_gib
    assert any(w.startswith("train peak estimated") for w in over.warnings)


def test_an_update_over_the_gpu_is_told_what_full_recompute_would_need() -> None:
    """A pinned Megatron update over the GPU without recompute: the warning quotes the estimate with full
    recompute, and planning with the overrides it names gives that estimate, within the GPU."""
    job = load_job("megatron-qwen3-235b-h20.yaml")
    nodes = load_nodes(str(H20))
    spec = {
        **job["spec"],
        "parallelism": {
            "engine": "megatron",
            "megatron": {"tensorParallelSize": 4, "pipelineParallelSize": 2},
        },
    }
    over = plan_job(VerlJobSpec.model_validate(spec), nodes)
    (warning,) = [w for w in over.warnings if w.startswith("train peak estimated")]
    hint = re.search(r"with full recompute \((.*)\) the estimate is ([0-9.]+) GiB", warning)
    assert hint is not None, warning
    keys = hint.group(1).split(" ")
    assert {k.split("=")[0].rsplit(".", 1)[1] for k in keys} == {
        "recompute_granularity",
        "recompute_method",
        "recompute_num_layers",
    }
    recomputed = plan_job(
        VerlJobSpec.model_validate({**spec, "overrides": [*spec.get("overrides", []), *keys]}), nodes
    )
    assert recomputed.plan is not None, recomputed.violations
    m = recomputed.plan.memory
    assert m.train_peak_gib == pytest.approx(float(hint.group(2)), abs=0.05)
    assert m.train_peak_gib <= m.gpu_memory_gib
    assert not [w for w in recomputed.warnings if w.startswith("train peak estimated")]


def test_without_the_offloads_qwen3_235b_does_not_fit_32_gpus() -> None:
    spec = make_spec(
        32,
        model="Qwen/Qwen3-235B-A22B",
        parallelism={"engine": "megatron"},
        data={"maxPromptLength": 2048, "maxResponseLength": 9632},
    )
    result = plan_job(spec, make_nodes(4, product="NVIDIA-H20", memory_mib=97871))
    assert not result.feasible
    assert {v.rule for v in result.violations} & {"memory-train", "memory-rollout", "kv-cache-max-model-len"}


RECOMPUTE = "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_"


def test_selective_recompute_of_mla_up_proj_lowers_the_deepseek_v3_examples_update() -> None:
    """The example's full recompute replaced by selective recompute: of the default ``core_attn`` (nothing to
    free with fused attention) and of ``mla_up_proj`` too (every layer's latent query, key and value)."""
    nodes = load_nodes(str(H20))

    def plan(*overrides: str) -> Any:
        spec = load_job("megatron-deepseek-v3-h20.yaml")["spec"]
        spec["overrides"] = [o for o in spec["overrides"] if RECOMPUTE not in o] + list(overrides)
        result = plan_job(VerlJobSpec.model_validate(spec), nodes)
        assert result.plan is not None and result.plan.training is not None, result.violations
        return result.plan

    selective = f"{RECOMPUTE}granularity=selective"
    up_proj = f"{RECOMPUTE}modules=[core_attn,mla_up_proj]"
    full = (f"{RECOMPUTE}granularity=full", f"{RECOMPUTE}method=uniform", f"{RECOMPUTE}num_layers=1")
    tp8 = "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8"
    activations = [
        plan(tp8, *variant).memory.train.parts_gib["activations"]
        for variant in (full, (selective, up_proj), (selective,))
    ]
    assert activations == sorted(activations) and len(set(activations)) == 3
    # what mla_up_proj frees lets the search keep the update on TP 4 (twice the data parallelism) instead of 8
    assert (
        plan(selective, up_proj).training.tensor_parallel_size < plan(selective).training.tensor_parallel_size
    )


def test_the_megatron_plan_does_not_depend_on_node_order() -> None:
    job = load_job("megatron-deepseek-v3-h20.yaml")
    nodes = load_nodes(str(H20))
    shuffled = list(nodes)
    random.Random(7).shuffle(shuffled)
    spec = VerlJobSpec.model_validate(job["spec"])
    first, second = plan_job(spec, nodes).plan, plan_job(spec, shuffled).plan
    assert first is not None and second is not None
    assert first.training == second.training and first.overrides == second.overrides
