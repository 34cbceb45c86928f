"""``verl-operator plan``: plan a VerlJob against a node list (a file or a live cluster) and print the result.

Exit codes: 0 feasible, 1 invalid or infeasible, 2 usage or parse error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml
from pydantic import ValidationError

from verl_contract.verl_metrics import read_steps
from verl_operator.advisor.balance import BalanceError, Pools, balance_from_status, measured_balance
from verl_operator.advisor.phases import NoStepsError, analyse
from verl_operator.api.errors import validation_lines
from verl_operator.api.plan import Plan, PlanResult
from verl_operator.api.spec import VerlJob
from verl_operator.planner import plan_job
from verl_operator.planner.pools import read_mode
from verl_operator.planner.split_model import Measured

EXIT_FEASIBLE = 0
EXIT_INFEASIBLE = 1
EXIT_USAGE = 2


class InputError(Exception):
    """A file that cannot be read or parsed (exit code 2)."""


def add_parser(subparsers: Any) -> None:
    """Register the ``plan`` subcommand."""
    parser = subparsers.add_parser(
        "plan",
        help="Plan a VerlJob on a set of nodes (valid mesh, batch sizes, memory) without creating anything.",
        description=(
            "Print the plan (or the violations) for JOB.yaml on the nodes of NODES.yaml "
            "(kubectl get nodes -o yaml) or of a live cluster (--kubeconfig). "
            "Exit 0 feasible, 1 invalid or infeasible, 2 usage or parse error."
        ),
    )
    parser.add_argument("-f", "--filename", required=True, help="The VerlJob YAML file.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--nodes",
        help="Nodes YAML: a v1 List (kubectl get nodes -o yaml), multi-document Nodes, or a devcluster profile.",
    )
    source.add_argument("--kubeconfig", help="Read the nodes of a live cluster with this kubeconfig.")
    parser.add_argument(
        "-o", "--output", choices=("table", "json", "yaml"), default="table", help="Output format."
    )
    parser.add_argument(
        "--metrics",
        help=(
            "A previous run's verl step metrics (file-logger JSONL or console log): a two-pool job whose spec "
            "leaves the split open is split by the run's measured generation vs training time."
        ),
    )
    parser.add_argument(
        "--from-status",
        action="store_true",
        help=(
            "Split a two-pool job by the phase times of its own last run: the file's status.progress on the "
            "pools of its status.plan (kubectl get verljob NAME -o yaml)."
        ),
    )
    parser.add_argument(
        "--measured-pools",
        metavar="ROLLOUT:TRAINER",
        help="The GPUs of the measured run's rollout and trainer pools (a two-pool run; none: it was colocated).",
    )
    parser.set_defaults(func=run)


def read_yaml(path: str) -> list[Any]:
    """The YAML documents of ``path``.

    Raises:
        InputError: unreadable file, not UTF-8 text, bad YAML, or nesting deeper than the parser can follow.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"
        ) from exc
    try:
        return list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise InputError(f"{path} is not valid YAML: {exc}") from exc
    except RecursionError as exc:
        raise InputError(f"{path} nests lists or mappings too deeply to read") from exc


def load_job(path: str) -> VerlJob:
    """Read and validate a VerlJob file.

    Raises:
        InputError: unreadable file, bad YAML, or a spec that does not validate (with the field paths).
    """
    docs = [d for d in read_yaml(path) if d is not None]
    if len(docs) > 1:
        raise InputError(f"{path} holds {len(docs)} YAML documents; expected one VerlJob")
    doc = docs[0] if docs else None
    if not isinstance(doc, dict):
        raise InputError(f"{path} does not hold a VerlJob object")
    return validate_job(doc, path)


def validate_job(doc: Mapping[str, Any], path: str) -> VerlJob:
    """Validate a VerlJob document read from ``path``.

    Raises:
        InputError: the document does not validate (one line per field path) or nests too deeply.
    """
    try:
        return VerlJob.model_validate(doc)
    except ValidationError as exc:
        lines = [f"{path}: invalid VerlJob:", *(f"  {line}" for line in validation_lines(exc, root=""))]
        raise InputError("\n".join(lines)) from exc
    except RecursionError as exc:
        raise InputError(f"{path} nests lists or mappings too deeply to validate") from exc


