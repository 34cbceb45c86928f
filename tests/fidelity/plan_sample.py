"""A broad, seeded sample of VerlJob specs x simulated GPU node sets, for the planner's fidelity test.

Deterministic: the same seed gives the same sample. Each draw picks a verl line, a model from the
planner's catalog, a node set (product, GPUs per node, node count), the GPUs to use, an algorithm, and
optionally pins some settings (batch sizes, rollout n and TP, SP, dynamic batching, KL loss, lengths)
the way users do, through structured fields or raw overrides.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

SAMPLE_SIZE = 400  # draws; about 60% are feasible, so a few hundred plans over both versions
#: The verl release each VerlJob version line is checked against.
RELEASE = {"0.6": "0.6.1", "0.9": "0.9.1"}

MODELS: tuple[str, ...] = (
    "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen/Qwen2.5-3B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen2.5-32B-Instruct",
    "Qwen/Qwen3-8B",
    "Qwen/Qwen3-30B-A3B",
    "meta-llama/Llama-3.1-8B-Instruct",
    "deepseek-ai/deepseek-llm-7b-chat",
    "google/gemma-2-2b-it",
)

#: (nvidia.com/gpu.product label, nvidia.com/gpu.memory MiB, GPUs per node choices)
GPU_KINDS: tuple[tuple[str, int, tuple[int, ...]], ...] = (
    ("NVIDIA-H100-80GB-HBM3", 81559, (8, 4)),
    ("NVIDIA-A100-SXM4-40GB", 40960, (8, 4)),
    ("NVIDIA-H200", 143771, (8,)),
    ("NVIDIA-L40S", 46068, (4, 2)),
    ("NVIDIA-A10G", 23028, (4, 1)),
)


#: Overrides from verl's example scripts that the planner does not own.
PASS_THROUGH: tuple[tuple[str, ...], ...] = (
    ("trainer.total_epochs=2",),
    ("actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.model.enable_gradient_checkpointing=True"),
    ("trainer.logger=['console']", "trainer.project_name=verl_grpo_example", "trainer.save_freq=20"),
    ("algorithm.use_kl_in_reward=False", "trainer.critic_warmup=0", "trainer.test_freq=5"),
    ("actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.rollout.temperature=1.0"),
)


def make_node(name: str, gpus: int, product: str, memory_mib: int) -> dict[str, Any]:
    """A Ready GPU Node as the API server returns it (camelCase)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.memory": str(memory_mib),
                "nvidia.com/gpu.count": str(gpus),
            },
        },
        "spec": {},
        "status": {
            "allocatable": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": str(gpus)},
            "capacity": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


@dataclasses.dataclass(frozen=True)
class Draw:
    """One sampled job: the spec (camelCase wire dict) and the cluster's nodes."""

    label: str
    spec: dict[str, Any]
    nodes: list[dict[str, Any]]


def _maybe(rng: random.Random, probability: float, value: Any) -> Any:
    return value if rng.random() < probability else None


def draw(rng: random.Random, index: int) -> Draw:
    """One random job spec and node set."""
    version = rng.choice(("0.6", "0.9"))
    model = rng.choice(MODELS)
    product, memory_mib, per_node_choices = rng.choice(GPU_KINDS)
    per_node = rng.choice(per_node_choices)
    node_count = rng.choice((1, 1, 2, 3, 4, 8))
    nodes = [make_node(f"n{index}-{i}", per_node, product, memory_mib) for i in range(node_count)]
    total = per_node * node_count
    gpus = rng.choice(sorted({total, max(1, total // 2), per_node, min(total, 2 * per_node)}))
    algorithm = rng.choice(("grpo", "grpo", "ppo", "rloo", "reinforce_plus_plus"))
    n = rng.choice((None, 1, 4, 5, 8, 16)) if algorithm != "ppo" else rng.choice((None, 1, 2))
    prompt, response = rng.choice(((512, 512), (1024, 1024), (512, 2048), (2048, 4096)))
    data: dict[str, Any] = {"maxPromptLength": prompt, "maxResponseLength": response}
    tbs = _maybe(rng, 0.5, rng.choice((32, 60, 64, 96, 128, 256, 512, 1024)))
    if tbs is not None:
        data["trainBatchSize"] = tbs
    overrides: list[str] = []
    raw = rng.random() < 0.4  # pins written as raw verl overrides, as pasted from an example script
    rollout: dict[str, Any] = {}
    if n is not None:
        if raw:
            overrides.append(f"actor_rollout_ref.rollout.n={n}")
        else:
            rollout["responsesPerPrompt"] = n
    tp = _maybe(rng, 0.25, rng.choice((1, 2, 4, 8)))
    if tp is not None:
        if raw:
            overrides.append(f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}")
        else:
            rollout["tensorParallelSize"] = tp
    parallelism: dict[str, Any] = {}
    sp = _maybe(rng, 0.2, rng.choice((1, 2, 4)))
    if sp is not None:
        parallelism["sequenceParallelSize"] = sp
    batching: dict[str, Any] = {}
    if rng.random() < 0.25:
        batching["dynamicBatchSize"] = True
    if tbs is not None and rng.random() < 0.3:
        batching["ppoMiniBatchSize"] = rng.choice([m for m in (8, 16, 32, 64, 128, 256) if m <= tbs] or [tbs])
    if rng.random() < 0.3:
        overrides.append("actor_rollout_ref.actor.use_kl_loss=True")
        overrides.append("actor_rollout_ref.actor.kl_loss_coef=0.001")
    if rng.random() < 0.3:  # settings the planner does not own pass through to verl unchanged
        overrides += rng.choice(PASS_THROUGH)
    spec: dict[str, Any] = {
        "verl": {"image": "verl:test", "version": version},
        "model": {"path": model},
        "algorithm": algorithm,
        "data": data,
        "resources": {"gpus": gpus},
        "rollout": rollout,
        "parallelism": parallelism,
        "batching": batching,
        "overrides": overrides,
    }
    label = f"{index:03d}-v{version}-{model.split('/')[-1]}-{algorithm}-{gpus}x{product.split('-')[1]}"
    return Draw(label=label, spec=spec, nodes=nodes)


def sample(count: int, seed: int = 20260) -> list[Draw]:
    """``count`` draws from a fixed seed."""
    rng = random.Random(seed)
    return [draw(rng, index) for index in range(count)]


def model_shape(spec: Any) -> dict[str, Any]:
    """The plan's model shape as camelCase: the spec's, else the planner's catalog entry."""
    from verl_operator.planner import catalog

    if spec.model.shape is not None:
        return dict(spec.model.shape.to_wire())
    entry = catalog.lookup(spec.model.path)
    assert entry is not None, f"the sample uses {spec.model.path}, which is not in the catalog"
    return dict(entry.shape.to_wire())
