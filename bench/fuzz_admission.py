"""The long fuzz run of admission: hostile and careless specs through the webhook's check and the planner.

Run: ``.venv/bin/python bench/fuzz_admission.py [--examples N] [--seed S]`` (``make bench`` runs the default, 3000).
Draws specs from the generated CRD schema and verl's override grammar (``tests/unit/hostile_specs.py``, the
same strategies as the unit-tier sample), calls ``admission_problems`` on each (as the webhook does, with its
0.8 s deadline on the real clock) and prints: how many were admitted, denied by the schema, the policy or the
planner (by rule), unexpected errors (must be 0), plans that ran out of budget, and the latency percentiles.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))

from conftest import make_nodes
from hostile_specs import hostile_specs
from hypothesis import HealthCheck, given, seed, settings

from verl_operator.controller.webhook import admission_problems

NODES = make_nodes(2, gpus=8) + make_nodes(2, gpus=4, prefix="l40s", product="NVIDIA-L40S", memory_mib=46068)


def classify(problems: list[str]) -> str:
    """The outcome of one admission: admitted, or the kind of the first denial."""
    if not problems:
        return "admitted"
    first = problems[0]
    if "the operator could not check this spec" in first:
        return "UNEXPECTED"
    if "too large to plan" in first:
        return "too-large-to-plan"
    if "(policy " in first:
        return "denied: policy"
    if any(
        word in first
        for word in (
            "Input should",
            "String should",
            "List should",
            "Extra inputs",
            "Field required",
            "Dictionary should",
        )
    ):
        return "denied: schema"
    return "denied: planner"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=20261201)
    args = parser.parse_args()
    outcomes: collections.Counter[str] = collections.Counter()
    timings: list[float] = []
    worst: list[tuple[float, Any]] = []
    unexpected: list[tuple[Any, str]] = []

    @seed(args.seed)
    @settings(
        max_examples=args.examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(hostile_specs())
    def run(spec: dict[str, Any]) -> None:
        started = time.perf_counter()
        problems = admission_problems(spec, None, NODES)
        elapsed = time.perf_counter() - started
        timings.append(elapsed)
        outcome = classify(problems)
        outcomes[outcome] += 1
        if outcome == "UNEXPECTED" and len(unexpected) < 3:
            unexpected.append((spec, problems[0]))
        worst.append((elapsed, spec))
        worst.sort(key=lambda t: -t[0])
        del worst[3:]

    started = time.perf_counter()
    run()
    total = time.perf_counter() - started
    timings.sort()

    def pct(q: float) -> float:
        return timings[min(len(timings) - 1, int(q * len(timings)))] * 1000

    print(f"fuzz admission: {len(timings)} specs in {total:.1f} s (seed {args.seed})")
    for name, count in sorted(outcomes.items(), key=lambda kv: -kv[1]):
        print(f"  {name:24s} {count:6d}")
    print(
        f"  latency ms: median {statistics.median(timings) * 1000:.2f}  p99 {pct(0.99):.2f}  "
        f"p99.9 {pct(0.999):.2f}  max {timings[-1] * 1000:.2f}"
    )
    slow_ms, slow_spec = worst[0]
    print(f"  slowest: {slow_ms * 1000:.1f} ms: {json.dumps(slow_spec)[:300]}")
    for spec, problem in unexpected:
        print(f"  UNEXPECTED: {problem}\n    spec: {json.dumps(spec)[:600]}")
    return 1 if outcomes["UNEXPECTED"] else 0


if __name__ == "__main__":
    sys.exit(main())
