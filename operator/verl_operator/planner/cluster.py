"""Which nodes can host the job, grouped into uniform pools, and the node counts a job can use.

A pool is a set of eligible nodes with one GPU product, GPU memory and NVLink domain size (the memory model and
the NVLink rules need one value). A layout picks GPUs per node and a node count from a pool.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_contract.gpu_product import product_key, same_product
from verl_operator.api.spec import VerlJobSpec
from verl_operator.planner.facts import NodeFacts, Taint, cpu_millicores, memory_bytes
from verl_operator.planner.mesh import pod_cpu, pod_memory

#: Taints that GPU pods tolerate by convention (the operator adds these tolerations to its pods).
TOLERATED_TAINT_KEYS: frozenset[str] = frozenset({"nvidia.com/gpu"})


@dataclass(frozen=True)
class Pool:
    """Eligible nodes with identical GPU product, memory and NVLink domain size, in natural name order."""

    product: str
    memory_mib: int
    nvlink_domain: int
    nodes: tuple[NodeFacts, ...]
    #: The node label that names the product on these nodes (GFD's, or a cloud's), for a scheduler's
    #: nodeSelector; empty when no label names it.
    selector: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Layout:
    """GPUs per node and node count chosen from a pool, with the nodes that can hold that many GPUs."""

    pool: Pool
    gpus_per_node: int
    nnodes: int
    candidates: tuple[str, ...]
    nvlink_domain: int
    #: The CPU request of each pod (``mesh.pod_cpu``): the candidates offer at least that much.
    cpu_per_node: str = ""

    @property
    def world(self) -> int:
        """Total GPUs."""
        return self.gpus_per_node * self.nnodes


@functools.lru_cache(
    maxsize=65536
)  # node names repeat on every plan; sized for clusters of tens of thousands
def name_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Natural sort key: ``gpu-2`` before ``gpu-10``."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part)


def _tolerated(taint: Taint, tolerations: Sequence[Mapping[str, Any]]) -> bool:
    if taint.effect not in ("NoSchedule", "NoExecute") or taint.key in TOLERATED_TAINT_KEYS:
        return True
    for tol in tolerations:
        effect = tol.get("effect") or ""
        if effect and effect != taint.effect:
            continue
        op = tol.get("operator") or "Equal"
        key = tol.get("key") or ""
        if op == "Exists" and (not key or key == taint.key):
            return True
        if op == "Equal" and key == taint.key and str(tol.get("value") or "") == taint.value:
            return True
    return False


#: bfloat16 needs compute capability 8.0 (Ampere) or newer: vLLM refuses ``dtype=bfloat16`` below it, and
#: torch's bf16 kernels are emulated or missing on Volta and Turing.
BF16_MIN_COMPUTE = (8, 0)


def exclusion_reason(node: NodeFacts, spec: VerlJobSpec) -> str | None:
    """Why a node cannot host the job's pods, or None when it can.

    Args:
        node: The node's facts.
        spec: The job (GPU product, GPU memory, dtype, node selector, tolerations).
    """
    res = spec.resources
    if node.gpu_mig is not None:
        return node.gpu_mig
    if node.gpus <= 0:
        return "no allocatable nvidia.com/gpu"
    if not node.ready:
        return "not Ready"
    if not node.schedulable:
        return "cordoned (spec.unschedulable)"
    if node.gpu_sharing is not None:
        physical = node.gpus // node.gpu_replicas if node.gpu_replicas > 1 else None
        count = f"{node.gpus} advertised GPUs are {physical} physical ones" if physical else "GPUs are shared"
        return (
            f"time-sliced replicas of one GPU ({node.gpu_sharing}): the {count}, and verl cannot put two "
            "ranks on one physical GPU"
        )
    if res.gpu_product and not same_product(res.gpu_product, node.gpu_product):
        return f"GPU product {node.gpu_product or 'unknown'} is not {res.gpu_product}"
    for key, value in sorted(res.node_selector.items()):
        if node.labels.get(key) != value:
            return f"label {key}={value} missing"
    for taint in node.taints:
        if not _tolerated(taint, res.tolerations):
            return f"taint {taint.key}={taint.value}:{taint.effect} not tolerated"
    cc = node.compute_capability
    if spec.model.dtype == "bfloat16" and cc is not None and cc < BF16_MIN_COMPUTE:
        return (
            f"compute capability {cc[0]}.{cc[1]} ({node.gpu_product or 'GPU'}): bfloat16 needs 8.0 or newer "
            "(vLLM refuses it); set spec.model.dtype: float16"
        )
    if node.gpu_memory_mib is None and res.gpu_memory_mib is None:
        return f"GPU memory unknown: {memory_hint(node)}"
    return None


def memory_hint(node: NodeFacts) -> str:
    """Which label is missing for the GPU memory of ``node``, and how to supply it."""
    fix = "label the node nvidia.com/gpu.memory=<MiB> or set spec.resources.gpuMemoryMiB"
    if node.gpu_product:
        return f"no nvidia.com/gpu.memory label and {node.gpu_product} is not in the built-in table; {fix}"
    return (
        "no nvidia.com/gpu.product or nvidia.com/gpu.memory label (GPU Feature Discovery is not installed?); "
        f"install GPU Feature Discovery, {fix}"
    )


def product_selector(node: NodeFacts) -> tuple[tuple[str, str], ...]:
    """``((label, value),)``: the label the node's GPU product was read from, as the node carries it."""
    key = node.gpu_product_source
    return ((key, node.labels[key]),) if key and key in node.labels else ()


