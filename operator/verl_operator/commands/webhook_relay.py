"""``verl-operator webhook-relay``: the relay in front of the webhook replicas (``verl_operator.webhook_relay``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> None:
    """Register the ``webhook-relay`` subcommand."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "webhook-relay",
        help="serve the validating webhook's TLS and forward each review to a replica that answers",
        description=(
            "Terminate the API server's TLS with the webhook's certificate and forward each AdmissionReview "
            "to the first backend that answers: the own replica first, then the others (a connection error, "
            "EOF, an HTTP 5xx or no answer within --backend-timeout sends it to the next)."
        ),
    )
    p.add_argument("--listen-address", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, required=True, help="HTTPS port the API server calls")
    p.add_argument("--cert", required=True, help="serving certificate (PEM): the webhook's")
    p.add_argument("--key", required=True, help="private key of --cert")
    p.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="URL",
        help="a webhook server's base URL (https://127.0.0.1:9443), tried first, in the given order (repeatable)",
    )
    p.add_argument(
        "--peers",
        metavar="HOST:PORT",
        help="a name whose addresses are the other replicas' webhook servers (a headless Service), tried after --backend",
    )
    p.add_argument(
        "--exclude-address",
        action="append",
        default=[],
        metavar="ADDR",
        help="an address of --peers to leave out (the own pod's IP; repeatable)",
    )
    p.add_argument(
        "--backend-ca",
        action="append",
        default=[],
        metavar="FILE",
        help="PEM file the backends' certificates must chain to (repeatable; missing files are skipped; "
        "default: --cert itself)",
    )
    p.add_argument(
        "--backend-timeout",
        type=float,
        default=3.0,
        metavar="S",
        help="seconds without an answer before the next backend gets the review too (default 3)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=9.0,
        metavar="S",
        help="seconds after which a review no backend answered fails (default 9; less than the webhook's "
        "timeoutSeconds)",
    )
    p.add_argument(
        "--drain-seconds",
        type=float,
        default=5.0,
        metavar="S",
        help="after SIGTERM, seconds the relay goes on serving before it stops listening (default 5)",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Serve the relay until interrupted."""
    from verl_operator.webhook_relay import RelaySettings, serve

    settings = RelaySettings(
        backends=tuple(u.rstrip("/") for u in args.backend),
        peers=args.peers,
        exclude=frozenset(args.exclude_address),
        backend_timeout=args.backend_timeout,
        deadline=args.deadline,
    )
    if problems := settings.problems():
        raise SystemExit("error: " + "; ".join(problems))
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    trusted = [Path(p) for p in args.backend_ca] or [Path(args.cert)]

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve(
            settings,
            address=args.listen_address,
            port=args.port,
            cert=Path(args.cert),
            key=Path(args.key),
            trusted=trusted,
            stop=stop,
            drain_seconds=max(0.0, args.drain_seconds),
        )

    asyncio.run(main())
    return 0
