"""Every repository path, make target and CLI command that README.md and docs/*.md name exists.

Run by `make lint` (and with the unit tier). Paths are read from backtick spans and link targets that look
like repository paths; `make X` against the Makefile's targets; `verl-operator X`, `kubectl verl X` and
`verl-operator-dev X Y` against the argparse parsers.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from verl_devtools import cli as dev_cli
from verl_operator import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = (
    "operator/",
    "launcher/",
    "tools/",
    "tests/",
    "bench/",
    "docs/",
    "examples/",
    "charts/",
    "crds/",
    ".ci/",
)
FILES = ("Dockerfile", "Makefile", "pyproject.toml", "README.md")
#: Package-relative spellings, as docs write them, and where they are in the tree.
PACKAGES = {"verl_operator/": "operator/", "verl_launcher/": "launcher/", "verl_devtools/": "tools/"}

_SPAN = re.compile(r"`([^`\n]+)`")
#: A span preceded by "verl's " names a path in verl's repository, not in this one.
_VERL_SPAN = re.compile(r"verl's `[^`\n]+`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
#: Where a command starts: a line's start, a prompt, a path to the binary, ``$(``, ``&&``, ``|``, ``sudo``
#: (``helm install verl-operator charts/...`` names a release, not a command).
_COMMAND_START = r"(?m)(?:^\s*|\$ |/|\(|&& |\| |sudo )"
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _texts(doc: Path) -> tuple[list[str], str]:
    text = doc.read_text()
    blocks = "\n".join(_FENCE.findall(text))
    prose = _VERL_SPAN.sub("", _FENCE.sub("", text))
    return _SPAN.findall(prose) + _LINK.findall(prose), blocks + "\n" + "\n".join(_SPAN.findall(text))


def _repo_path(word: str) -> str | None:
    word = word.strip().split("#", 1)[0].split("::", 1)[0].rstrip(".,:;")
    word = re.sub(r":[0-9]+(-[0-9]+)?$", "", word)
    if not word or any(c in word for c in "<>*{}$ ") or "..." in word or "://" in word:
        return None
    for package, home in PACKAGES.items():
        if word.startswith(package):
            return home + word
    if word.startswith(TOP) or word in FILES or (word.endswith(".md") and "/" not in word):
        return word
    return None


def _missing_paths(doc: Path) -> list[str]:
    words, _ = _texts(doc)
    missing = []
    for word in words:
        path = _repo_path(word)
        if path is None:
            continue
        candidates = [ROOT / path, doc.parent / path]
        if path.endswith(".md") and "/" not in path:
            candidates.append(ROOT / "docs" / path)
        if not any(c.exists() or c.is_symlink() for c in candidates):
            missing.append(word)
    return missing


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w.-]*):", text, re.M))


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _missing_commands(doc: Path) -> list[str]:
    _, code = _texts(doc)
    missing = [f"make {t}" for t in re.findall(r"\bmake ([a-z][\w-]*)", code) if t not in _make_targets()]
    product = _subcommands(cli.build_parser())
    tooling = _subcommands(dev_cli.build_parser())
    for name in re.findall(_COMMAND_START + r"verl-operator ([a-z][\w-]*)", code):
        if name not in product:
            missing.append(f"verl-operator {name}")
    plugin = _subcommands(cli.build_kubectl_parser())
    for name in re.findall(_COMMAND_START + r"(?:kubectl verl|kubectl-verl) ([a-z][\w-]*)", code):
        if name not in plugin:
            missing.append(f"kubectl verl {name}")
    for name, sub in re.findall(_COMMAND_START + r"verl-operator-dev ([a-z][\w-]*)(?: ([a-z][\w-]*))?", code):
        if name not in tooling:
            missing.append(f"verl-operator-dev {name}")
        elif sub and _subcommands(tooling[name]) and sub not in _subcommands(tooling[name]):
            missing.append(f"verl-operator-dev {name} {sub}")
    return missing


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_named_path_exists(doc: Path) -> None:
    assert _missing_paths(doc) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_named_make_target_and_command_exists(doc: Path) -> None:
    assert _missing_commands(doc) == []


def test_the_check_sees_a_stale_reference(tmp_path: Path) -> None:
    doc = tmp_path / "stale.md"
    doc.write_text(
        "See `operator/verl_operator/devcluster/cluster.py` and [x](verl-constraints.md).\n"
        "```bash\nmake nothing-here\nverl-operator devcluster up\nverl-operator-dev devcluster sideways\n"
        "kubectl verl describe j\n```\n"
    )
    assert _missing_paths(doc) == ["operator/verl_operator/devcluster/cluster.py", "verl-constraints.md"]
    assert _missing_commands(doc) == [
        "make nothing-here",
        "verl-operator devcluster",
        "kubectl verl describe",
        "verl-operator-dev devcluster sideways",
    ]