def load_nodes(path: str) -> list[dict[str, Any]]:
    """Read Node objects from a v1 List, a NodeList, a single Node, multi-document YAML, or a devcluster
    profile (``examples/clusters/*.yaml``: its simulated nodes, taken as Ready).

    Raises:
        InputError: unreadable file, bad YAML, or documents that are not Nodes.
    """
    docs = read_yaml(path)
    nodes: list[dict[str, Any]] = []
    for doc in docs:
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise InputError(f"{path}: a document is not a Kubernetes object")
        kind = doc.get("kind")
        if kind in ("List", "NodeList"):
            for item in doc.get("items") or []:
                if not isinstance(item, dict) or item.get("kind", "Node") != "Node":
                    raise InputError(f"{path}: a list item is not a Node")
                nodes.append(item)
        elif kind == "Node":
            nodes.append(doc)
        elif kind is None and "nodeGroups" in doc:
            nodes.extend(_profile_nodes(doc, path))
        else:
            raise InputError(
                f"{path}: expected Node, NodeList, List or a devcluster profile, got kind {kind!r}"
            )
    return nodes


def _profile_nodes(doc: dict[str, Any], path: str) -> list[dict[str, Any]]:
    from verl_operator.clusters.profile import ProfileError, node_manifests, parse_profile

    try:
        manifests = node_manifests(parse_profile(doc, path))
    except ProfileError as exc:
        raise InputError(str(exc)) from exc
    nodes = []
    for node in manifests:
        status = dict(node.get("status") or {})
        status.setdefault("conditions", [{"type": "Ready", "status": "True"}])
        nodes.append({**node, "status": status})
    return nodes


def live_nodes(kubeconfig: str) -> list[dict[str, Any]]:
    """List the nodes of a live cluster as camelCase dicts.

    Raises:
        InputError: the kubeconfig cannot be loaded or the API server cannot be reached.
    """
    from kubernetes import config  # the planner itself never imports the Kubernetes client

    try:
        api_client: Any = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except Exception as exc:  # a missing or bad kubeconfig
        raise InputError(f"cannot list nodes with {kubeconfig}: {exc}") from exc
    return list_nodes(api_client, kubeconfig)


def list_nodes(api_client: Any, source: str) -> list[dict[str, Any]]:
    """The nodes an API client sees, as camelCase dicts (``source`` names the cluster in errors).

    Raises:
        InputError: the API server cannot be reached or refuses the list.
    """
    from kubernetes import client

    try:
        listed = client.CoreV1Api(api_client).list_node()
        data = api_client.sanitize_for_serialization(listed)  # camelCase, as kubectl prints it
    except Exception as exc:  # TLS and HTTP errors all mean "cannot read the nodes"
        raise InputError(f"cannot list nodes with {source}: {exc}") from exc
    items = data.get("items") or []
    return [i for i in items if isinstance(i, dict)]


def candidates_text(plan: Plan) -> str:
    """``3 nodes: a, b, c`` or ``5000 nodes: a, b, c, d, e, ...``: the count and the plan's sample."""
    count = plan.candidate_node_count
    more = ", ..." if count > len(plan.candidate_nodes_sample) else ""
    return f"{count} node{'s' if count != 1 else ''}: {', '.join(plan.candidate_nodes_sample)}{more}"


