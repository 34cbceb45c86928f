"""``verl-launcher worker``: join the head's Ray cluster (retrying while DNS and the head come up) and stay
until the cluster goes away."""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass

from verl_contract.launch_spec import LaunchSpec
from verl_launcher.exits import ExitCode, LauncherError, Outcome
from verl_launcher.head import log
from verl_launcher.processes import Child
from verl_launcher.ray_cluster import RayOptions, worker_start_argv
from verl_launcher.verl import build_env

#: What ``ray start`` prints once the node runs (scripts.py, both for the head and for workers).
STARTED_MARKER = "Ray runtime started."
#: ``ray start --block`` either fails within about a minute (node registration times out after 30-60 s) or
#: blocks for good once joined: still running after this long counts as joined even without the marker.
ASSUME_JOINED_AFTER_S = 120.0


@dataclass(frozen=True)
class WorkerOptions:
    """Knobs of the worker run.

    Attributes:
        ray: How ``ray start`` runs.
        retry_s: Seconds between join attempts.
        head_gone_grace_s: The head's port must stay unreachable this long before the worker leaves.
        stop_grace_s: Seconds Ray gets between SIGTERM and SIGKILL.
    """

    ray: RayOptions
    retry_s: float = 2.0
    head_gone_grace_s: float = 30.0
    stop_grace_s: float = 30.0


def head_reachable(host: str, port: int, timeout_s: float = 3.0) -> str | None:
    """None when a TCP connection to the head's GCS port succeeds, else why not (DNS or connect error)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"cannot resolve {host}: {exc.strerror}"
    last = "no address"
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(timeout_s)
            try:
                sock.connect(address)
                return None
            except OSError as exc:
                last = f"cannot connect to {host}:{port}: {exc.strerror or exc}"
    return last


def _join(spec: LaunchSpec, options: WorkerOptions, env: Mapping[str, str], deadline: float) -> Child:
    """Start ``ray start --address`` until it reports the node started; raise HEAD_UNREACHABLE at the deadline."""
    target = f"{spec.head.host}:{spec.head.port}"
    last_error = "no attempt made"
    attempts = 0
    while True:
        if time.monotonic() >= deadline:
            raise LauncherError(
                ExitCode.HEAD_UNREACHABLE,
                f"could not join the Ray head at {target} within {spec.timeouts.worker_join_seconds:g}s "
                f"(timeouts.workerJoinSeconds) after {attempts} attempt(s): {last_error}",
            )
        problem = head_reachable(spec.head.host, spec.head.port)
        if problem is not None:
            last_error = problem
            time.sleep(options.retry_s)
            continue
        attempts += 1
        argv = worker_start_argv(spec, options.ray)
        log(f"joining the Ray head (attempt {attempts}): " + " ".join(argv))
        started: list[bool] = []

        def on_line(line: str, started: list[bool] = started) -> None:
            if STARTED_MARKER in line:
                started.append(True)

        try:
            child = Child(
                argv, build_env(spec, env, with_ray_address=False), prefix="[ray-worker] ", on_line=on_line
            )
        except OSError as exc:
            raise LauncherError(
                ExitCode.HEAD_UNREACHABLE, f"cannot start `{argv[0]}` to join the head: {exc.strerror or exc}"
            ) from exc
        launched = time.monotonic()
        while not started and child.poll() is None and time.monotonic() < deadline:
            if time.monotonic() - launched >= ASSUME_JOINED_AFTER_S:
                log(
                    f"ray start has run for {ASSUME_JOINED_AFTER_S:g}s without failing; taking the node as joined"
                )
                return child
            time.sleep(0.2)
        if started:
            return child
        if child.poll() is None:  # the deadline passed while ray start was still trying
            child.stop(options.stop_grace_s)
            last_error = "ray start did not finish joining: " + " | ".join(child.last_lines[-2:])
            continue
        child.wait()
        tail = next((line for line in reversed(child.last_lines) if line.strip()), "no output")
        last_error = f"ray start exited with code {child.poll()}: {tail}"
        time.sleep(options.retry_s)


def run_worker(spec: LaunchSpec, options: WorkerOptions, env: Mapping[str, str]) -> Outcome:
    """Join the cluster, then stay until the head goes away.

    Returns:
        ``SUCCEEDED`` when the head's cluster went away after this node joined; ``WORKER_LOST`` when this
        node's Ray processes exited while the head was still reachable.

    Raises:
        LauncherError: ``HEAD_UNREACHABLE`` when the node could not join before ``timeouts.workerJoinSeconds``.
    """
    deadline = time.monotonic() + spec.timeouts.worker_join_seconds
    child = _join(spec, options, env, deadline)
    log(f"joined the Ray cluster at {spec.head.host}:{spec.head.port}")
    unreachable_since: float | None = None
    try:
        while True:
            code = child.poll()
            problem = head_reachable(spec.head.host, spec.head.port, timeout_s=2.0)
            if code is not None:
                if problem is None:
                    return Outcome(
                        ExitCode.WORKER_LOST,
                        f"this node's Ray processes exited (code {code}) while the head was still reachable",
                    )
                return Outcome(ExitCode.SUCCEEDED, "the head's Ray cluster went away; this worker is done")
            if problem is None:
                unreachable_since = None
            else:
                unreachable_since = unreachable_since or time.monotonic()
                if time.monotonic() - unreachable_since >= options.head_gone_grace_s:
                    log(f"the head is gone ({problem}); stopping Ray on this node")
                    return Outcome(
                        ExitCode.SUCCEEDED, "the head's Ray cluster went away; this worker is done"
                    )
            time.sleep(1.0)
    finally:
        child.stop(options.stop_grace_s)
