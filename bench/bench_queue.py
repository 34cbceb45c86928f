"""Queue-order cost per placement pass for growing queues and clusters (prints a table; no assertions).

Run: ``.venv/bin/python bench/bench_queue.py``. Each row times what one pass of the job at the back of the
queue adds to its placement: ordering the queue (``ahead_of``) and placing the jobs ahead of it on a copy of
the free GPUs (``hold_for``), for 4-node jobs of 8 GPUs per node on N 8-GPU nodes. ``head blocked``: every
GPU is busy, so the head holds every node and the walk stops there (the usual case of a long queue);
``k fit``: the cluster is idle and the k jobs ahead all fit (a wake-up before they are placed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from verl_operator.controller.queue import NO_PRIORITIES, Waiting, ahead_of, hold_for, rank
from verl_operator.placement import NodeCapacity, PlacementRequest


def queue(jobs: int) -> list[Waiting]:
    request = PlacementRequest(nnodes=4, gpus_per_node=8)
    return [
        Waiting(
            key=f"ns/j{i:05d}",
            uid=f"j{i}",
            priority_class=None,
            created=f"2026-01-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z",
            request=request,
        )
        for i in range(jobs)
    ]


def timed_ms(fn: Callable[[], object], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1000


def row(nodes: int, jobs: int) -> str:
    caps = [NodeCapacity(name=f"n{i:05d}", gpus=8) for i in range(nodes)]
    busy = {c.name: 8 for c in caps}
    waiting = queue(jobs)
    last = rank(0, "9999", "ns/last")
    ahead = ahead_of(waiting, last, "last", NO_PRIORITIES)
    repeat = max(3, 3000 // nodes)
    order = timed_ms(partial(ahead_of, waiting, last, "last", NO_PRIORITIES), repeat)
    blocked = timed_ms(partial(hold_for, ahead, caps, busy), repeat)
    fit10 = timed_ms(partial(hold_for, ahead[:10], caps, {}), repeat)
    fit100 = timed_ms(partial(hold_for, ahead[: min(100, nodes // 4)], caps, {}), max(1, repeat // 10))
    return f"{nodes:>6} {jobs:>6} {order:>9.2f} {blocked:>16.2f} {fit10:>10.2f} {fit100:>11.2f}"


def main() -> None:
    print(
        f"{'nodes':>6} {'queue':>6} {'order ms':>9} {'head blocked ms':>16} {'10 fit ms':>10} {'100 fit ms':>11}"
    )
    for nodes, jobs in ((128, 100), (1024, 1000), (5000, 1000)):
        print(row(nodes, jobs))


if __name__ == "__main__":
    main()
