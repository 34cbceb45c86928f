"""``verl-operator crd``: print the generated VerlJob CustomResourceDefinition."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(subparsers: Any) -> None:
    """Register the ``crd`` subcommand."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "crd", help="print the VerlJob CRD generated from the API models"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the CRD YAML to stdout."""
    from verl_operator.crdgen import render_crd

    sys.stdout.write(render_crd())
    return 0
