"""Shared factories and fixtures for the unit tests: Kubernetes Node dicts, VerlJob specs, the helm binary."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import pytest

from verl_operator.api.spec import VerlJobSpec
from verl_operator.planner.catalog import CatalogEntry, lookup
from verl_operator.planner.inputs import Problem, Settings


def make_node(
    name: str,
    gpus: int = 8,
    product: str | None = "NVIDIA-H100-80GB-HBM3",
    memory_mib: int | None = 81559,
    *,
    labels: dict[str, str] | None = None,
    ready: bool = True,
    unschedulable: bool = False,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """One Node object as ``kubectl get node -o json`` prints it (camelCase)."""
    all_labels = {"kubernetes.io/hostname": name}
    if product is not None:
        all_labels["nvidia.com/gpu.product"] = product
    if memory_mib is not None:
        all_labels["nvidia.com/gpu.memory"] = str(memory_mib)
    all_labels.update(labels or {})
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": str(gpus)},
            "capacity": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }
    if unschedulable:
        node["spec"]["unschedulable"] = True
    if taints:
        node["spec"]["taints"] = taints
    return node


def make_nodes(
    count: int,
    gpus: int = 8,
    product: str | None = "NVIDIA-H100-80GB-HBM3",
    memory_mib: int | None = 81559,
    *,
    prefix: str = "gpu",
    labels: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """``count`` identical GPU nodes named ``{prefix}-0`` ... (zero-padded so that names sort numerically)."""
    width = len(str(max(count - 1, 0)))
    return [
        make_node(f"{prefix}-{i:0{width}d}", gpus, product, memory_mib, labels=labels) for i in range(count)
    ]


def make_spec(gpus: int = 8, model: str = "Qwen/Qwen2.5-7B-Instruct", **sections: Any) -> VerlJobSpec:
    """A VerlJobSpec from camelCase sections (``data={"trainBatchSize": 64}``, ``overrides=[...]``)."""
    doc: dict[str, Any] = {"verl": {"image": "example.com/verl:0.9.1"}, "model": {"path": model}}
    resources = {"gpus": gpus, **sections.pop("resources", {})}
    doc["resources"] = resources
    for key, value in sections.items():
        doc[key] = value
    return VerlJobSpec.model_validate(doc)


def catalog_entry(model: str) -> CatalogEntry:
    """The catalog entry of ``model`` (a LookupError when absent)."""
    entry = lookup(model)
    if entry is None:
        raise LookupError(f"{model} is not in the catalog")
    return entry


QWEN7B = catalog_entry("Qwen/Qwen2.5-7B-Instruct")


def make_problem(**kw: Any) -> Problem:
    """Planner facts for Qwen2.5-7B (28 heads, 4 KV heads) on 80 GB GPUs, verl 0.9; ``kw`` overrides fields."""
    base = Problem(
        adv_estimator="grpo",
        model_path="Qwen/Qwen2.5-7B-Instruct",
        version="0.9",
        shape=QWEN7B.shape,  # 28 heads, 4 KV heads, 32768 positions
        params=QWEN7B.params_total,
        needs_critic=False,
        uses_ref=False,
        lora=False,
        gradient_checkpointing=True,
        max_prompt_length=512,
        max_response_length=1024,
        max_model_len=None,
        max_num_batched_tokens=8192,
        max_num_seqs=256,
        ref_param_offload=False,
        critic_offload=False,
        nvlink_required=False,
        use_remove_padding=None,
        critic_max_token_len_per_gpu=None,
        gpu_memory_bytes=81559 * 2**20,
        nvlink_domain=8,
    )
    return replace(base, **kw)


def make_settings(**kw: Any) -> Settings:
    """A candidate layout: 8 GPUs, batch 1024 x 5, TP 2, mini 256, micro 16; ``kw`` overrides fields."""
    base = Settings(
        world=8,
        nnodes=1,
        gpus_per_node=8,
        train_batch_size=1024,
        rollout_n=5,
        rollout_tp=2,
        gpu_memory_utilization=0.6,
        sequence_parallel_size=1,
        fsdp_size=-1,
        ppo_mini_batch_size=256,
        ppo_micro_batch_size_per_gpu=16,
        log_prob_micro_batch_size_per_gpu=32,
        dynamic_batch_size=False,
        max_token_len_per_gpu=None,
        log_prob_max_token_len_per_gpu=None,
        param_offload=False,
        optimizer_offload=False,
    )
    return replace(base, **kw)


@pytest.fixture(scope="session")
def helm() -> str:
    """``$HELM`` when set, else the project's pinned helm (built once from its Go module into the cache)."""
    override = os.environ.get("HELM")
    if override:
        return override
    from verl_devtools.devcluster import binaries

    return str(binaries.ensure(("helm",))["helm"])
