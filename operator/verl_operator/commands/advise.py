"""``verl-operator advise``: a run's step phases, the bottleneck and the next single changes, re-planned.

Exit codes: 0 the run was read (advice or none), 2 a usage or parse error (no step with a step time).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from verl_contract.verl_metrics import read_steps
from verl_operator.advisor import GENERATION_TARGET, NoStepsError, Report, advise, analyse
from verl_operator.commands.plan import EXIT_USAGE, InputError, load_job, load_nodes
from verl_operator.planner import plan_job

EXIT_OK = 0


def add_parser(subparsers: Any) -> None:
    """Register the ``advise`` subcommand."""
    parser = subparsers.add_parser(
        "advise",
        help="Read a verl run's step metrics: phases, bottleneck and the next single changes (re-planned).",
        description=(
            "Read verl's step metrics from PATH (its file logger's JSON lines or its console output) and print "
            "each phase's seconds and share of the step, the bottleneck, the generation share against the "
            f"{GENERATION_TARGET:.0%} target and the advice. With -f JOB and --nodes NODES every change is "
            "re-planned by the planner first (a change admission would refuse is listed as refused). "
            "Exit 0 read, 2 usage or parse error."
        ),
    )
    parser.add_argument(
        "--metrics", required=True, help="verl's file-logger JSONL or console log ('-': stdin)."
    )
    parser.add_argument(
        "-f", "--filename", help="The job's VerlJob YAML (re-plans the advice, with --nodes)."
    )
    parser.add_argument(
        "--nodes", help="Nodes YAML the job runs on (kubectl get nodes -o yaml, or a profile)."
    )
    parser.add_argument(
        "--warmup", type=int, help="Leading steps left out of the medians (default: a third, at most 2)."
    )
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table", help="Output format.")
    parser.set_defaults(func=run)


def _lines(path: str) -> list[str]:
    if path == "-":
        return sys.stdin.read().splitlines()
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc


def build_report(args: argparse.Namespace) -> Report:
    """Read the metrics (and the job and nodes) of ``args`` and advise.

    Raises:
        InputError: unreadable files, a job without nodes (or nodes without a job), no step time.
    """
    if (args.filename is None) != (args.nodes is None):
        raise InputError("-f JOB and --nodes NODES go together: the advice is re-planned on the job's nodes")
    try:
        run = analyse(read_steps(_lines(args.metrics)), warmup=args.warmup)
    except NoStepsError as exc:
        raise InputError(f"{args.metrics}: {exc}") from exc
    if args.filename is None:
        return advise(run)
    job = load_job(args.filename)
    nodes = load_nodes(args.nodes)
    result = plan_job(job.spec, nodes)
    if not result.feasible or result.plan is None:
        lines = "; ".join(v.one_line() for v in result.violations)
        raise InputError(f"{args.filename}: the job itself does not plan on {args.nodes}: {lines}")
    return advise(run, spec=job.spec, plan=result.plan, nodes=nodes)


def print_table(report: Report, out: TextIO) -> None:
    """The human-readable report."""
    run = report.run
    out.write(
        f"steps           {len(run.steps)} (median over {len(run.measured)} after {run.warmup} warm-up)\n"
        f"step            {run.step_seconds:.1f} s\n"
        f"bottleneck      {run.bottleneck}\n"
        f"generation      {run.generation_share:.0%} of the step (target {GENERATION_TARGET:.0%})\n"
        "phase                     seconds   share\n"
    )
    for name, phase in run.phases.items():
        out.write(f"  {name:<22} {phase.seconds:>9.1f} {phase.share:>7.1%}\n")
    if not report.advice:
        out.write("advice          none\n")
    for i, item in enumerate(report.advice, 1):
        mark = "" if item.checked else " (not re-planned)"
        out.write(f"{i}. {item.setting}={json.dumps(item.value)}{mark}\n   why: {item.reason}\n")
        out.write(f"   effect: {item.effect}\n")
        if item.async_split is not None:
            split = item.async_split
            out.write(f"   split: {split.rollout_gpus} rollout GPUs : {split.trainer_gpus} trainer GPUs\n")
    for refused in report.refused:
        out.write(f"refused: {refused.setting}={json.dumps(refused.value)}: {refused.reason}\n")
    for note in report.notes:
        out.write(f"note: {note}\n")


def run(args: argparse.Namespace) -> int:
    try:
        report = build_report(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.output == "json":
        json.dump(report.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_table(report, sys.stdout)
    return EXIT_OK
