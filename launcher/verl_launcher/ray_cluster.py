"""Ray on a node: the ``ray start`` command lines, and the head's view of the cluster (nodes, GPUs, probes)."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from verl_contract.launch_spec import LaunchSpec
from verl_launcher.exits import ExitCode, LauncherError
from verl_launcher.probe import NodeProbe, collect_probe

#: How long one probe task may take on a node (nvidia-smi plus a Ray worker start).
PROBE_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class RayOptions:
    """How ``ray start`` is run on this node.

    Attributes:
        executable: The ``ray`` executable (``--ray-executable`` / ``$VERL_LAUNCHER_RAY``).
        num_gpus: GPUs this node offers to Ray (``--num-gpus``); None lets Ray detect them.
        num_cpus: CPUs this node offers (``--num-cpus``); None lets Ray detect them.
        node_ip: ``--node-ip-address`` (the pod IP) when known.
        extra_args: Appended as given (``--ray-start-arg``), e.g. ports of test clusters.
    """

    executable: str = "ray"
    num_gpus: int | None = None
    num_cpus: int | None = None
    node_ip: str | None = None
    extra_args: tuple[str, ...] = ()

    def _resources(self) -> list[str]:
        args = []
        if self.num_gpus is not None:
            args.append(f"--num-gpus={self.num_gpus}")
        if self.num_cpus is not None:
            args.append(f"--num-cpus={self.num_cpus}")
        if self.node_ip:
            args.append(f"--node-ip-address={self.node_ip}")
        return args


def head_start_argv(spec: LaunchSpec, options: RayOptions) -> list[str]:
    """``ray start --head`` for the head pod (blocks; the launcher runs it as a child)."""
    return [
        options.executable,
        "start",
        "--head",
        f"--port={spec.head.port}",
        "--dashboard-host=0.0.0.0",
        f"--dashboard-port={spec.head.dashboard_port}",
        "--disable-usage-stats",
        "--block",
        *options._resources(),
        *options.extra_args,
    ]


def worker_start_argv(spec: LaunchSpec, options: RayOptions) -> list[str]:
    """``ray start --address`` for a worker pod (blocks while the node is part of the cluster)."""
    return [
        options.executable,
        "start",
        f"--address={spec.head.host}:{spec.head.port}",
        "--disable-usage-stats",
        "--block",
        *options._resources(),
        *options.extra_args,
    ]


@dataclass(frozen=True)
class RayNode:
    """One node as the Ray GCS reports it."""

    node_id: str
    ip: str
    hostname: str
    gpus: float
    alive: bool
    is_head: bool = False

    def describe(self) -> str:
        """``hostname (ip, N GPUs)`` for messages."""
        return f"{self.hostname} ({self.ip}, {self.gpus:g} GPUs{', head' if self.is_head else ''})"


def nodes_from_ray(raw: Sequence[dict[str, Any]]) -> list[RayNode]:
    """Convert ``ray.nodes()`` entries."""
    nodes = []
    for entry in raw:
        resources = entry.get("Resources") or {}
        nodes.append(
            RayNode(
                node_id=str(entry.get("NodeID", "")),
                ip=str(entry.get("NodeManagerAddress", "")),
                hostname=str(entry.get("NodeManagerHostname", "")),
                gpus=float(resources.get("GPU", 0.0)),
                alive=bool(entry.get("Alive", False)),
                is_head="node:__internal_head__" in resources,
            )
        )
    return sorted(nodes, key=lambda n: (not n.is_head, n.hostname, n.ip, n.node_id))


def readiness_problem(nodes: Sequence[RayNode], spec: LaunchSpec) -> str | None:
    """Why the cluster is not (yet) what the plan needs; None when exactly right.

    Exactly ``nnodes`` alive nodes, each with ``gpusPerNode`` GPUs (so ``nnodes * gpusPerNode`` in total).
    """
    alive = [n for n in nodes if n.alive]
    total = sum(n.gpus for n in alive)
    wrong = [n for n in alive if n.gpus != spec.gpus_per_node]
    if len(alive) == spec.nnodes and total == spec.total_gpus and not wrong:
        return None
    registered = ", ".join(n.describe() for n in alive) or "none"
    parts = [
        f"{len(alive)} of {spec.nnodes} nodes and {total:g} of {spec.total_gpus} GPUs registered "
        f"(plan: {spec.nnodes} nodes x {spec.gpus_per_node} GPUs)",
        f"registered: {registered}",
    ]
    if len(alive) < spec.nnodes:
        parts.append(
            f"missing: {spec.nnodes - len(alive)} node(s); check that the worker pods run and reach "
            f"{spec.head.host}:{spec.head.port}"
        )
    elif len(alive) > spec.nnodes:
        parts.append(f"{len(alive) - spec.nnodes} node(s) more than planned")
    if wrong:
        parts.append(
            "wrong GPU count on "
            + ", ".join(n.describe() for n in wrong)
            + f" (each needs {spec.gpus_per_node})"
        )
    return "; ".join(parts)


def wait_for_cluster(
    query: Callable[[], list[RayNode]],
    spec: LaunchSpec,
    deadline_s: float,
    poll_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[RayNode]:
    """Poll until the cluster holds exactly the planned nodes and GPUs.

    Args:
        query: Returns the current nodes (``ray.nodes()`` through :func:`nodes_from_ray`).
        spec: The launch spec.
        deadline_s: Seconds left to wait (what remains of ``timeouts.clusterReadySeconds``).
        poll_s: Seconds between polls.
        clock: Monotonic clock (injectable for tests).
        sleep: Sleep function (injectable for tests).

    Returns:
        The alive nodes once ready.

    Raises:
        LauncherError: ``CLUSTER_NOT_READY`` at the deadline, naming what registered and what is missing.
    """
    end = clock() + deadline_s
    while True:
        nodes = query()
        problem = readiness_problem(nodes, spec)
        if problem is None:
            return [n for n in nodes if n.alive]
        if clock() >= end:
            raise LauncherError(
                ExitCode.CLUSTER_NOT_READY,
                f"the Ray cluster was not ready {spec.timeouts.cluster_ready_seconds:g}s after the head started "
                f"(timeouts.clusterReadySeconds): {problem}",
            )
        sleep(min(poll_s, max(0.0, end - clock())))


def lost_nodes(initial: Sequence[RayNode], current: Sequence[RayNode]) -> list[RayNode]:
    """The nodes of ``initial`` that are no longer alive in ``current``."""
    alive = {n.node_id for n in current if n.alive}
    return [n for n in initial if n.node_id not in alive]


class RayCluster:
    """The head's driver connection to its own Ray cluster (``ray`` is imported only here)."""

    def __init__(self, address: str) -> None:
        import ray

        self._ray = ray
        # ray.init installs its own SIGTERM handler (exit 15 after a stack dump); keep the launcher's, which
        # stops verl and Ray in order.
        previous = signal.getsignal(signal.SIGTERM)
        try:
            ray.init(
                address=address, namespace="verl-launcher", log_to_driver=False, logging_level=logging.WARNING
            )
        finally:
            signal.signal(signal.SIGTERM, previous)

    def nodes(self) -> list[RayNode]:
        """The current node table."""
        return nodes_from_ray(self._ray.nodes())  # type: ignore[no-untyped-call]

    def probes(self, nodes: Sequence[RayNode], timeout_s: float = PROBE_TIMEOUT_S) -> list[NodeProbe]:
        """Run :func:`collect_probe` once on each node (a zero-CPU task pinned to the node).

        All tasks share one deadline (``timeout_s``). A node whose task fails or does not finish gets a probe
        carrying the error, so the check names it.
        """
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = self._ray.remote(num_cpus=0, max_retries=0)(_probe_on_node)
        refs = [
            task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n.node_id, soft=False)
            ).remote()
            for n in nodes
        ]
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        done = set(ready)
        probes: list[NodeProbe] = []
        for node, ref in zip(nodes, refs, strict=True):
            if ref not in done:
                probe = NodeProbe(
                    node=node.hostname, ip=node.ip, errors=(f"probe task did not finish in {timeout_s:g}s",)
                )
            else:
                try:
                    probe = self._ray.get(ref)
                except Exception as exc:
                    probe = NodeProbe(node=node.hostname, ip=node.ip, errors=(f"probe task failed: {exc}",))
            if not probe.ip:
                probe = NodeProbe(probe.node, node.ip, probe.gpus, probe.topology, probe.source, probe.errors)
            probes.append(probe)
        return probes

    def close(self) -> None:
        """Disconnect the driver."""
        self._ray.shutdown()


def _probe_on_node() -> NodeProbe:
    return collect_probe()
