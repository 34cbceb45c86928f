"""Placement and the placing decision for growing clusters (prints tables; no assertions).

Run: ``.venv/bin/python bench/bench_placement.py [--profile NODES]``.

1. ``place()`` per call for one 64-GPU job (8 nodes of 8 GPUs) on clusters of N 8-GPU nodes in racks of 16,
   a quarter of the nodes half busy, under ``topologyPolicy`` required and preferred, and without a policy
   (the default preference: a rack, then a block, then anywhere); and the same requests
   on a :class:`~verl_operator.placement.index.NodeIndex` that already screened its shape (what a decision
   pays while no Node changes a fact).
2. The operator's placing decision (``controller.decide.place_job``: plan, candidates, queue, placement,
   the status) for the scale benchmark's jobs (``bench/scale_support.py``: GRPO on Qwen2.5-7B over 1, 2, 4
   and 8 whole DGX H100 nodes in turn) on its node profile of N nodes, a quarter of the nodes taken by other
   jobs, with the watch cache's memo of one node facts version: p50 and p90 over 200 decisions, the largest
   status written, and the plans computed (the others were the memo's).

Times are the CPU time of the benchmark's thread (``time.thread_time``), so other work on a shared machine
does not inflate them; wall clock inside the operator adds what the event loop and other threads take.
3. ``--profile NODES``: the top entries of a cProfile of 200 such decisions on NODES nodes.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scale_support as S
from verl_operator.api.spec import VerlJobSpec
from verl_operator.api.status import VerlJobStatus
from verl_operator.clusters.profile import node_manifests, parse_profile
from verl_operator.controller.decide import place_job
from verl_operator.controller.observed import Observed
from verl_operator.controller.snapshot import Snapshot, SnapshotMemo, node_capacity
from verl_operator.placement import NodeCapacity, PlacementRequest, place
from verl_operator.placement.index import NodeIndex
from verl_operator.planner.facts import NETWORK_DOMAINS, node_facts

RACK = "network.topology.nvidia.com/leaf"
DECISIONS = 200


def cluster(nodes: int) -> tuple[list[NodeCapacity], dict[str, int]]:
    caps = [
        NodeCapacity(name=f"n{i:05d}", labels={RACK: f"rack-{i // 16}"}, gpus=8, nvlink_domain_size=8)
        for i in range(nodes)
    ]
    used = {c.name: 4 for i, c in enumerate(caps) if i % 4 == 0}
    return caps, used


def timed(request: PlacementRequest, caps: list[NodeCapacity], used: dict[str, int], repeat: int) -> float:
    start = time.thread_time()
    for _ in range(repeat):
        place(request, caps, used)
    return (time.thread_time() - start) / repeat * 1000


def timed_index(request: PlacementRequest, index: NodeIndex, used: dict[str, int], repeat: int) -> float:
    index.place(request, used)  # its shape screened once
    start = time.thread_time()
    for _ in range(repeat):
        index.place(request, used)
    return (time.thread_time() - start) / repeat * 1000


def place_table() -> None:
    print(
        f"{'nodes':>6} {'gpus':>6} {'job nodes':>9} {'required ms':>12} {'preferred ms':>13} "
        f"{'default ms':>11} {'index required ms':>18} {'index preferred ms':>19} {'index default ms':>17}"
    )
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
        default = PlacementRequest(nnodes=job_nodes, gpus_per_node=8, preferred_domains=NETWORK_DOMAINS)
        index = NodeIndex(caps)
        print(
            f"{nodes:>6} {nodes * 8:>6} {job_nodes:>9} {timed(req, caps, used, repeat):>12.3f} "
            f"{timed(pref, caps, used, repeat):>13.3f} {timed(default, caps, used, repeat):>11.3f} "
            f"{timed_index(req, index, used, repeat):>18.3f} {timed_index(pref, index, used, repeat):>19.3f} "
            f"{timed_index(default, index, used, repeat):>17.3f}"
        )


def scale_snapshot(nodes: int) -> Snapshot:
    """The scale benchmark's N nodes, every fourth taken by another job, with a fresh memo."""
    facts = [node_facts(m) for m in node_manifests(parse_profile(S.scale_profile(nodes)))]
    reserved = [(f"other-{i}", (facts[i].name,), 8) for i in range(0, nodes, 4)]
    return Snapshot(
        nodes=facts,
        pod_entries=[],
        reservations=reserved,
        capacities=[node_capacity(f) for f in facts],
        facts_version=1,
        memo=SnapshotMemo(),
    )


def decide_once(snap: Snapshot, index: int) -> tuple[float, int]:
    """One placing decision of the ``index``-th job: (milliseconds, bytes of the status it writes)."""
    job = S.verljob(index, "bench")
    job["metadata"].update(uid=f"u{index}", generation=1, creationTimestamp="2026-01-01T00:00:00Z")
    seen = Observed(job=job, status=VerlJobStatus(), snapshot=snap, reserved=snap.reservations, now=1.0)
    start = time.thread_time()
    transition = place_job(seen, VerlJobSpec.model_validate(job["spec"]))
    elapsed = (time.thread_time() - start) * 1000
    status = transition.status.to_wire() if transition.status is not None else {}
    return elapsed, len(json.dumps(status, separators=(",", ":")))


def decision_table() -> None:
    print(f"{'nodes':>6} {'p50 ms':>8} {'p90 ms':>8} {'status bytes':>13} {'plans computed':>15}")
    for nodes in (1000, 5000):
        snap = scale_snapshot(nodes)
        runs = [decide_once(snap, i) for i in range(DECISIONS)]
        times = sorted(t for t, _ in runs)
        memo = snap.memo
        computed = memo.plans_computed if memo is not None else DECISIONS
        print(
            f"{nodes:>6} {statistics.median(times):>8.2f} {times[int(len(times) * 0.9)]:>8.2f} "
            f"{max(b for _, b in runs):>13} {computed:>15}"
        )


def profile(nodes: int) -> None:
    snap = scale_snapshot(nodes)
    prof = cProfile.Profile()
    prof.enable()
    for i in range(DECISIONS):
        decide_once(snap, i)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(15)
    print(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--profile", type=int, metavar="NODES", help="cProfile the decision on NODES nodes")
    args = parser.parse_args()
    if args.profile:
        profile(args.profile)
        return
    place_table()
    print()
    decision_table()


if __name__ == "__main__":
    main()
