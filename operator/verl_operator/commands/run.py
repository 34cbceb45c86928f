"""``verl-operator run``: start the operator (kopf) with its webhook server, health probe and metrics."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

from verl_contract.progress import PROGRESS_PORT

DEFAULT_LISTEN = "127.0.0.1"
#: The chart sets this to the operator's own image (Ray pods copy the launcher from it).
LAUNCHER_IMAGE_ENV = "VERL_OPERATOR_LAUNCHER_IMAGE"
IN_CLUSTER_LISTEN = "0.0.0.0"  # in a pod the kubelet probes and the API server call the pod IP


def add_parser(subparsers: Any) -> None:
    """Register the ``run`` subcommand."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "run", help="run the operator", description="Run the VerlJob operator against a cluster."
    )
    p.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster, then $KUBECONFIG)")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="watch this namespace (repeatable; globs allowed)",
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace (default)")
    p.add_argument(
        "--listen-address",
        default=None,
        help=f"address of the health, metrics and webhook servers (default {DEFAULT_LISTEN}; "
        f"{IN_CLUSTER_LISTEN} inside a pod)",
    )
    p.add_argument("--health-port", type=int, default=0, help="serve GET /healthz on this port (0: off)")
    p.add_argument(
        "--metrics-port", type=int, default=0, help="serve Prometheus /metrics on this port (0: off)"
    )
    p.add_argument(
        "--webhook-port", type=int, default=0, help="serve the validating webhook on this port (0: off)"
    )
    p.add_argument("--webhook-cert", help="serving certificate (PEM); default: a generated self-signed one")
    p.add_argument("--webhook-key", help="private key of --webhook-cert")
    p.add_argument(
        "--webhook-managed",
        metavar="NAME",
        help="create and keep the ValidatingWebhookConfiguration NAME pointing at this process (local mode)",
    )
    p.add_argument(
        "--webhook-host",
        help="host the API server uses to reach the webhook (managed mode; default: listen address)",
    )
    p.add_argument(
        "--resync-seconds",
        type=float,
        default=300.0,
        help="safety resync: reconcile every job at least this often (changes trigger reconciles at once)",
    )
    p.add_argument(
        "--workers", type=int, default=4, help="jobs reconciled at once (placements stay one at a time)"
    )
    p.add_argument(
        "--policy-file",
        default=None,
        help="admission policy YAML for the pass-through fields (default: the built-in policy; docs/operator.md)",
    )
    p.add_argument(
        "--launcher-image",
        help=f"this operator's image: Ray pods copy verl-launcher from it (default ${LAUNCHER_IMAGE_ENV})",
    )
    election = p.add_argument_group(
        "leader election", "several replicas: only the holder of a coordination.k8s.io Lease reconciles"
    )
    election.add_argument(
        "--leader-elect",
        action="store_true",
        help="reconcile only while holding the Lease; every replica still serves the webhook (default: off)",
    )
    election.add_argument(
        "--leader-election-id", default="verl-operator", metavar="NAME", help="the Lease's name"
    )
    election.add_argument(
        "--leader-election-namespace",
        metavar="NS",
        help="the Lease's namespace (default: the pod's; required outside a pod)",
    )
    election.add_argument(
        "--leader-election-lease-duration",
        type=float,
        default=15.0,
        metavar="S",
        help="seconds a standby waits after the Lease's last change before taking it over (default 15)",
    )
    election.add_argument(
        "--leader-election-renew-deadline",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds the leader keeps reconciling without a successful renew (default 10)",
    )
    election.add_argument(
        "--leader-election-retry-period",
        type=float,
        default=2.0,
        metavar="S",
        help="seconds between two attempts to acquire or renew (default 2)",
    )
    p.add_argument(
        "--progress-port",
        type=int,
        default=PROGRESS_PORT,
        metavar="PORT",
        help=(
            f"port of the head pods' progress endpoint the operator reads (default {PROGRESS_PORT}); 0 reads none "
            "(pods whose IPs no pod holds, as a simulated cluster's)"
        ),
    )
    p.add_argument("--workdir", default=None, help="directory for generated files (default: a temp dir)")
    p.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Configure and run kopf until interrupted."""
    import tempfile

    import kopf

    from verl_operator.controller import config

    in_cluster = "KUBERNETES_SERVICE_HOST" in os.environ and not args.kubeconfig
    listen = args.listen_address or (IN_CLUSTER_LISTEN if in_cluster else DEFAULT_LISTEN)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = str(Path(args.kubeconfig).resolve())
    if bool(args.webhook_cert) != bool(args.webhook_key):
        raise SystemExit("--webhook-cert and --webhook-key go together")
    if args.policy_file:
        from verl_operator.policy import PolicyError, load_policy

        try:
            load_policy(args.policy_file)
        except PolicyError as exc:
            raise SystemExit(f"error: {exc}") from exc
    lease_namespace = None
    if args.leader_elect:
        from verl_operator.controller.leader import ElectionTiming, default_namespace

        timing = ElectionTiming(
            args.leader_election_lease_duration,
            args.leader_election_renew_deadline,
            args.leader_election_retry_period,
        )
        if timing.problems():
            raise SystemExit("error: " + "; ".join(timing.problems()))
        lease_namespace = args.leader_election_namespace or default_namespace()
        if not lease_namespace:
            raise SystemExit(
                "error: --leader-elect outside a pod needs --leader-election-namespace (the Lease's namespace)"
            )
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="verl-operator-"))
    config.CONFIG[0] = config.RunConfig(
        kubeconfig=args.kubeconfig,
        webhook_port=args.webhook_port,
        webhook_listen=listen,
        webhook_host=args.webhook_host or (listen if listen != IN_CLUSTER_LISTEN else None),
        webhook_cert=args.webhook_cert,
        webhook_key=args.webhook_key,
        webhook_managed=args.webhook_managed,
        metrics_port=args.metrics_port,
        metrics_listen=listen,
        resync_seconds=args.resync_seconds,
        workers=max(1, args.workers),
        workdir=workdir,
        launcher_image=args.launcher_image or os.environ.get(LAUNCHER_IMAGE_ENV) or None,
        policy_file=args.policy_file,
        leader_elect=args.leader_elect,
        lease_name=args.leader_election_id,
        lease_namespace=lease_namespace,
        lease_duration=args.leader_election_lease_duration,
        renew_deadline=args.leader_election_renew_deadline,
        retry_period=args.leader_election_retry_period,
        progress_port=args.progress_port,
    )
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr=listen)
    import verl_operator.controller.handlers  # noqa: F401  (registers the handlers)

    kopf.run(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=f"http://{listen}:{args.health_port}/healthz" if args.health_port else None,
    )
    return 0
