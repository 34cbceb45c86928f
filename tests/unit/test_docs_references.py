"""Every repository path, make target and CLI command that README.md and docs/*.md name exists, and every
figure they state that the tree can count is the count.

Run by `make lint` (and with the unit tier). Paths are read from backtick spans and link targets: those that
start at the repository's root (`operator/...`, `docs/x.md`), and those written relative to a package or a
test tier (`planner/rules.py`, `devcluster/ports.py`, `corpus/extract.py`), resolved against every package
and tier that has the first folder (a path whose first folder is none of ours, such as verl's
`workers/fsdp_workers.py`, is not this repository's). `make X` against the Makefile's targets;
`verl-operator X`, `kubectl verl X` and `verl-operator-dev X Y` against the argparse parsers. Figures: each "N tests" is
one of :data:`FIGURES` (counted by collecting the tests it names) or stands in a dated measurement.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
from collections import Counter
from functools import cache
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
#: Where a path written relative to a package or a test tier is (`planner/rules.py`, `devcluster/ports.py`,
#: `corpus/extract.py` in docs/fidelity.md): a mention whose first folder is one of theirs must exist in one.
PACKAGE_ROOTS = (
    ROOT / "operator" / "verl_operator",
    ROOT / "launcher" / "verl_launcher",
    ROOT / "launcher" / "verl_contract",
    ROOT / "tools" / "verl_devtools",
    *sorted(p for p in (ROOT / "tests").iterdir() if p.is_dir()),
)
#: A mention that is a relative path (folders and a name; not a URL, label key or option).
_RELATIVE_PATH = re.compile(r"^[A-Za-z_][\w.-]*/(?:[\w.*-]+/)*[\w.*-]*$")

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
    if not word or any(c in word for c in "<>{}$ ") or "..." in word or "://" in word:
        return None
    for package, home in PACKAGES.items():
        if word.startswith(package):
            return home + word
    if word.startswith(TOP) or word in FILES or (word.endswith(".md") and "/" not in word):
        return word
    return None


def _package_path(word: str) -> list[Path] | None:
    """Where a package- or tier-relative mention may be (None: its first folder is none of ours)."""
    word = word.strip().split("#", 1)[0].split("::", 1)[0].rstrip(".,:;")
    word = re.sub(r":[0-9]+(-[0-9]+)?$", "", word)
    if not _RELATIVE_PATH.match(word) or "..." in word:
        return None
    first = word.split("/", 1)[0]
    roots = [root for root in PACKAGE_ROOTS if (root / first).is_dir()]
    return [root / word for root in roots] or None


def _exists(path: Path) -> bool:
    if "*" in path.name:
        return any(path.parent.glob(path.name))
    return path.exists() or path.is_symlink()


def _missing_paths(doc: Path) -> list[str]:
    missing = []
    for word in _texts(doc)[0]:
        path = _repo_path(word)
        if path is not None:
            candidates = [ROOT / path, doc.parent / path]
            if path.endswith(".md") and "/" not in path:
                candidates.append(ROOT / "docs" / path)
        else:
            found = _package_path(word)
            if found is None:
                continue
            candidates = found
        if not any(_exists(c) for c in candidates):
            missing.append(word)
    return missing


def checked_mentions(doc: Path) -> int:
    """How many path mentions of ``doc`` the check resolves."""
    return sum(1 for w in _texts(doc)[0] if _repo_path(w) is not None or _package_path(w) is not None)


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
        "See `operator/verl_operator/devcluster/cluster.py` and [x](verl-constraints.md), `planner/rules_gone.py`,\n"
        "`devcluster/ports.py`, `corpus/extract.py`, verl's `workers/fsdp_workers.py` and `trainer/config`.\n"
        "```bash\nmake nothing-here\nverl-operator devcluster up\nverl-operator-dev devcluster sideways\n"
        "kubectl verl describe j\n```\n"
    )
    assert _missing_paths(doc) == [
        "operator/verl_operator/devcluster/cluster.py",
        "planner/rules_gone.py",
        "verl-constraints.md",
    ]
    assert _missing_commands(doc) == [
        "make nothing-here",
        "verl-operator devcluster",
        "kubectl verl describe",
        "verl-operator-dev devcluster sideways",
    ]


#: The figures the docs state that the tree can count: (doc, the sentence with the figure as group 1, what is
#: counted: ("tests", paths collected) or ("rows", a CSV file's data rows)).
FIGURES: tuple[tuple[str, str, tuple[str, tuple[str, ...]]], ...] = (
    (
        "devcluster.md",
        r"`tests/cluster/test_foundation\.py` \((\d+) tests",
        ("tests", ("tests/cluster/test_foundation.py",)),
    ),
    ("devcluster.md", r"`make test-node` \((\d+) tests", ("tests", ("tests/node",))),
    (
        "fidelity.md",
        r"\(`test_fidelity_corpus\.py`, (\d+) tests\)",
        ("tests", ("tests/fidelity/test_fidelity_corpus.py",)),
    ),
    (
        "fidelity.md",
        r"`tests/fidelity/data/memory-evidence\.csv` \((\d+) rows",
        ("rows", ("tests/fidelity/data/memory-evidence.csv",)),
    ),
    (
        "launcher.md",
        r"`tests/unit/test_launcher_\*\.py` \(pure, (\d+) tests",
        ("tests", ("tests/unit/test_launcher_*.py",)),
    ),
    ("launcher.md", r"`tests/ray/` \(marker `ray`, (\d+) tests", ("tests", ("tests/ray",))),
    ("operator.md", r"The file adds [^(]*\((\d+) tests: ", ("tests", ("tests/cluster/test_kueue.py",))),
)
_TEST_FIGURE = re.compile(r"\b\d+ tests\b")
#: A line with a date records a measurement of that day (the figures of that run), not the tree.
_DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b")


@cache
def collected_tests() -> Counter[str]:
    """The number of tests per file of every tier, as pytest collects them (no command runs: no_commands)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "tests" / "unit" / "plugins"), os.environ.get("PYTHONPATH", "")]
        ),
        "VERL_OPERATOR_NO_COMMANDS_LOG": os.devnull,
    }
    paths = sorted(
        {p for _, _, (kind, names) in FIGURES if kind == "tests" for n in names for p in _expand(n)}
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no_commands", *paths],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return Counter(line.split("::", 1)[0] for line in proc.stdout.splitlines() if "::" in line)


def _expand(name: str) -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(name))