def _mesh_rows(plan: Plan) -> list[tuple[str, str]]:
    """The training mesh: FSDP's ``world / DP / SP / fsdp``, or Megatron's sizes."""
    t = plan.training
    if t is None or t.engine != "megatron":
        return [
            (
                "world / DP / SP / fsdp",
                f"{plan.world_size} / {plan.data_parallel_size} / "
                f"{plan.sequence_parallel_size} / {plan.fsdp_size}",
            )
        ]
    etp = (
        t.expert_tensor_parallel_size if t.expert_tensor_parallel_size is not None else t.tensor_parallel_size
    )
    vpp = t.virtual_pipeline_parallel_size
    return [
        ("world / DP", f"{plan.world_size} / {t.data_parallel_size}"),
        (
            "megatron",
            f"TP {t.tensor_parallel_size} x PP {t.pipeline_parallel_size} x CP {t.context_parallel_size}, "
            f"EP {t.expert_parallel_size} x ETP {etp}, VPP {vpp if vpp is not None else 'none'}",
        ),
    ]


def _pool_rows(plan: Plan) -> list[tuple[str, str]]:
    """The trainer mode and its pools (none for verl's colocated trainer); the rows after them are the trainer
    pool's."""
    pools = plan.pools
    if pools is None:
        return []
    t, r = pools.trainer, pools.rollout
    rows = [("mode", f"{pools.mode} ({pools.entrypoint})")]
    if r is None:
        return rows
    fraction = f", model {pools.model_rollout_fraction:.0%} rollout" if pools.model_rollout_fraction else ""
    if pools.measured_rollout_fraction is not None:
        model = f" (model {pools.model_rollout_fraction:.0%})" if pools.model_rollout_fraction else ""
        fraction = f", measured {pools.measured_rollout_fraction:.0%} rollout{model}"
    if pools.split == "measured":
        fraction = fraction.removeprefix(", measured")
    shared = ", shared" if pools.shared_nodes else ""
    rows += [
        ("trainer pool", f"{t.gpus} GPUs = {t.nnodes} x {t.gpus_per_node}, {t.mesh}" + _peak(t.peak_gib)),
        (
            "rollout pool",
            f"{r.gpus} GPUs = {r.nnodes} x {r.gpus_per_node}, {r.mesh}"
            + (f", {r.idle_gpus} idle" if r.idle_gpus else "")
            + _peak(r.peak_gib)
            + (f" (KV cache {r.memory_gib['kvCache']})" if "kvCache" in r.memory_gib else ""),
        ),
        ("split", f"{pools.split}{fraction}; {pools.nodes} nodes{shared}"),
    ]
    if pools.split_basis:
        rows.append(("measured", pools.split_basis))
    if pools.invariants:
        rows.append(("invariants", ", ".join(f"{k} {v}" for k, v in pools.invariants.items())))
    return rows


def _peak(gib: float | None) -> str:
    return f", peak {gib} GiB per GPU" if gib is not None else ""


def _plan_rows(plan: Plan) -> list[tuple[str, str]]:
    """The ``name  value`` rows of a feasible plan in the human view.

    A little over 60 lines: one row (or choice of rows) per line of the printed table, kept in table order.
    """
    b, ro, mem = plan.batching, plan.rollout, plan.memory
    rows = [
        ("verl", plan.verl_version),
        *_pool_rows(plan),
        ("nodes", f"{plan.nnodes} x {plan.gpus_per_node} GPUs ({plan.node_pool.gpu_product})"),
        ("candidates", candidates_text(plan)),
        *_mesh_rows(plan),
        (
            "rollout",
            f"{ro.mode}, TP {ro.tensor_parallel_size}, {ro.replicas} replicas, "
            f"{ro.prompts_per_replica:g} prompts each, gmu {ro.gpu_memory_utilization}",
        ),
        (
            "batch",
            f"{b.train_batch_size} prompts x n {b.rollout_n} = {b.trajectories_per_step} trajectories",
        ),
        (
            "mini-batch",
            f"{b.ppo_mini_batch_size} prompts -> {b.mini_batch_per_gpu} per GPU, "
            f"{b.mini_batches_per_step} per step",
        ),
    ]
    if b.dynamic_batch_size:
        rows.append(
            (
                "token budget",
                f"{b.max_token_len_per_gpu} per GPU (log-prob {b.log_prob_max_token_len_per_gpu})",
            )
        )
    else:
        rows.append(
            (
                "micro-batch",
                f"{b.ppo_micro_batch_size_per_gpu} -> {b.gradient_accumulation_steps} "
                "grad-accumulation steps",
            )
        )
        rows.append(
            (
                "log-prob micro",
                f"{b.log_prob_micro_batch_size_per_gpu} -> {b.log_prob_passes_per_gpu} passes per GPU",
            )
        )
    rows.append(
        (
            "memory (GiB)",
            f"rollout {mem.rollout_peak_gib}, train {mem.train_peak_gib}, "
            f"log-prob {mem.log_prob_peak_gib} of {mem.gpu_memory_gib}",
        )
    )
    if plan.padding.padded_trajectories:
        rows.append(
            (
                "padding",
                f"{plan.padding.padded_trajectories} trajectories ({plan.padding.waste_fraction:.1%})",
            )
        )
    return rows


