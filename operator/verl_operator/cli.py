"""The ``verl-operator`` command line: one subcommand per module under ``verl_operator.commands``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Each module defines ``add_parser(subparsers) -> None`` and sets ``func`` (args -> exit code) on its parser.
COMMAND_MODULES: tuple[str, ...] = (
    "verl_operator.commands.plan",
    "verl_operator.commands.crd",
    "verl_operator.commands.render",
    "verl_operator.commands.run",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="verl-operator",
        description="Topology-aware Kubernetes operator for verl jobs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
