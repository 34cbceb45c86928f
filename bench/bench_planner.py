"""Planning time of ``plan_job`` at 8, 64, 512 and 1024 GPUs (8-GPU H100 nodes, one spare node).

Run: ``.venv/bin/python bench/bench_planner.py [--repeat N]``. Prints a table of the median and best wall time
per call for a feasible plan (Qwen2.5-7B GRPO, everything left to the planner), a plan with pinned overrides
(a pasted verl command line) and Qwen2.5-72B with 32k-token responses (infeasible on 8 GPUs: the search runs to exhaustion first).
Then ``moe-671b``: DeepSeek-V3 (671B, 256 experts) with the Megatron engine on 1000 8-GPU H20 nodes (8000 GPUs),
with the offload and recompute settings of verl's 96 GB DeepSeek script and the mesh left to the planner, given
the nodes' facts already read (``moe-671b``: as the operator's watch cache passes them) and as Node objects
(``moe-nodes``: every Node read on each call).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

from verl_operator.api.spec import VerlJobSpec
from verl_operator.planner import plan_job
from verl_operator.planner.facts import node_facts

GPU_COUNTS = (8, 64, 512, 1024)
ARR = "actor_rollout_ref"


def nodes(count: int) -> list[dict[str, Any]]:
    return [
        {
            "metadata": {
                "name": f"gpu-{i:04d}",
                "labels": {
                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                    "nvidia.com/gpu.memory": "81559",
                },
            },
            "status": {
                "allocatable": {"cpu": "192", "nvidia.com/gpu": "8"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        for i in range(count)
    ]


def spec(gpus: int, model: str, **extra: Any) -> VerlJobSpec:
    doc: dict[str, Any] = {
        "verl": {"image": "x"},
        "model": {"path": model},
        "resources": {"gpus": gpus},
        **extra,
    }
    return VerlJobSpec.model_validate(doc)


def scenarios(gpus: int) -> dict[str, VerlJobSpec]:
    pasted = [
        f"data.train_batch_size={gpus * 16}",
        f"{ARR}.rollout.n=5",
        f"{ARR}.actor.ppo_mini_batch_size={gpus * 4}",
        f"{ARR}.actor.ppo_micro_batch_size_per_gpu=8",
        f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=16",
        f"{ARR}.rollout.tensor_model_parallel_size=2",
        f"{ARR}.rollout.gpu_memory_utilization=0.6",
        "trainer.total_epochs=15",
        "trainer.logger=['console','wandb']",
    ]
    return {
        "open": spec(gpus, "Qwen/Qwen2.5-7B-Instruct"),
        "pasted": spec(gpus, "Qwen/Qwen2.5-7B-Instruct", overrides=pasted),
        "72b-32k": spec(gpus, "Qwen/Qwen2.5-72B-Instruct", data={"maxResponseLength": 32000}),
    }


#: The Megatron scenario: nodes of H20 96GB and the job's GPUs (all of them).
MOE_NODES = 1000


def moe_scenario(gpus: int) -> VerlJobSpec:
    """DeepSeek-V3 GRPO with the Megatron engine, the mesh left to the planner (verl's 96 GB script's offloads,
    full recompute, one layer on the last pipeline stage)."""
    otc = f"{ARR}.actor.megatron.override_transformer_config"
    ooc = f"+{ARR}.actor.optim.override_optimizer_config"
    return spec(
        gpus,
        "deepseek-ai/DeepSeek-V3",
        verl={"image": "x", "version": "0.9"},
        algorithm="grpo",
        data={"trainBatchSize": gpus, "maxPromptLength": 2048, "maxResponseLength": 9632},
        rollout={"responsesPerPrompt": 8, "tensorParallelSize": 32, "gpuMemoryUtilization": 0.6},
        parallelism={"engine": "megatron"},
        batching={"ppoMiniBatchSize": gpus // 4, "dynamicBatchSize": True, "maxTokenLenPerGpu": 11680},
        offload={"params": True, "optimizer": True},
        overrides=[
            f"{ARR}.actor.use_kl_loss=True",
            f"{ARR}.ref.megatron.param_offload=True",
            f"{ooc}.optimizer_cpu_offload=True",
            f"{ooc}.optimizer_offload_fraction=1.0",
            f"{ooc}.use_precision_aware_optimizer=True",
            f"{otc}.recompute_granularity=full",
            f"{otc}.recompute_method=uniform",
            f"{otc}.recompute_num_layers=1",
            f"+{otc}.num_layers_in_last_pipeline_stage=1",
        ],
    )


def h20_nodes(count: int) -> list[dict[str, Any]]:
    out = nodes(count)
    for node in out:
        node["metadata"]["labels"].update(
            {"nvidia.com/gpu.product": "NVIDIA-H20", "nvidia.com/gpu.memory": "97871"}
        )
    return out


def timeit(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    print(f"{'GPUs':>6} {'nodes':>6} {'scenario':<11} {'feasible':<9} {'median ms':>10} {'best ms':>9}")
    for gpus in GPU_COUNTS:
        cluster = nodes(gpus // 8 + 1)
        for name, job in scenarios(gpus).items():
            feasible = plan_job(job, cluster).feasible  # warm caches (catalog file)
            med, best = timeit(functools.partial(plan_job, job, cluster), args.repeat)
            print(
                f"{gpus:>6} {len(cluster):>6} {name:<11} {feasible!s:<9} {med * 1e3:>10.2f} {best * 1e3:>9.2f}"
            )
    cluster = h20_nodes(MOE_NODES)
    facts = [node_facts(n) for n in cluster]  # what the operator's watch cache holds per Node
    job = moe_scenario(MOE_NODES * 8)
    result = plan_job(job, facts)
    gpus = MOE_NODES * 8
    for name, given in (("moe-671b", facts), ("moe-nodes", cluster)):
        med, best = timeit(functools.partial(plan_job, job, given), args.repeat)
        print(
            f"{gpus:>6} {len(cluster):>6} {name:<11} {result.feasible!s:<9} {med * 1e3:>10.2f} {best * 1e3:>9.2f}"
        )
    if result.plan is not None and result.plan.training is not None:
        t = result.plan.training
        print(
            f"  moe-671b mesh: TP {t.tensor_parallel_size} PP {t.pipeline_parallel_size} EP {t.expert_parallel_size} "
            f"ETP {t.expert_tensor_parallel_size} VPP {t.virtual_pipeline_parallel_size} DP {t.data_parallel_size}"
        )


if __name__ == "__main__":
    main()