def render_table(result: PlanResult) -> str:
    """The human view: a summary, the derived numbers, the memory estimate and the overrides."""
    out: list[str] = []
    plan = result.plan
    if plan is None:
        out.append("INFEASIBLE")
        for v in result.violations:
            out.append(f"  x {v.field} [{v.rule}]")
            out.append(f"      {v.message}")
            for s in v.suggestions:
                out.append(f"      -> {s}")
    else:
        rows = _plan_rows(plan)
        width = max(len(k) for k, _ in rows)
        out.append("FEASIBLE")
        out += [f"  {k.ljust(width)}  {v}" for k, v in rows]
        out.append("  overrides:")
        out += [f"    {o}" for o in plan.overrides]
    for w in result.warnings:
        out.append(f"  ! {w}")
    return "\n".join(out) + "\n"


def write_result(result: PlanResult, fmt: str, stream: TextIO) -> None:
    """Print the result in ``table``, ``json`` or ``yaml``."""
    if fmt == "json":
        stream.write(json.dumps(result.to_json_dict(), indent=2) + "\n")
    elif fmt == "yaml":
        stream.write(yaml.safe_dump(result.to_json_dict(), sort_keys=False))
    else:
        stream.write(render_table(result))


def plan_files(
    job_path: str,
    nodes: Sequence[Mapping[str, Any]],
    metrics: str | None = None,
    measured_pools: str | None = None,
    from_status: bool = False,
) -> PlanResult:
    """Plan the job in ``job_path`` on ``nodes`` (split by the run in ``metrics``, or by the job's own
    ``status.progress`` with ``from_status``, when given)."""
    job = load_job(job_path)
    measured = None
    if metrics is not None and from_status:
        raise InputError("--metrics and --from-status are two sources of one measurement: give one")
    if measured_pools is not None and metrics is None:
        raise InputError("--measured-pools goes with --metrics: the pools of the run the metrics measured")
    if metrics is not None:
        measured = read_balance(job, metrics, measured_pools)
    elif from_status:
        try:
            measured = balance_from_status(job.status, read_mode(job.spec)[0].mode)
        except BalanceError as exc:
            raise InputError(f"{job_path}: {exc}") from exc
    return plan_job(job.spec, nodes, measured=measured)


def read_balance(job: VerlJob, path: str, pools_text: str | None) -> Measured:
    """The measured balance of the run whose metrics are in ``path`` (``advisor.balance``).

    Raises:
        InputError: unreadable file, no step time, or metrics that do not measure the balance.
    """
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        run = analyse(read_steps(lines))
        pools = Pools.parse(pools_text) if pools_text is not None else None
        mode = read_mode(job.spec)[0].mode
        return measured_balance(run, mode, pools, name=Path(path).name)
    except (NoStepsError, BalanceError) as exc:
        raise InputError(f"{path}: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    """Run ``plan``; returns the exit code."""
    try:
        nodes = load_nodes(args.nodes) if args.nodes else live_nodes(args.kubeconfig)
        result = plan_files(args.filename, nodes, args.metrics, args.measured_pools, args.from_status)
    except InputError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE
    write_result(result, args.output, sys.stdout)
    return EXIT_FEASIBLE if result.feasible else EXIT_INFEASIBLE
