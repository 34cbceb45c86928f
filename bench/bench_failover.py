"""Failover benchmark: two operator replicas with leader election; kill the leader N times, print the times.

Run: ``.venv/bin/python bench/bench_failover.py [--rounds 5] [--signal kill|term]
[--lease-duration 15 --renew-deadline 10 --retry-period 2]``.

A devcluster instance ``bench-failover`` (profile ``dgx-h100``) gets two ``verl-operator run --leader-elect``
processes on one Lease. Each round: a VerlJob of one node is created right after the leader is killed
(SIGKILL: a crash, the Lease left to expire; SIGTERM: a graceful stop that hands the Lease back); the round
measures kill -> the other replica holds the Lease (the failover) and kill -> that job Running (what a user
waits). The killed replica is started again as the new standby before the next round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from verl_devtools.devcluster import DevCluster
from verl_devtools.devcluster.jobs import verljob
from verl_devtools.devcluster.localrun import LocalOperator, install_crd

GROUP, VERSION, PLURAL = "verl-operator.io", "v1alpha1", "verljobs"
NAMESPACE, LEASE = "default", "bench-failover"


def holder(coordination: client.CoordinationV1Api) -> str:
    try:
        return str(coordination.read_namespaced_lease(LEASE, NAMESPACE).spec.holder_identity or "")
    except ApiException as exc:
        if exc.status == 404:
            return ""
        raise


def wait(probe: Any, what: str, timeout: float, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(interval)
    raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--signal", choices=("kill", "term"), default="kill")
    parser.add_argument("--lease-duration", type=float, default=15.0)
    parser.add_argument("--renew-deadline", type=float, default=10.0)
    parser.add_argument("--retry-period", type=float, default=2.0)
    parser.add_argument("--json", type=Path, default=None, help="write the times here")
    parser.add_argument("--keep", action="store_true", help="leave the devcluster instance running")
    args = parser.parse_args(argv)
    cluster = DevCluster(name="bench-failover", profile="dgx-h100", progress=print)
    cluster.up()
    workroot = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    flags = (
        "--leader-elect",
        f"--leader-election-namespace={NAMESPACE}",
        f"--leader-election-id={LEASE}",
        f"--leader-election-lease-duration={args.lease_duration}",
        f"--leader-election-renew-deadline={args.renew_deadline}",
        f"--leader-election-retry-period={args.retry_period}",
    )
    started = 0

    def replica() -> LocalOperator:
        nonlocal started
        started += 1
        name = f"op-{started}"
        op = LocalOperator(
            cluster.kubeconfig, workroot / name, webhook_name=None, env={"POD_NAME": name}, extra_args=flags
        )
        return op.start()

    replicas: list[LocalOperator] = []
    rounds: list[dict[str, float]] = []
    try:
        install_crd(cluster.kubeconfig)
        api = cluster.api_client()
        coordination, custom, core = (
            client.CoordinationV1Api(api),
            client.CustomObjectsApi(api),
            client.CoreV1Api(api),
        )
        custom.delete_collection_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL
        )  # an earlier run's
        core.delete_collection_namespaced_pod(
            NAMESPACE, label_selector="verl-operator.io/job", grace_period_seconds=0
        )
        run = uuid.uuid4().hex[:4]
        replicas.append(replica())
        wait(lambda: holder(coordination).startswith("op-1_"), "the first replica leads", 30)
        replicas.append(replica())
        time.sleep(2 * args.retry_period)  # the standby has seen the lease
        for i in range(args.rounds):
            lead = holder(coordination)
            leader = next(op for op in replicas if lead.startswith(f"{op.env['POD_NAME']}_"))
            other = next(op for op in replicas if op is not leader)
            prefix = f"{other.env['POD_NAME']}_"
            name = f"failover-{run}-{i}"
            if args.signal == "kill":
                leader.kill()
            else:
                assert leader.proc is not None
                leader.proc.terminate()
            killed = time.monotonic()
            custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, verljob(name))
            wait(lambda p=prefix: holder(coordination).startswith(p), "the standby takes over", 60)
            failover = time.monotonic() - killed

            def running(n: str = name) -> bool:
                obj: Any = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, n)
                return (obj.get("status") or {}).get("phase") == "Running"

            wait(running, f"{name} Running", 60)
            to_running = time.monotonic() - killed
            rounds.append({"failover_s": failover, "job_running_s": to_running})
            print(
                f"round {i}: failover {failover:.2f} s, job created at the kill Running after {to_running:.2f} s"
            )
            leader.stop()
            replicas.remove(leader)
            custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
            core.delete_collection_namespaced_pod(
                NAMESPACE, label_selector="verl-operator.io/job", grace_period_seconds=0
            )
            replicas.append(replica())
            time.sleep(2 * args.retry_period)
        failovers = [r["failover_s"] for r in rounds]
        waits = [r["job_running_s"] for r in rounds]
        print(
            f"{args.rounds} rounds ({args.signal}, lease {args.lease_duration:g} s / renew {args.renew_deadline:g} s "
            f"/ retry {args.retry_period:g} s): failover median {statistics.median(failovers):.2f} s, "
            f"min {min(failovers):.2f} s, max {max(failovers):.2f} s (target < 15 s); job Running after the kill "
            f"median {statistics.median(waits):.2f} s, max {max(waits):.2f} s"
        )
        if args.json:
            args.json.write_text(
                json.dumps({"args": vars(args) | {"json": str(args.json)}, "rounds": rounds}, indent=2)
            )
    finally:
        for op in replicas:
            op.stop()
        if not args.keep:
            cluster.down()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
