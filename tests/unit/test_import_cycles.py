"""The import-cycle check run by `make lint` (verl_devtools.import_cycles) counts type-only imports."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from verl_devtools import import_cycles

REPO = Path(__file__).resolve().parents[2]
CHECKED = [
    REPO / "operator" / "verl_operator",
    REPO / "launcher" / "verl_launcher",
    REPO / "launcher" / "verl_contract",
    REPO / "tools" / "verl_devtools",
]


def make_package(root: Path, files: dict[str, str]) -> Path:
    """A package `pkg` under root with the given modules (relative paths -> source)."""
    package = root / "pkg"
    for relative, source in {"__init__.py": "", **files}.items():
        path = package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return package


TYPE_ONLY = """
    from __future__ import annotations
    from typing import TYPE_CHECKING
    if TYPE_CHECKING:
        from {target} import Thing
"""


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        pytest.param(
            {"a.py": "from pkg.b import x\n", "b.py": "from pkg import a\nx = 1\n"},
            [["pkg.a", "pkg.b", "pkg.a"]],
            id="plain-two-modules",
        ),
        pytest.param(
            {
                "a.py": "from pkg.b import x\n",
                "b.py": "from .c import y\nx = 1\n",
                "c.py": TYPE_ONLY.format(target="pkg.a"),
            },
            [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]],
            id="closed-by-a-type-only-import",
        ),
        pytest.param(
            {
                "sub/__init__.py": "",
                "sub/a.py": "from ..b import x\n",
                "b.py": "from .sub.a import y\nx = 1\n",
            },
            [["pkg.b", "pkg.sub.a", "pkg.b"]],
            id="relative-imports",
        ),
        pytest.param(
            {
                "a.py": "from pkg.b import x\n",
                "b.py": "def f():\n    from pkg import a\n    return a\nx = 1\n",
            },
            [],
            id="an-import-inside-a-function-is-deferred",
        ),
        pytest.param(
            {"a.py": "from pkg.b import x\nimport json\n", "b.py": "import os\nx = 1\n"},
            [],
            id="no-cycle",
        ),
    ],
)
def test_the_check_finds_each_cycle(tmp_path: Path, files: dict[str, str], expected: list[list[str]]) -> None:
    assert import_cycles.find_cycles([make_package(tmp_path, files)]) == expected


def test_the_command_fails_naming_the_cycle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    package = make_package(tmp_path, {"a.py": TYPE_ONLY.format(target="pkg.b"), "b.py": "import pkg.a\n"})
    assert import_cycles.main([str(package)]) == 1
    assert "pkg.a -> pkg.b -> pkg.a" in capsys.readouterr().err


def test_the_tree_has_no_cycles() -> None:
    assert import_cycles.find_cycles(CHECKED) == []
    assert import_cycles.main([str(path) for path in CHECKED]) == 0
