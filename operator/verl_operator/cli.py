"""The ``verl-operator`` command line: one subcommand per module under ``verl_operator.commands``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Each module defines ``add_parser(subparsers) -> None`` and sets ``func`` (args -> exit code) on its parser.
COMMAND_MODULES: tuple[str, ...] = (
    "verl_operator.commands.plan",
    "verl_operator.commands.advise",
    "verl_operator.commands.crd",
    "verl_operator.commands.render",
    "verl_operator.commands.import_script",
    "verl_operator.commands.run",
    "verl_operator.commands.webhook_relay",
)


#: The kubectl plugin's subcommands (``kubectl verl plan|import|status|logs|top``).
KUBECTL_MODULES: tuple[str, ...] = ("verl_operator.commands.kubectl",)


def command_parser(prog: str, description: str, modules: Sequence[str]) -> argparse.ArgumentParser:
    """A parser with one required subcommand per module of ``modules`` (each adds its own parser)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in modules:
        importlib.import_module(name).add_parser(sub)
    return parser


def run_command(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse ``argv`` and run the chosen subcommand; its exit code."""
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


def build_parser() -> argparse.ArgumentParser:
    return command_parser(
        "verl-operator", "Topology-aware Kubernetes operator for verl jobs.", COMMAND_MODULES
    )


#: Subcommands whose process loads their own module only, not the other commands' (the planner, the API
#: models): the webhook relay runs as a process of its own next to each replica and stays small.
ALONE: dict[str, str] = {"webhook-relay": "verl_operator.commands.webhook_relay"}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ALONE:
        return run_command(command_parser("verl-operator", "The webhook relay.", (ALONE[args[0]],)), args)
    return run_command(build_parser(), args)


def build_kubectl_parser() -> argparse.ArgumentParser:
    return command_parser(
        "kubectl verl",
        "verl jobs in the current kubeconfig context: plan, import a launch script, status, logs, top.",
        KUBECTL_MODULES,
    )


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """``kubectl-verl``: the kubectl plugin (kubectl finds it on PATH as ``kubectl verl``)."""
    from verl_operator.commands.kubectl import call

    return call(build_kubectl_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
