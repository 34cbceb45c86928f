"""The placement snapshot built from the operator's indices: GPUs in use per node, reservations."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_node

from verl_operator.controller.snapshot import (
    Reservations,
    gpus_in_use,
    node_capacity,
    pod_gpu_request,
    pod_usage_entry,
)


def pod(
    gpus: str | None,
    node: str | None = "n0",
    phase: str = "Running",
    job: str | None = None,
    pinned: str | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if gpus is not None:
        resources = {"limits": {"nvidia.com/gpu": gpus}}
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": "u1", "labels": {}, "annotations": {}}
    if job:
        meta["labels"]["verl-operator.io/job"] = job
    if pinned:
        meta["annotations"]["verl-operator.io/node"] = pinned
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": resources}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        pytest.param(pod("4"), ("n0", "u1", 4, None), id="bound-limits-only"),
        pytest.param(pod("8", node=None, pinned="n3", job="j"), ("n3", "u1", 8, "ns/j"), id="gated-pinned"),
        pytest.param(pod("8", phase="Succeeded"), None, id="finished-frees-gpus"),
        pytest.param(pod("8", phase="Failed"), None, id="failed-frees-gpus"),
        pytest.param(pod(None), None, id="cpu-pod"),
        pytest.param(pod("2", node=None), None, id="unbound-unpinned"),
    ],
)
def test_pod_usage_entry(manifest: dict[str, Any], expected: tuple[str, str, int, str | None] | None) -> None:
    assert pod_usage_entry(manifest) == expected


def test_pod_gpu_request_sums_containers_and_prefers_requests() -> None:
    manifest = {
        "spec": {
            "containers": [
                {"resources": {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}},
                {"resources": {"limits": {"nvidia.com/gpu": "1"}}},
            ]
        }
    }
    assert pod_gpu_request(manifest) == 3


def test_gpus_in_use_counts_foreign_pods_and_other_jobs_reservations() -> None:
    entries = [
        ("n0", "a", 2, None),
        ("n0", "b", 8, "ns/live"),
        ("n1", "c", 1, None),
        ("n3", "d", 4, "ns/deleted"),
    ]
    reservations = [("job-a", ("n0", "n1"), 8), ("job-b", ("n2",), 4)]
    used = gpus_in_use(entries, reservations, exclude_job_uid="job-b", live_jobs=frozenset({"ns/live"}))
    # A live VerlJob's pods are covered by its reservation (not counted twice); a deleted job's pods
    # still hold their GPUs until they are gone.
    assert used == {"n0": 10, "n1": 9, "n3": 4}


def test_reservations_of_deleted_jobs_are_dropped() -> None:
    res = Reservations({"gone": (("n0",), 8), "live": (("n1",), 8)})
    merged = res.merged([("live", ("n9",), 8), ("other", ("n2",), 4)], frozenset({"live", "other"}))
    assert merged == [("live", ("n1",), 8), ("other", ("n2",), 4)], "this process's decision is newer"
    assert "gone" not in res.decided


def test_node_capacity_from_a_node_object() -> None:
    node = make_node("dgx-0", gpus=8, labels={"nvidia.com/gpu.clique": "abcdef01-0000.1"})
    cap = node_capacity(node)
    assert (cap.name, cap.gpus, cap.gpu_product, cap.nvlink_domain_size, cap.clique) == (
        "dgx-0",
        8,
        "NVIDIA-H100-80GB-HBM3",
        8,
        "abcdef01-0000.1",
    )
    assert cap.schedulable
    assert not node_capacity(make_node("x", ready=False)).schedulable
    assert not node_capacity(make_node("y", unschedulable=True)).schedulable
