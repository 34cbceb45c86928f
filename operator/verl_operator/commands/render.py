"""``verl-operator render -f JOB.yaml --nodes NODES.yaml``: print the objects the operator would create."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import yaml


def add_parser(subparsers: Any) -> None:
    """Register the ``render`` subcommand."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "render",
        help="print the objects the operator would create for a VerlJob",
        description="Plan and place a VerlJob against NODES (GPUs in use: none) and print its children as YAML.",
    )
    p.add_argument("-f", "--filename", required=True, help="VerlJob YAML")
    p.add_argument(
        "--nodes", required=True, help="Nodes YAML (a v1 List, multi-document Nodes, or a devcluster profile)"
    )
    p.add_argument("--attempt", type=int, default=0, help="Ray cluster incarnation to render (default 0)")
    p.set_defaults(func=run)


def render(
    job: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], attempt: int = 0
) -> list[dict[str, Any]]:
    """The children of ``job`` on an idle cluster of ``nodes``.

    Raises:
        RenderError: The spec is invalid, infeasible, or cannot be placed.
    """
    from pydantic import ValidationError

    from verl_operator.api.errors import validation_lines
    from verl_operator.api.spec import VerlJob
    from verl_operator.api.status import VerlJobStatus
    from verl_operator.controller.pipeline import children_of, plan_and_place
    from verl_operator.controller.snapshot import Snapshot

    try:
        parsed = VerlJob.model_validate(job)
    except ValidationError as exc:
        raise RenderError(validation_lines(exc, root="")) from exc
    except RecursionError as exc:
        raise RenderError(["the VerlJob nests lists or mappings too deeply to validate"]) from exc
    spec = parsed.spec
    meta = {
        "namespace": "default",
        "uid": "00000000-0000-0000-0000-000000000000",
        **dict(job.get("metadata") or {}),
    }
    if "name" not in meta:
        raise RenderError(["metadata.name: required"])
    idle = Snapshot(nodes=list(nodes), pod_entries=(), reservations=())
    outcome = plan_and_place(spec, idle, attempt=attempt)
    if outcome.plan is None:
        raise RenderError([v.one_line() for v in outcome.violations])
    if outcome.placement is None:
        raise RenderError([outcome.message])
    status = VerlJobStatus(attempt=attempt, plan=outcome.plan, placement=outcome.placement)
    return children_of({**dict(job), "metadata": meta}, spec, status)


class RenderError(Exception):
    """The job cannot be rendered; ``problems`` says why, one line each."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


def run(args: argparse.Namespace) -> int:
    """Print the children as multi-document YAML; exit 1 when the job cannot be placed, 2 on bad input."""
    from verl_operator.commands.plan import InputError, load_nodes, read_yaml

    try:
        docs = read_yaml(args.filename)
        nodes = load_nodes(args.nodes)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    docs = [d for d in docs if d is not None]
    job = docs[0] if len(docs) == 1 else None
    if not isinstance(job, dict):
        print(f"error: {args.filename} is not a VerlJob object", file=sys.stderr)
        return 2
    try:
        children = render(job, nodes, args.attempt)
    except RenderError as exc:
        print("VerlJob cannot be rendered:", file=sys.stderr)
        for problem in exc.problems:
            print(f"- {problem}", file=sys.stderr)
        return 1
    sys.stdout.write(yaml.safe_dump_all(children, sort_keys=False))
    return 0
