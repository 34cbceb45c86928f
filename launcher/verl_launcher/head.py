"""``verl-launcher head``: start the Ray head, wait for the planned cluster, check every node, run verl."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from verl_contract.launch_spec import LaunchSpec
from verl_contract.progress import PROGRESS_PORT
from verl_launcher.check import check_nodes
from verl_launcher.exits import ExitCode, LauncherError, Outcome
from verl_launcher.processes import Child
from verl_launcher.progress import ProgressTracker
from verl_launcher.progress_server import ProgressServer
from verl_launcher.ray_cluster import (
    RayCluster,
    RayNode,
    RayOptions,
    head_start_argv,
    lost_nodes,
    wait_for_cluster,
)
from verl_launcher.verl import build_argv, build_env, failure_line

#: Default progress file (``--progress-file`` / ``$VERL_LAUNCHER_PROGRESS_FILE``).
DEFAULT_PROGRESS_FILE = "/tmp/verl-progress.json"


@dataclass(frozen=True)
class HeadOptions:
    """Knobs of the head run.

    Attributes:
        ray: How ``ray start`` runs.
        attempt: ``VERL_OPERATOR_ATTEMPT``.
        progress_file: Where the progress JSON goes.
        poll_s: Seconds between node-liveness checks while verl runs (and readiness polls).
        stop_grace_s: Seconds verl and Ray get between SIGTERM and SIGKILL.
        progress_port: The port of the progress endpoint the operator reads (None: no endpoint).
    """

    ray: RayOptions
    attempt: int = 0
    progress_file: Path = Path(DEFAULT_PROGRESS_FILE)
    poll_s: float = 2.0
    stop_grace_s: float = 30.0
    progress_port: int | None = PROGRESS_PORT


def log(message: str) -> None:
    """Print a launcher status line (always flushed, so it interleaves correctly with children)."""
    print(f"verl-launcher: {message}", flush=True)


def _connect(address: str, head: Child, deadline: float) -> RayCluster:
    last = ""
    while True:
        if head.poll() is not None:
            tail = " | ".join(head.last_lines[-3:])
            raise LauncherError(
                ExitCode.CLUSTER_NOT_READY, f"`ray start --head` exited with code {head.poll()}: {tail}"
            )
        try:
            return RayCluster(address)
        except Exception as exc:  # ray raises ConnectionError and others while the GCS comes up
            last = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            with contextlib.suppress(Exception):
                import ray

                ray.shutdown()
        if time.monotonic() >= deadline:
            raise LauncherError(
                ExitCode.CLUSTER_NOT_READY, f"could not connect to the local Ray head at {address}: {last}"
            )
        time.sleep(1.0)


def _watch_verl(
    verl: Child, head: Child, cluster: RayCluster, nodes: list[RayNode], options: HeadOptions
) -> int:
    """Wait for verl; stop it and raise WORKER_LOST when a node of the cluster vanishes."""
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return verl.wait(timeout=options.poll_s)
        if head.poll() is not None:
            verl.stop(options.stop_grace_s)
            raise LauncherError(
                ExitCode.WORKER_LOST,
                f"the head's Ray processes exited (code {head.poll()}) while verl was running",
            )
        try:
            current = cluster.nodes()
        except Exception as exc:
            log(f"cannot read the Ray node table: {exc}")
            continue
        lost = lost_nodes(nodes, current)
        if lost:
            log("Ray node(s) vanished: " + ", ".join(n.describe() for n in lost) + "; stopping verl")
            verl.stop(options.stop_grace_s)
            raise LauncherError(
                ExitCode.WORKER_LOST,
                f"{len(lost)} of {len(nodes)} Ray node(s) vanished while verl was running: "
                + ", ".join(f"{n.describe()} id {n.node_id[:12]}" for n in lost),
            )


def run_head(spec: LaunchSpec, options: HeadOptions, env: Mapping[str, str]) -> Outcome:
    """Run the head's whole life: Ray head, cluster wait, probe check, verl, teardown.

    Args:
        spec: The launch spec.
        options: Head options.
        env: The launcher's environment (the pod's).

    Returns:
        ``SUCCEEDED`` or ``VERL_FAILED`` with a message.

    Raises:
        LauncherError: ``CLUSTER_NOT_READY``, ``TOPOLOGY_MISMATCH`` or ``WORKER_LOST``.
    """
    started = time.monotonic()
    deadline = started + spec.timeouts.cluster_ready_seconds
    local_address = f"127.0.0.1:{spec.head.port}"
    tracker = ProgressTracker(path=options.progress_file)
    server = None
    if options.progress_port is not None:
        try:
            server = ProgressServer(tracker.progress, port=options.progress_port).start()
            log(f"progress endpoint on port {server.port}")
        except OSError as exc:
            log(f"no progress endpoint: port {options.progress_port}: {exc.strerror or exc}")
    head = _start_head(spec, options, env)
    cluster: RayCluster | None = None
    try:
        cluster = _connect(local_address, head, deadline)
        nodes = _wait_for_nodes(cluster, head, spec, options, deadline)
        log(
            f"cluster ready after {time.monotonic() - started:.1f}s: "
            + ", ".join(n.describe() for n in nodes)
        )
        _check_probes(cluster, nodes, spec)
        tracker.enter("RayFormed")
        return _run_verl(spec, options, env, local_address, head, cluster, nodes, tracker)
    finally:
        tracker.enter("Finished")
        if server is not None:
            server.stop()
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close()
        log("stopping the Ray head")
        head.stop(options.stop_grace_s)


def _start_head(spec: LaunchSpec, options: HeadOptions, env: Mapping[str, str]) -> Child:
    """Start ``ray start --head`` (blocking, so the child lives as long as the head).

    Raises:
        LauncherError: ``CLUSTER_NOT_READY`` when the command cannot be started.
    """
    argv = head_start_argv(spec, options.ray)
    log("starting the Ray head: " + " ".join(argv))
    try:
        return Child(argv, build_env(spec, env, with_ray_address=False), prefix="[ray-head] ")
    except OSError as exc:
        raise LauncherError(
            ExitCode.CLUSTER_NOT_READY, f"cannot start `{argv[0]}`: {exc.strerror or exc}"
        ) from exc


def _wait_for_nodes(
    cluster: RayCluster, head: Child, spec: LaunchSpec, options: HeadOptions, deadline: float
) -> list[RayNode]:
    """Wait until every planned node joined the cluster (until ``deadline``, a monotonic time).

    Raises:
        LauncherError: ``CLUSTER_NOT_READY`` when the head exits or the nodes do not join in time.
    """

    def current_nodes() -> list[RayNode]:
        if head.poll() is not None:
            tail = " | ".join(head.last_lines[-3:])
            raise LauncherError(
                ExitCode.CLUSTER_NOT_READY,
                f"`ray start --head` exited with code {head.poll()} before the cluster was ready: {tail}",
            )
        return cluster.nodes()

    return wait_for_cluster(
        current_nodes,
        spec,
        deadline_s=max(0.0, deadline - time.monotonic()),
        poll_s=options.poll_s,
    )


def _check_probes(cluster: RayCluster, nodes: list[RayNode], spec: LaunchSpec) -> None:
    """Probe every node, log each probe and check them against the spec.

    Raises:
        LauncherError: ``TOPOLOGY_MISMATCH`` with every problem found.
    """
    probes = cluster.probes(nodes)
    for probe in probes:
        log("probe " + json.dumps(probe.to_dict(), separators=(",", ":")))
    problems = check_nodes(probes, spec)
    if problems:
        raise LauncherError(ExitCode.TOPOLOGY_MISMATCH, "; ".join(problems))


def _run_verl(
    spec: LaunchSpec,
    options: HeadOptions,
    env: Mapping[str, str],
    address: str,
    head: Child,
    cluster: RayCluster,
    nodes: list[RayNode],
    tracker: ProgressTracker,
) -> Outcome:
    """Run verl against the cluster, following its progress; verl is stopped on every way out.

    Raises:
        LauncherError: ``VERL_FAILED`` when verl cannot be started, ``WORKER_LOST`` when a node vanishes.
    """
    verl_argv = build_argv(spec, options.attempt)
    verl_env = build_env(spec, env, ray_address=address)

    def on_line(line: str) -> str | None:
        summary = tracker.feed(line)
        return None if summary is None else "VERL_PROGRESS " + json.dumps(summary, separators=(",", ":"))

    log("running verl: " + json.dumps(verl_argv))
    try:
        verl = Child(verl_argv, verl_env, on_line=on_line)
    except OSError as exc:
        raise LauncherError(
            ExitCode.VERL_FAILED,
            f"cannot start verl `{verl_argv[0]}` (entrypoint): {exc.strerror or exc}",
        ) from exc
    tracker.enter("VerlStarted")
    try:
        code = _watch_verl(verl, head, cluster, nodes, options)
        where = f"step {tracker.step}" + (f" of {tracker.total_steps}" if tracker.total_steps else "")
        if code == 0:
            return Outcome(ExitCode.SUCCEEDED, f"verl finished at {where}")
        return Outcome(
            ExitCode.VERL_FAILED, f"verl exited with code {code} at {where}: {failure_line(verl.last_lines)}"
        )
    finally:
        if verl.poll() is None:
            verl.stop(options.stop_grace_s)
