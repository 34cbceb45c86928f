"""The devcluster's cgroup walks survive cgroups that the kubelet removes while they run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from verl_devtools.devcluster import hostchanges


def _tree(root: Path, procs: bool = True) -> None:
    for cgroup, pids in {"": "1\n", "pod-a": "", "pod-a/ctr-1": "11\n12\n", "pod-b/ctr-2": "21\n"}.items():
        directory = root / cgroup
        directory.mkdir(parents=True, exist_ok=True)
        if procs:
            (directory / "cgroup.procs").write_text(pids)


@pytest.fixture
def vanishing(monkeypatch: pytest.MonkeyPatch):
    """Make ``pod-b`` disappear after its parent listed it and before it is scanned."""
    real = os.scandir

    def scandir(path=".") -> os.ScandirIterator:
        if not isinstance(path, int) and os.fspath(path).endswith("pod-b"):
            shutil.rmtree(path)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)


def test_cgroup_pids_reads_every_level(tmp_path: Path) -> None:
    _tree(tmp_path / "cg")
    assert hostchanges.cgroup_pids([str(tmp_path / "cg"), str(tmp_path / "absent")]) == [1, 11, 12, 21]


def test_cgroup_pids_skips_a_cgroup_removed_during_the_walk(tmp_path: Path, vanishing: None) -> None:
    _tree(tmp_path / "cg")
    assert hostchanges.cgroup_pids([str(tmp_path / "cg")]) == [1, 11, 12]


def test_remove_cgroups_removes_deepest_first_while_cgroups_vanish(tmp_path: Path, vanishing: None) -> None:
    root = tmp_path / "cg"
    _tree(root, procs=False)  # cgroupfs files do not stop an rmdir; plain files would
    assert hostchanges.remove_cgroups([str(root)]) == []
    assert not root.exists()
