#!/usr/bin/env python3
"""Generate the chart's README.md from ``values.yaml`` and its ``# --`` comments.

Usage::

    python charts/verl-operator/scripts/gen_readme.py          # rewrite README.md
    python charts/verl-operator/scripts/gen_readme.py --check  # exit 1 when README.md is stale

Comment convention (the one KubeRay and helm-docs use): a ``# -- text`` comment, optionally continued by
plain ``# text`` lines, documents the key on the next line. A documented key is one row of the table, its whole
value being the default. An undocumented map is a section: each of its keys must then be documented (directly
or as a section itself). Every key of the file is covered, or generation fails naming the key.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHART_DIR = Path(__file__).resolve().parent.parent
REGENERATE = "python charts/verl-operator/scripts/gen_readme.py"

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?:\s|$)")
_DOC = re.compile(r"^(?P<indent> *)# -- ?(?P<text>.*)$")
_CONT = re.compile(r"^(?P<indent> *)#(?: (?P<text>.*))?$")


class ValuesDocError(ValueError):
    """values.yaml breaks the comment convention (the message names the key and the fix)."""


@dataclass(frozen=True)
class ValueDoc:
    """One documented key: its dotted path, its description and its default value."""

    path: str
    description: str
    default: Any


def parse_comments(text: str) -> dict[str, str]:
    """Map each dotted key path of a values file to its ``# --`` description ("" when undocumented).

    Args:
        text: The values.yaml text.

    Returns:
        Every mapping key of the file, in file order, with its description.
    """
    docs: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing maps
    pending: list[str] | None = None
    pending_indent = -1
    for line in text.splitlines():
        doc = _DOC.match(line)
        if doc:
            pending = [doc.group("text").strip()]
            pending_indent = len(doc.group("indent"))
            continue
        cont = _CONT.match(line)
        if cont:
            if pending is not None and len(cont.group("indent")) == pending_indent:
                pending.append((cont.group("text") or "").strip())
            continue
        if not line.strip():
            continue
        key = _KEY.match(line)
        if not key:
            # A list item or a continuation of a scalar: part of the value of an enclosing key.
            continue
        indent = len(key.group("indent"))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [key.group("key")])
        docs[path] = " ".join(part for part in (pending or []) if part)
        pending = None
        stack.append((indent, key.group("key")))
    return docs


def _lookup(values: dict[str, Any], path: str) -> tuple[bool, Any]:
    node: Any = values
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def collect(text: str) -> list[ValueDoc]:
    """The documented keys of a values file, checked against the convention.

    Args:
        text: The values.yaml text.

    Returns:
        One entry per documented key, in file order.

    Raises:
        ValuesDocError: A key is not covered by a ``# --`` comment, or a documented map also documents its keys.
    """
    values = yaml.safe_load(text) or {}
    comments = parse_comments(text)
    documented = [p for p, d in comments.items() if d]
    errors: list[str] = []
    for path, desc in comments.items():
        found, value = _lookup(values, path)
        if not found:
            continue  # a key inside a default value (for example under resources.requests)
        covered_above = any(path.startswith(d + ".") for d in documented)
        if covered_above:
            if desc:
                errors.append(f"{path}: documented, but a parent map is documented as one value; drop one")
            continue
        is_section = isinstance(value, dict) and bool(value)
        if not desc and not is_section:
            errors.append(f"{path}: no '# --' comment above it; add one (a description of the key)")
    if errors:
        raise ValuesDocError("values.yaml breaks the '# --' convention:\n  " + "\n  ".join(errors))
    return [ValueDoc(p, comments[p], _lookup(values, p)[1]) for p in documented]


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    return "object"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(values_text: str, chart: dict[str, Any]) -> str:
    """Build the README text.

    Args:
        values_text: The values.yaml text.
        chart: The parsed Chart.yaml.

    Returns:
        The README.md content.
    """
    rows = [
        f"| `{d.path}` | {_type_name(d.default)} | `{_cell(json.dumps(d.default, separators=(',', ':')))}` "
        f"| {_cell(d.description)} |"
        for d in collect(values_text)
    ]
    name = chart["name"]
    return "\n".join(
        [
            f"# {name}",
            "",
            f"<!-- Generated from values.yaml by scripts/gen_readme.py; edit those, then run: {REGENERATE} -->",
            "",
            f"{chart['description']}",
            "",
            f"Chart version `{chart['version']}`, operator version `{chart['appVersion']}`, "
            f"Kubernetes `{chart.get('kubeVersion', 'any')}`.",
            "",
            "## Install",
            "",
            "```bash",
            f"helm install {name} charts/{name} --namespace {name} --create-namespace",
            "```",
            "",
            "The defaults install without edits: the operator watches every namespace, the admission webhook uses",
            "a CA and certificate generated by the chart (kept across upgrades), and RBAC grants only the verbs the",
            "operator uses. Helm installs the VerlJob CRD from `crds/` on the first install only; upgrade it with",
            "`helm show crds <chart> | kubectl apply --server-side --force-conflicts -f -`. See `docs/helm.md`",
            "for modes (watch namespaces, cert-manager, an operator outside the cluster) and `docs/gitops.md`",
            "for Argo CD and Flux.",
            "",
            "## Values",
            "",
            "| Key | Type | Default | Description |",
            "|-----|------|---------|-------------|",
            *rows,
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    """Write README.md, or with ``--check`` compare it and print a diff when it is stale."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when README.md is not up to date")
    parser.add_argument(
        "--chart-dir", type=Path, default=CHART_DIR, help="the chart (default: this script's)"
    )
    args = parser.parse_args(argv)
    chart_dir: Path = args.chart_dir
    chart = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    try:
        text = render((chart_dir / "values.yaml").read_text(), chart)
    except ValuesDocError as exc:
        print(exc, file=sys.stderr)
        return 2
    readme = chart_dir / "README.md"
    if args.check:
        current = readme.read_text() if readme.exists() else ""
        if current != text:
            sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True)))
            print(f"\n{readme} is stale; regenerate it with: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    readme.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
