"""The product's wheel holds the product only; the development tooling is a wheel of its own.

The operator image installs the product from what the ``Dockerfile`` copies (``pyproject.toml``, ``README.md``,
``operator/``, ``launcher/``): the wheel built here from the same files is what the image holds.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def image_sources() -> list[str]:
    """The paths the Dockerfile's build stage copies into ``/src`` (its ``COPY`` lines without ``--from``)."""
    sources: list[str] = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not words[1].startswith("--from"):
            sources.extend(words[1:-1])
    return sources


def _wheel(source: Path, out: Path) -> dict[str, str]:
    """Build ``source`` into a wheel under ``out``: the files it holds, with the text of its metadata."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return {n: archive.read(n).decode() if ".dist-info/" in n else "" for n in archive.namelist()}


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    else:
        shutil.copy2(src, dst)


@pytest.fixture(scope="module")
def product_wheel(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    work = tmp_path_factory.mktemp("product")
    sources = image_sources()
    assert "operator" in sources and "tools" not in sources
    for name in sources:
        _copy(ROOT / name, work / "src" / name)
    return _wheel(work / "src", work / "out")


@pytest.fixture(scope="module")
def tooling_wheel(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    work = tmp_path_factory.mktemp("tooling")
    # tools/ with the profiles its package data links to (examples/clusters), at the same relative place.
    _copy(ROOT / "tools", work / "tools")
    _copy(ROOT / "examples" / "clusters", work / "examples" / "clusters")
    return _wheel(work / "tools", work / "out")


def test_the_product_wheel_holds_no_tooling(product_wheel: dict[str, str]) -> None:
    tooling = [n for n in product_wheel if "devcluster" in n or n.startswith("verl_devtools/")]
    assert tooling == []
    # What the product needs from the tooling's old home is in the product: the profile reader of
    # `plan --nodes <profile.yaml>` and the launcher zipapp the Dockerfile writes.
    assert {"verl_operator/clusters/profile.py", "verl_operator/launcher_zipapp.py"} <= set(product_wheel)
    assert {"verl_operator/controller/handlers.py", "verl_launcher/cli.py"} <= set(product_wheel)
    # The launch contract both import (and the zipapp the Dockerfile writes carries).
    assert {"verl_contract/launch_spec.py", "verl_contract/gpu_product.py", "verl_contract/py.typed"} <= set(
        product_wheel
    )
    (entry_points,) = [text for n, text in product_wheel.items() if n.endswith(".dist-info/entry_points.txt")]
    assert "verl-operator = verl_operator.cli:main" in entry_points
    assert "kubectl-verl = verl_operator.cli:kubectl_main" in entry_points
    assert "verl-operator-dev" not in entry_points


def test_the_tooling_wheel_holds_the_devcluster_and_its_data(tooling_wheel: dict[str, str]) -> None:
    assert not [n for n in tooling_wheel if n.startswith("verl_operator/")]
    assert "verl_devtools/cli.py" in tooling_wheel
    assert "verl_devtools/devcluster/stages/pod.yaml" in tooling_wheel
    profiles = {Path(n).name for n in tooling_wheel if n.startswith("verl_devtools/devcluster/profiles/")}
    assert profiles == {p.name for p in (ROOT / "examples" / "clusters").glob("*.yaml")}
    (entry_points,) = [text for n, text in tooling_wheel.items() if n.endswith(".dist-info/entry_points.txt")]
    assert "verl-operator-dev = verl_devtools.cli:main" in entry_points
