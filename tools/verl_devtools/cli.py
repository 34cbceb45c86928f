"""The ``verl-operator-dev`` command line: the development cluster (``devcluster``) and the ``demo``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from verl_operator.cli import command_parser, run_command

# Each module defines ``add_parser(subparsers) -> None`` and sets ``func`` (args -> exit code) on its parser.
COMMAND_MODULES: tuple[str, ...] = (
    "verl_devtools.commands.devcluster",
    "verl_devtools.commands.demo",
)


def build_parser() -> argparse.ArgumentParser:
    return command_parser(
        "verl-operator-dev",
        "Development tooling of verl-operator: a local cluster with GPU nodes, images, the demo.",
        COMMAND_MODULES,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
