"""Refusals that name the field to change and never suggest the value already set: a pinned ETP that no EP
tiles with, a GPU memory only ``spec.resources.gpuMemoryMiB`` gives, an expert-parallel group across NVLink
domains under ``nvlink: required``."""

from __future__ import annotations

from typing import Any

from conftest import make_nodes, make_spec

from verl_operator.api.plan import Violation
from verl_operator.planner.job import plan_job

MOE = "Qwen/Qwen3-30B-A3B-Base"


def violations(**sections: Any) -> list[Violation]:
    nodes = sections.pop("nodes", make_nodes(2))
    result = plan_job(make_spec(sections.pop("gpus", 16), **sections), nodes)
    assert not result.feasible
    return result.violations


def megatron(**sizes: int) -> dict[str, Any]:
    return {"engine": "megatron", "megatron": sizes}


def test_a_pinned_etp_that_tiles_nothing_is_named_with_other_etps() -> None:
    vs = violations(
        model=MOE,
        parallelism=megatron(expertParallelSize=1, expertTensorParallelSize=3, pipelineParallelSize=1),
    )
    (v,) = [v for v in vs if v.rule == "megatron-expert-mesh"]
    assert v.field == "spec.parallelism.megatron.expertTensorParallelSize"
    assert "EP 1 x ETP 3 = 3 does not tile the 16 TP x DP x CP ranks" in v.message
    assert v.suggestions == ["use ETP 2 or 4"]
    assert not any(s.endswith(" 1") and "EP" in s for s in v.suggestions)  # EP 1 is what is set


def test_a_memory_the_spec_gives_names_gpu_memory_mib() -> None:
    vs = violations(gpus=8, resources={"gpuMemoryMiB": 1}, nodes=make_nodes(1, product=None, memory_mib=None))
    memory = [v for v in vs if v.rule.startswith("memory-")]
    assert memory and all(v.field == "spec.resources.gpuMemoryMiB" for v in memory)
    assert "spec.resources.gpuMemoryMiB 1: the nodes publish no GPU memory" in memory[0].message
    assert memory[0].suggestions[0].startswith("set spec.resources.gpuMemoryMiB to one GPU's memory in MiB")


def test_a_labelled_memory_still_names_the_gpus() -> None:
    vs = violations(gpus=1, model="Qwen/Qwen2.5-72B-Instruct", nodes=make_nodes(1, gpus=1))
    assert any(v.rule.startswith("memory-") and v.field == "spec.resources.gpus" for v in vs), [
        v.one_line() for v in vs
    ]


def test_an_expert_parallel_group_across_nodes_is_refused_under_nvlink_required() -> None:
    vs = violations(model=MOE, parallelism=megatron(expertParallelSize=16), placement={"nvlink": "required"})
    (v,) = [v for v in vs if v.rule == "megatron-ep-nvlink"]
    assert v.field == "spec.parallelism.megatron.expertParallelSize"
    assert "EP 16 x ETP 1 = 16 GPUs spans 2 NVLink domains of 8 GPUs" in v.message
    assert v.suggestions == ["use EP 8", "or set spec.placement.nvlink: preferred"]
    preferred = plan_job(
        make_spec(
            16, model=MOE, parallelism=megatron(expertParallelSize=8), placement={"nvlink": "required"}
        ),
        make_nodes(2),
    )
    assert preferred.feasible, [x.one_line() for x in preferred.violations]
