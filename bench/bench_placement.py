"""Placement search time for growing clusters (prints a table; no assertions).

Run: ``.venv/bin/python bench/bench_placement.py``. Each row places one job on a cluster of N 8-GPU nodes in
racks of 16, with a quarter of the nodes partly busy, under ``topologyPolicy`` required and preferred.
"""

from __future__ import annotations

import time

from verl_operator.placement import NodeCapacity, PlacementRequest, place

RACK = "network.topology.nvidia.com/leaf"


def cluster(nodes: int) -> tuple[list[NodeCapacity], dict[str, int]]:
    caps = [
        NodeCapacity(name=f"n{i:05d}", labels={RACK: f"rack-{i // 16}"}, gpus=8, nvlink_domain_size=8)
        for i in range(nodes)
    ]
    used = {c.name: 4 for i, c in enumerate(caps) if i % 4 == 0}
    return caps, used


def timed(request: PlacementRequest, caps: list[NodeCapacity], used: dict[str, int], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        place(request, caps, used)
    return (time.perf_counter() - start) / repeat * 1000


def main() -> None:
    print(f"{'nodes':>6} {'gpus':>6} {'job nodes':>9} {'required ms':>12} {'preferred ms':>13}")
    for nodes in (16, 128, 1024, 4096):
        caps, used = cluster(nodes)
        job_nodes = min(8, nodes // 2)
        repeat = max(3, 2000 // nodes)
        req = PlacementRequest(
            nnodes=job_nodes, gpus_per_node=8, topology_key=RACK, topology_policy="required"
        )
        pref = PlacementRequest(
            nnodes=job_nodes, gpus_per_node=8, topology_key=RACK, topology_policy="preferred"
        )
        print(
            f"{nodes:>6} {nodes * 8:>6} {job_nodes:>9} {timed(req, caps, used, repeat):>12.3f} "
            f"{timed(pref, caps, used, repeat):>13.3f}"
        )


if __name__ == "__main__":
    main()
