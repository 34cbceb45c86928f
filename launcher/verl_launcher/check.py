"""Check every node's probe against what the plan expects (``expect`` in the launch spec).

Pure: takes values, returns the list of differences (empty = the nodes match the plan).
"""

from __future__ import annotations

from collections.abc import Sequence

from verl_contract.gpu_product import product_label, same_product
from verl_contract.launch_spec import LaunchSpec
from verl_launcher.probe import NodeProbe

#: Allowed difference between the planned and the reported memory.total. Drivers, ECC and SKU revisions
#: move the reported value by a few hundred MiB (an H100 80GB HBM3 reports 81559 MiB, an A100 80GB 81920).
MEMORY_TOLERANCE_FRACTION = 0.02


def _domains_text(probe: NodeProbe) -> str:
    if probe.topology is None:
        return "unknown"
    return " ".join("{" + ",".join(map(str, d.gpus)) + "}" for d in probe.topology.nvlink_domains)


def check_node(probe: NodeProbe, spec: LaunchSpec) -> list[str]:
    """Compare one node's probe with the plan.

    Rules: the GPU count equals ``gpusPerNode``; every GPU's product equals ``expect.gpuProduct`` (GFD
    spelling) when set; every GPU's memory is within 2% of ``expect.gpuMemoryMiB`` when set; when
    ``expect.requireNvlink``, each aligned group of ``nvlinkGroupSize`` consecutive GPUs (0..g-1, g..2g-1,
    ...; the groups rollout tensor parallelism forms) is pairwise NVLink-connected. ``nvlinkGroupSize`` is the
    plan's ``nvlinkGroupPerNode`` (from the planner's Mesh): the node's part of a group that spans nodes.

    Args:
        probe: The node's probe.
        spec: The launch spec.

    Returns:
        One message per difference, each naming the node.
    """
    who = f"node {probe.node}" + (f" ({probe.ip})" if probe.ip else "")
    problems = [f"{who}: {error}" for error in probe.errors]
    if len(probe.gpus) != spec.gpus_per_node:
        problems.append(
            f"{who}: has {len(probe.gpus)} GPUs, the plan expects {spec.gpus_per_node} (gpusPerNode)"
        )
    problems += _product_problems(who, probe, spec)
    problems += _memory_problems(who, probe, spec)
    problems += _nvlink_problems(who, probe, spec)
    return problems


def _product_problems(who: str, probe: NodeProbe, spec: LaunchSpec) -> list[str]:
    """GPUs whose product is not ``expect.gpuProduct`` (``product_key`` spellings compare equal)."""
    expected = spec.expect.gpu_product
    if not expected:
        return []
    wrong = [g for g in probe.gpus if not same_product(g.name, expected)]
    if not wrong:
        return []
    names = sorted({product_label(g.name) for g in wrong})
    return [
        f"{who}: GPU(s) {','.join(str(g.index) for g in wrong)} are {', '.join(names)}, "
        f"the plan expects {expected} (expect.gpuProduct)"
    ]


def _memory_problems(who: str, probe: NodeProbe, spec: LaunchSpec) -> list[str]:
    """GPUs whose memory is unknown or more than 2% from ``expect.gpuMemoryMiB``, one message per value."""
    expected = spec.expect.gpu_memory_mib
    if not expected:
        return []
    tolerance = expected * MEMORY_TOLERANCE_FRACTION
    by_value: dict[int | None, list[int]] = {}
    for gpu in probe.gpus:
        if gpu.memory_mib is None or abs(gpu.memory_mib - expected) > tolerance:
            by_value.setdefault(gpu.memory_mib, []).append(gpu.index)
    return [
        f"{who}: GPU(s) {','.join(map(str, indices))} have "
        f"{'unknown memory' if memory is None else f'{memory} MiB'}, the plan expects "
        f"{expected} MiB +/- {MEMORY_TOLERANCE_FRACTION:.0%} (expect.gpuMemoryMiB)"
        for memory, indices in by_value.items()
    ]


def _nvlink_problems(who: str, probe: NodeProbe, spec: LaunchSpec) -> list[str]:
    """With ``expect.requireNvlink``: aligned groups of ``nvlinkGroupSize`` GPUs that are not all linked."""
    size = spec.expect.nvlink_group_size
    if not spec.expect.require_nvlink or size <= 1:
        return []
    topo = probe.topology
    if topo is None:
        return [f"{who}: the NVLink topology is unknown (no `nvidia-smi topo -m`), the plan requires it"]
    if spec.gpus_per_node % size:
        return [f"{who}: gpusPerNode {spec.gpus_per_node} is not a multiple of nvlinkGroupSize {size}"]
    problems = []
    for start in range(0, min(spec.gpus_per_node, topo.gpu_count), size):
        group = tuple(range(start, start + size))
        if group[-1] >= topo.gpu_count or not topo.nvlinked(group):
            problems.append(
                f"{who}: GPUs {','.join(map(str, group))} (an NVLink group of {size}, "
                f"expect.nvlinkGroupSize) are not all NVLink-connected; NVLink domains: {_domains_text(probe)}"
            )
    return problems


def check_nodes(probes: Sequence[NodeProbe], spec: LaunchSpec) -> list[str]:
    """Check every node; see :func:`check_node`. Nodes are reported in the given order."""
    problems: list[str] = []
    for probe in probes:
        problems.extend(check_node(probe, spec))
    return problems
