"""One admission request with many unknown keys one typo away from real ones: its time, before and after the
key index.

Run: ``.venv/bin/python bench/bench_key_suggestions.py [--keys 256] [--repeat 5]``. Each request is a VerlJob
(Qwen2.5-7B, 8 GPUs) whose overrides are ``--keys`` known verl 0.9 keys with their last letter changed, sent
through ``admission_problems`` as the webhook sends it (its 0.8 s deadline on the real clock).

- ``before``: every unknown key gets suggestions from ``difflib.get_close_matches`` over all known keys (the
  way ``verl_keys`` worked before the index), outside the plan's budget;
- ``after``: the index (``verl_keys.similar``), at most ``verl_keys.MAX_SUGGESTED`` keys a request, on the
  budget.

Prints the median and best wall time of the request, and of one key's suggestions.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from verl_operator.controller.webhook import admission_problems
from verl_operator.planner import verl_keys


def node(name: str) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"}
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "status": {
            "allocatable": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def typo_keys(count: int) -> list[str]:
    """``count`` known verl 0.9 keys (longer than 12 characters) with their last letter changed."""
    keys = sorted(k for k in verl_keys.known_keys("0.9") if len(k) > 12)
    return [f"{k[:-1]}{'x' if k[-1] != 'x' else 'y'}" for k in keys[:count]]


def similar_before(key: str, version: str) -> list[str]:
    """The suggestions as computed before the index: the same last name, then difflib over every key."""
    keys = verl_keys.known_keys(version)
    leaf, head = key.rsplit(".", 1)[-1], key.split(".", 1)[0]
    same_leaf = sorted(k for k in keys if k.rsplit(".", 1)[-1] == leaf and k.split(".", 1)[0] == head)
    close = difflib.get_close_matches(key, sorted(keys), n=3, cutoff=0.75)
    return list(dict.fromkeys(same_leaf[:3] + close))[:3]


@contextlib.contextmanager
def before() -> Iterator[None]:
    """``verl_keys`` as it was: every unknown key suggested, by a full difflib search."""
    saved = verl_keys.similar, verl_keys.MAX_SUGGESTED
    verl_keys.similar, verl_keys.MAX_SUGGESTED = similar_before, 10**9
    try:
        yield
    finally:
        verl_keys.similar, verl_keys.MAX_SUGGESTED = saved


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    typos = typo_keys(args.keys)
    spec = {
        "verl": {"image": "verl:0.9.1", "version": "0.9"},
        "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
        "resources": {"gpus": 8},
        "overrides": [f"{k}=1" for k in typos],
    }
    nodes = [node("gpu-0")]
    verl_keys.key_index("0.9")  # built once per process, as in the operator
    print(f"{len(typos)} unknown keys one typo away from verl 0.9.1's, one request (repeat {args.repeat})")
    print(f"{'':8} {'request median ms':>18} {'best ms':>9} {'suggested':>10} {'per key us':>11}")
    for label, mode in (("before", before), ("after", contextlib.nullcontext)):
        with mode():
            problems = admission_problems(spec, None, nodes)
            request = timed(lambda: admission_problems(spec, None, nodes), args.repeat)
            one = timed(lambda: [verl_keys.similar(k, "0.9") for k in typos[:32]], args.repeat)
        suggested = sum("(suggestions: use " in p for p in problems)
        assert len(problems) == len(typos), problems[:3]
        print(
            f"{label:8} {statistics.median(request) * 1e3:18.1f} {min(request) * 1e3:9.1f} {suggested:10d}"
            f" {statistics.median(one) / 32 * 1e6:11.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
