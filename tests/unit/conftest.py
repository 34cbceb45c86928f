"""Shared factories for the unit tests: Kubernetes Node dicts and VerlJob specs."""

from __future__ import annotations

from typing import Any

from verl_operator.api.spec import VerlJobSpec


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
