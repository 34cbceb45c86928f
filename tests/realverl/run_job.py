"""Watch verl train: plan a tiny job, run verl 0.6.1's real trainer through the launcher on a local two-node Ray
(CPU, fake GPUs), and print the head's output (the launcher's lines, Ray's and verl's own step lines) as it
comes. ``make verl-cpu-job`` runs it; ``ALGORITHM=ppo`` trains with a critic.

    python tests/realverl/run_job.py [--algorithm grpo|ppo] [--steps N] [--keep]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import cpu_env
from realverl_job import LocalJob, job_spec, plan, start_two_nodes


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", choices=("grpo", "ppo"), default="grpo")
    parser.add_argument("--steps", type=int, default=2, help="training steps (1-16)")
    parser.add_argument("--keep", action="store_true", help="keep the job folder (logs, launch.json)")
    args = parser.parse_args(argv)
    if not 1 <= args.steps <= 16:
        parser.error(f"--steps {args.steps}: choose 1 to 16 (16 rows, batch 4: up to 4 steps an epoch)")
    python = cpu_env.ensure()
    assets = cpu_env.ensure_assets(python)
    spec = plan(f"cpu-{args.algorithm}", job_spec(assets, args.algorithm, steps=args.steps))
    job = LocalJob(root=Path(tempfile.mkdtemp(prefix="rv-")), python=python)
    print(
        f"job folder {job.root}; verl's argv (the planner's overrides):",
        *spec.overrides,
        sep="\n  ",
        flush=True,
    )
    try:
        head, _ = start_two_nodes(job, spec)
        with head.log.open(errors="replace") as log:
            while True:  # follow the head's log until the launcher exits
                chunk = log.read()
                if chunk:
                    sys.stdout.write(chunk)
                    sys.stdout.flush()
                elif head.proc.poll() is not None:
                    break
                else:
                    time.sleep(0.5)
        print(f"\nlauncher exit {head.proc.returncode}: {head.termination()}")
        return head.proc.returncode or 0
    finally:
        job.stop()
        if not args.keep:
            shutil.rmtree(job.root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
