"""VerlJob manifests for the tests and benchmarks that run against a devcluster."""

from __future__ import annotations

from typing import Any

GROUP, VERSION, PLURAL = "verl-operator.io", "v1alpha1", "verljobs"
#: A verl image name for simulated pods (kwok runs no container).
IMAGE = "ghcr.io/example/verl:0.9.1"


def verljob(
    name: str,
    gpus: int = 8,
    *,
    model: str = "Qwen/Qwen2.5-7B-Instruct",
    train_batch_size: int | None = None,
    gpus_per_node: int = 8,
    resources: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A VerlJob of ``gpus`` GPUs, ``gpus_per_node`` per pod, GRPO with 4 responses per prompt and a train batch
    of 8 prompts per GPU unless given; ``resources`` adds to the resources section, ``spec`` sets other sections
    (camelCase, whole)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VerlJob",
        "metadata": {"name": name},
        "spec": {
            "verl": {"image": IMAGE},
            "model": {"path": model},
            "data": {"trainBatchSize": train_batch_size if train_batch_size is not None else 8 * gpus},
            "rollout": {"responsesPerPrompt": 4},
            "resources": {"gpus": gpus, "gpusPerNode": gpus_per_node, **(resources or {})},
            **spec,
        },
    }
