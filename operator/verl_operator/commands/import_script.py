"""``verl-operator import SCRIPT``: a VerlJob from a verl launch script, read and never run.

Exit codes: 0 written (warnings on stderr name what the script leaves open), 2 the script cannot be read or
imported.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from verl_operator.api.spec import SUPPORTED_VERL_VERSIONS
from verl_operator.commands.plan import EXIT_USAGE
from verl_operator.scripts.importer import ScriptImportError, import_script

_SET = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*|[0-9]+)=(.*)$", re.DOTALL)


def add_import_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``import`` (shared by ``kubectl verl import``)."""
    parser.add_argument("script", metavar="SCRIPT", help="The launch script (bash), or - for standard input.")
    parser.add_argument("--image", help="spec.verl.image: an image with verl and its rollout engine.")
    parser.add_argument(
        "--verl-version",
        choices=SUPPORTED_VERL_VERSIONS,
        default="0.9",
        help="spec.verl.version: the verl release line the script's overrides are written for.",
    )
    parser.add_argument("--name", help="metadata.name (default: from the script's file name).")
    parser.add_argument(
        "--set",
        dest="values",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="A variable the script reads from its environment or arguments (HOME=/data, 1=vllm); repeatable.",
    )
    parser.add_argument(
        "--command",
        type=int,
        default=1,
        metavar="N",
        help="Which python -m command of the script to import when it has several (1-based).",
    )
    parser.add_argument("--output-file", help="Write the YAML here instead of standard output.")


def add_parser(subparsers: Any) -> None:
    """Register the ``import`` subcommand."""
    parser = subparsers.add_parser(
        "import",
        help="Write a VerlJob from a verl launch script (python3 -m verl.trainer.main_ppo ...), without running it.",
        description=(
            "Read SCRIPT as bash would expand it (variables and their defaults, arrays, quotes, line "
            "continuations, if branches; python3 -m, python -m, ray job submit ... --) and print the VerlJob: "
            "the entry module, model, data, algorithm, GPUs from trainer.nnodes x trainer.n_gpus_per_node, the "
            "exported variables as env and every other key as spec.overrides. What the script leaves open "
            "(its environment, its arguments, command output) stays a ${NAME} placeholder, named in a comment "
            "and a warning. Nothing in the script is run. Exit 0 written, 2 not importable."
        ),
    )
    add_import_arguments(parser)
    parser.add_argument("-n", "--namespace", help="metadata.namespace (default: none, kubectl's namespace).")
    parser.set_defaults(func=run)


def import_to_text(args: argparse.Namespace, namespace: str | None) -> str:
    """The imported YAML; warnings go to stderr.

    Raises:
        ScriptImportError: unreadable script, bad ``--set``, or a script that cannot be imported.
    """
    environment: dict[str, str] = {}
    for item in args.values:
        match = _SET.match(item)
        if not match:
            raise ScriptImportError(
                f"--set {item!r}: write NAME=VALUE (a variable name or an argument number)"
            )
        environment[match.group(1)] = match.group(2)
    try:
        text = sys.stdin.read() if args.script == "-" else Path(args.script).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScriptImportError(f"cannot read {args.script}: {exc}") from exc
    imported = import_script(
        text,
        "stdin" if args.script == "-" else args.script,
        environment=environment,
        command=args.command,
        image=args.image,
        verl_version=args.verl_version,
        name=args.name,
        namespace=namespace,
    )
    for warning in imported.warnings:
        sys.stderr.write(f"warning: {warning}\n")
    return imported.text


def run(args: argparse.Namespace) -> int:
    """Run ``import``; returns the exit code."""
    try:
        text = import_to_text(args, args.namespace)
    except ScriptImportError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE
    if args.output_file:
        Path(args.output_file).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0