def gpu_memory(node: NodeFacts, spec: VerlJobSpec) -> int | None:
    """GPU memory of ``node`` in MiB: its labels' or the product table's, else ``spec.resources.gpuMemoryMiB``."""
    return node.gpu_memory_mib if node.gpu_memory_mib is not None else spec.resources.gpu_memory_mib


#: GPU memory that differs by at most this share between nodes of one product is one physical model read in
#: two label styles (GFD's NVML total, 81559 MiB for an H100 80GB, against Karpenter's nominal 81920).
SAME_MODEL_MEMORY = 0.03


def select(facts: Sequence[NodeFacts], spec: VerlJobSpec) -> tuple[list[Pool], dict[str, str]]:
    """Eligible nodes grouped into pools, and the reason each other node was excluded.

    A pool is one physical GPU model: the product compared as :func:`same_product` does (any label style or
    spelling), its memory within :data:`SAME_MODEL_MEMORY` (the pool takes the smallest), one NVLink domain
    size. So idle GPUs of one model whose nodes are labelled in another style (GKE's, Karpenter's) are used by
    the same plan. A job handed to a scheduler of its own (``scheduling.gang`` kueue or volcano) keeps one
    product label per pool: its pods select the pool's nodes by that label.

    Pools are ordered by GPU memory ascending, then product name (best fit: the smallest GPUs that can hold
    the job are tried first, leaving larger ones to larger jobs).
    """
    excluded: dict[str, str] = {}
    by_model: dict[tuple[str, int, tuple[tuple[str, str], ...]], list[tuple[int, NodeFacts]]] = {}
    own_label = spec.scheduling.gang != "builtin"
    for node in sorted(facts, key=lambda n: name_key(n.name)):
        reason = exclusion_reason(node, spec)
        if reason is not None:
            excluded[node.name] = reason
            continue
        memory = gpu_memory(node, spec)
        assert memory is not None  # exclusion_reason guarantees it
        label = product_selector(node) if own_label else ()
        key = (product_key(node.gpu_product or ""), node.nvlink_domain_size, label)
        by_model.setdefault(key, []).append((memory, node))
    groups: list[tuple[str, int, int, tuple[tuple[str, str], ...], list[NodeFacts]]] = []
    for (_, domain, label), members in by_model.items():
        for part in _memory_classes(members):
            nodes = sorted((n for _, n in part), key=lambda n: name_key(n.name))
            labels = {product_selector(n) for n in nodes}
            selector = next(iter(labels)) if len(labels) == 1 else label
            groups.append((nodes[0].gpu_product or "", min(m for m, _ in part), domain, selector, nodes))
    pools = [
        Pool(product=g[0], memory_mib=g[1], nvlink_domain=g[2], nodes=tuple(g[4]), selector=g[3])
        for g in sorted(groups, key=lambda g: (g[1], g[0], g[2], g[3]))
    ]
    return pools, excluded