def count_of(kind: str, names: tuple[str, ...]) -> int:
    if kind == "rows":
        (name,) = names
        with (ROOT / name).open(newline="") as f:
            return sum(1 for _ in csv.DictReader(f))
    tests = collected_tests()
    paths = [p for n in names for p in _expand(n)]
    return sum(
        n
        for file, n in tests.items()
        if any(file == p or file.startswith(p.rstrip("/") + "/") for p in paths)
    )


def stated_figures(doc: Path) -> list[tuple[str, int]]:
    """The figures of :data:`FIGURES` in ``doc``: (sentence pattern, stated number); each must be found once."""
    text = doc.read_text()
    out = []
    for name, pattern, _ in FIGURES:
        if name == doc.name:
            found = re.findall(pattern, text)
            assert len(found) == 1, (
                f"{doc.name}: {pattern!r} found {len(found)} times (reword FIGURES with the doc)"
            )
            out.append((pattern, int(found[0])))
    return out


def unchecked_figures(doc: Path) -> list[str]:
    """Every "N tests" of ``doc`` that is neither one of :data:`FIGURES` nor in a dated line."""
    text = doc.read_text()
    covered = [
        m.span(1) for name, pattern, _ in FIGURES if name == doc.name for m in re.finditer(pattern, text)
    ]
    out = []
    for match in _TEST_FIGURE.finditer(text):
        line = text[text.rfind("\n", 0, match.start()) + 1 : text.find("\n", match.end())]
        if _DATED.search(line) or any(start == match.start() for start, _ in covered):
            continue
        out.append(f"{doc.name}: {line.strip()[:120]}")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_stated_figure_is_checked_and_true(doc: Path) -> None:
    assert unchecked_figures(doc) == []
    kinds = {pattern: what for _, pattern, what in FIGURES}
    wrong = [
        f"{pattern}: the doc says {stated}, the tree has {count_of(*kinds[pattern])}"
        for pattern, stated in stated_figures(doc)
        if stated != count_of(*kinds[pattern])
    ]
    assert wrong == []


def test_the_check_sees_a_wrong_or_unchecked_figure(tmp_path: Path) -> None:
    doc = tmp_path / "launcher.md"
    doc.write_text(
        "- `tests/unit/test_launcher_*.py` (pure, 3 tests, about 10 s)\n"
        "- `tests/ray/` (marker `ray`, 8 tests)\n"
        "Also 12 tests of something.\nOn 2026-01-02: 7 tests in 9 s.\n"
    )
    assert unchecked_figures(doc) == ["launcher.md: Also 12 tests of something."]
    stated = dict(stated_figures(doc))
    kinds = {pattern: what for _, pattern, what in FIGURES}
    (launcher_pattern,) = [p for p in stated if "launcher" in p]
    assert stated[launcher_pattern] == 3 != count_of(*kinds[launcher_pattern])
