"""``verl-launcher head|worker|probe``: the container entrypoint of the Ray pods and of the probe DaemonSet."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
import urllib.error
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from verl_contract.launch_spec import ATTEMPT_ENV, LAUNCH_PATH, LAUNCH_SPEC_ENV, unknown_fields
from verl_contract.progress import PROGRESS_PORT
from verl_launcher import labels as node_labels_mod
from verl_launcher.exits import (
    UNEXPECTED_ERROR_EXIT,
    UNEXPECTED_ERROR_REASON,
    ExitCode,
    LauncherError,
    Outcome,
    write_termination_line,
    write_termination_log,
)
from verl_launcher.head import DEFAULT_PROGRESS_FILE, HeadOptions, log, run_head
from verl_launcher.probe import FAKE_GPUS_ENV, collect_probe
from verl_launcher.ray_cluster import RayOptions
from verl_launcher.spec import load_launch_spec
from verl_launcher.worker import WorkerOptions, run_worker

RAY_EXECUTABLE_ENV = "VERL_LAUNCHER_RAY"
PROGRESS_FILE_ENV = "VERL_LAUNCHER_PROGRESS_FILE"


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", help=f"launch spec path (default ${LAUNCH_SPEC_ENV} or {LAUNCH_PATH})")
    parser.add_argument("--ray-executable", help=f"the ray CLI (default ${RAY_EXECUTABLE_ENV} or `ray`)")
    parser.add_argument(
        "--ray-start-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `ray start` (repeatable; write --ray-start-arg=--flag=value)",
    )
    parser.add_argument(
        "--num-gpus-override",
        type=int,
        help=f"GPUs this node gives Ray (default ${FAKE_GPUS_ENV}, else the probe's count, else Ray detects)",
    )
    parser.add_argument("--num-cpus", type=int, help="CPUs this node gives Ray (default: Ray detects)")
    parser.add_argument("--stop-grace-seconds", type=float, default=30.0, help="SIGTERM-to-SIGKILL grace")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``verl-launcher``."""
    parser = argparse.ArgumentParser(prog="verl-launcher", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    head = sub.add_parser("head", help="start the Ray head, wait for the cluster, check the nodes, run verl")
    _add_run_arguments(head)
    head.add_argument(
        "--progress-file", help=f"progress JSON (default ${PROGRESS_FILE_ENV} or {DEFAULT_PROGRESS_FILE})"
    )
    head.add_argument("--poll-seconds", type=float, default=2.0, help="node liveness poll interval")
    head.add_argument(
        "--progress-port",
        type=int,
        default=PROGRESS_PORT,
        help=f"port of the progress endpoint the operator reads (default {PROGRESS_PORT}; 0: any free port)",
    )
    worker = sub.add_parser("worker", help="join the head's Ray cluster and stay until it goes away")
    _add_run_arguments(worker)
    worker.add_argument("--retry-seconds", type=float, default=2.0, help="pause between join attempts")
    worker.add_argument(
        "--head-gone-grace-seconds",
        type=float,
        default=30.0,
        help="leave after the head is unreachable this long",
    )
    probe = sub.add_parser("probe", help="print this node's GPU topology; optionally label the node")
    probe.add_argument("--format", choices=["json", "labels"], default="json")
    probe.add_argument(
        "--label-node", action="store_true", help="PATCH the node's labels (in-cluster credentials)"
    )
    probe.add_argument(
        "--print-patch", action="store_true", help="print the PATCH request instead of sending it"
    )
    probe.add_argument("--node-name", help="the Node to label (default $NODE_NAME)")
    probe.add_argument("--api-server", help="API server URL (default from $KUBERNETES_SERVICE_HOST/PORT)")
    return parser


def _ray_options(args: argparse.Namespace, env: Mapping[str, str]) -> RayOptions:
    gpus: int | None = args.num_gpus_override
    if gpus is None and env.get(FAKE_GPUS_ENV):
        gpus = int(env[FAKE_GPUS_ENV])
    if gpus is None:
        probe = collect_probe(env)
        gpus = len(probe.gpus) if probe.gpus else None
    return RayOptions(
        executable=args.ray_executable or env.get(RAY_EXECUTABLE_ENV, "ray"),
        num_gpus=gpus,
        num_cpus=args.num_cpus,
        node_ip=env.get("POD_IP") or None,
        extra_args=tuple(args.ray_start_arg),
    )


def _attempt(env: Mapping[str, str]) -> int:
    text = env.get(ATTEMPT_ENV, "0") or "0"
    if not text.isdigit():
        raise LauncherError(
            ExitCode.INVALID_LAUNCH_SPEC,
            f"{ATTEMPT_ENV} must be a non-negative integer, got {text!r}",
        )
    return int(text)


def _run(args: argparse.Namespace, env: Mapping[str, str]) -> Outcome:
    spec_path = args.spec or env.get(LAUNCH_SPEC_ENV) or LAUNCH_PATH
    spec = load_launch_spec(spec_path)
    extra = unknown_fields(spec)
    if extra:
        log("ignoring unknown launch spec field(s): " + ", ".join(extra))
    ray = _ray_options(args, env)
    if args.command == "head":
        progress = args.progress_file or env.get(PROGRESS_FILE_ENV) or DEFAULT_PROGRESS_FILE
        options = HeadOptions(
            ray=ray,
            attempt=_attempt(env),
            progress_file=Path(progress),
            poll_s=args.poll_seconds,
            stop_grace_s=args.stop_grace_seconds,
            progress_port=args.progress_port,
        )
        return run_head(spec, options, env)
    worker = WorkerOptions(
        ray=ray,
        retry_s=args.retry_seconds,
        head_gone_grace_s=args.head_gone_grace_seconds,
        stop_grace_s=args.stop_grace_seconds,
    )
    return run_worker(spec, worker, env)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    del frame
    raise SystemExit(128 + signum)


def run_role(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Run ``head`` or ``worker``; write the termination message; return the exit code."""
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        outcome = _run(args, env)
    except LauncherError as exc:
        outcome = Outcome(exc.code, exc.message)
    except Exception as exc:  # a launcher bug: say so in the termination log rather than only in the log
        traceback.print_exc()
        message = f"unexpected launcher error: {type(exc).__name__}: {exc}"
        log(f"exit {UNEXPECTED_ERROR_EXIT} {UNEXPECTED_ERROR_REASON}: {message}")
        write_termination_line(UNEXPECTED_ERROR_REASON, message)
        return UNEXPECTED_ERROR_EXIT
    finally:
        signal.signal(signal.SIGTERM, previous)
    log(f"exit {int(outcome.code)} {outcome.reason}: {outcome.message}")
    write_termination_log(outcome)
    return int(outcome.code)


def run_probe(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Print the probe (and label the node when asked); 0 on success, 1 when the probe or the PATCH failed."""
    probe = collect_probe(env)
    labels = node_labels_mod.node_labels(probe)
    if args.format == "labels":
        sys.stdout.write(node_labels_mod.labels_text(labels))
    else:
        print(json.dumps(probe.to_dict(), indent=2))
    for error in probe.errors:
        print(f"verl-launcher probe: {error}", file=sys.stderr)
    if not (args.label_node or args.print_patch):
        return 1 if probe.errors else 0
    if probe.errors:
        print("verl-launcher probe: not labelling the node: the probe failed", file=sys.stderr)
        return 1
    try:
        server = args.api_server or node_labels_mod.in_cluster_api_server(env)
        patch = node_labels_mod.build_patch(server, args.node_name or env.get("NODE_NAME", ""), labels)
    except (RuntimeError, ValueError) as exc:
        print(f"verl-launcher probe: {exc}", file=sys.stderr)
        return 1
    if args.print_patch:
        print(json.dumps(patch.to_dict(), indent=2))
        return 0
    token, ca_file = node_labels_mod.service_account_credentials()
    try:
        status = node_labels_mod.send_patch(patch, token, ca_file)
    except urllib.error.HTTPError as exc:
        print(
            f"verl-launcher probe: the API server refused the label patch: {exc.code} {exc.reason}",
            file=sys.stderr,
        )
        return 1
    except urllib.error.URLError as exc:
        print(f"verl-launcher probe: cannot reach the API server {server}: {exc.reason}", file=sys.stderr)
        return 1
    print(
        f"verl-launcher probe: labelled node {args.node_name or env.get('NODE_NAME')} (HTTP {status})",
        file=sys.stderr,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``verl-launcher`` and ``python -m verl_launcher``."""
    args = build_parser().parse_args(argv)
    env = dict(os.environ)
    if args.command == "probe":
        return run_probe(args, env)
    return run_role(args, env)


if __name__ == "__main__":
    sys.exit(main())