def _memory_classes(members: list[tuple[int, NodeFacts]]) -> list[list[tuple[int, NodeFacts]]]:
    """``(memory, node)`` of one product split where the memory grows by more than :data:`SAME_MODEL_MEMORY`
    (an A100 of 40 and of 80 GB stay apart; 81559 and 81920 MiB are one)."""
    out: list[list[tuple[int, NodeFacts]]] = []
    for memory, node in sorted(members, key=lambda m: (m[0], name_key(m[1].name))):
        if out and memory <= out[-1][0][0] * (1 + SAME_MODEL_MEMORY):
            out[-1].append((memory, node))
        else:
            out.append([(memory, node)])
    return out


def _domains(nodes: Sequence[NodeFacts], spec: VerlJobSpec) -> list[list[NodeFacts]]:
    key = spec.placement.topology_key
    if not key or spec.placement.topology_policy != "required":
        return [list(nodes)]
    by: dict[str, list[NodeFacts]] = {}
    for n in nodes:
        if key in n.labels:
            by.setdefault(n.labels[key], []).append(n)
    return [by[k] for k in sorted(by, key=lambda k: (-len(by[k]), k))]


def cpu_needed(spec: VerlJobSpec, gpus_per_node: int) -> int:
    """Millicores a node must offer: the pod's CPU request (``mesh.pod_cpu``: ``resources.cpuPerNode``, else
    verl's placement group, 3 per GPU, + 2); a request this parser does not read counts as verl's."""
    parsed = cpu_millicores(pod_cpu(spec.resources.cpu_per_node, gpus_per_node))
    if parsed is not None:
        return parsed
    return int(pod_cpu(None, gpus_per_node)) * 1000


def memory_needed(spec: VerlJobSpec, gpus_per_node: int) -> int | None:
    """Bytes a node must offer: the pod's memory request (``mesh.pod_memory``); None when the request is a
    quantity this parser does not read (the scheduler then decides alone)."""
    return memory_bytes(pod_memory(spec.resources.memory_per_node, gpus_per_node))


def _node_fits(n: NodeFacts, gpus: int, cpus: int, memory: int | None) -> bool:
    """A node offers the GPUs, CPUs and memory of one pod (a node that reports no CPU or memory is not
    filtered on it)."""
    return (
        n.gpus >= gpus
        and (n.cpu_millicores is None or n.cpu_millicores >= cpus)
        and (memory is None or n.memory_bytes is None or n.memory_bytes >= memory)
    )


def layouts(pool: Pool, spec: VerlJobSpec, gpus_per_node: int | None) -> list[Layout]:
    """The layouts of ``spec.resources.gpus`` GPUs on a pool, most GPUs per node (fewest nodes) first.

    A layout needs ``gpus % gpus_per_node == 0`` and ``gpus / gpus_per_node`` nodes with at least that many
    GPUs, the CPUs of verl's placement group (``cpu_needed``) and the pod's memory request (``memory_needed``;
    nodes that do not report CPUs or memory are not filtered on them), in one ``topologyKey`` domain when ``topologyPolicy: required``. Ray waits forever for a
    placement group no node can hold, so this is checked here.

    Args:
        pool: The pool.
        spec: The job.
        gpus_per_node: The pinned GPUs per node, or None to try every divisor of the GPU count.
    """
    gpus = spec.resources.gpus
    max_gpn = max((n.gpus for n in pool.nodes), default=0)
    options = (
        [gpus_per_node] if gpus_per_node else [g for g in range(min(gpus, max_gpn), 0, -1) if gpus % g == 0]
    )
    out: list[Layout] = []
    for gpn in options:
        if gpus % gpn:
            continue
        nnodes = gpus // gpn
        cpus, memory = cpu_needed(spec, gpn), memory_needed(spec, gpn)
        fitting = [n for n in pool.nodes if _node_fits(n, gpn, cpus, memory)]
        domains = [d for d in _domains(fitting, spec) if len(d) >= nnodes]
        if not domains:
            continue
        names = tuple(n.name for d in domains for n in d)
        candidates = tuple(dict.fromkeys(names))
        domain = min(pool.nvlink_domain, gpn)
        candidate_set = set(candidates)
        chosen = [n for n in fitting if n.name in candidate_set]
        cliques = {n.clique for n in chosen}
        if None not in cliques and chosen:
            # A group larger than a node needs the job's nodes in one clique (placement puts all of them there).
            largest = max(sum(1 for n in chosen if n.clique == c) for c in cliques)
            if largest >= nnodes:
                domain = max(domain, nnodes * gpn)
        out.append(Layout(pool, gpn, nnodes, candidates, domain, pod_cpu(spec.resources.cpu_per_node, gpn)))
    return out
