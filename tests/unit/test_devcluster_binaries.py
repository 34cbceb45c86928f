"""Finding the pinned binaries: version checks, lookup order, the completion marker."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from verl_devtools.devcluster import binaries
from verl_devtools.devcluster.versions import CACHE_ENV, KUBERNETES_VERSION, cache_dir


@pytest.mark.parametrize(
    ("output", "version", "matches"),
    [
        pytest.param("Kubernetes v1.34.4", "v1.34.4", True, id="apiserver"),
        pytest.param("Client Version: v1.34.4\nKustomize Version: v5.7.1", "v1.34.4", True, id="kubectl"),
        pytest.param("etcd Version: 3.6.4\nGit SHA: GitNotFound", "v3.6.4", True, id="etcd-no-v"),
        pytest.param("kwok version v0.7.0 go1.26.8 (linux/amd64)", "v0.7.0", True, id="kwok"),
        pytest.param("v3.19.5+g1234abc", "v3.19.5", True, id="helm-short"),
        pytest.param("Client Version: v1.32.2", "v1.34.4", False, id="older-kubectl"),
        pytest.param("Kubernetes v1.34.40", "v1.34.4", False, id="longer-patch"),
        pytest.param("Kubernetes v11.34.4", "v1.34.4", False, id="longer-major"),
        pytest.param("Kubernetes v0.0.0-master+$Format:%H$", "v1.34.4", False, id="unstamped"),
    ],
)
def test_version_matches(output: str, version: str, matches: bool) -> None:
    assert binaries.version_matches(output, version) is matches


def fake_binary(directory: Path, name: str, prints: str) -> Path:
    """A real executable (shell script) that prints ``prints`` for any arguments."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\necho '{prints}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache, no KUBEBUILDER_ASSETS, and a PATH with nothing but /bin (for sh)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    monkeypatch.setenv("PATH", "/bin:/usr/bin")
    return tmp_path


def test_cache_dir_follows_the_environment(isolated: Path) -> None:
    assert cache_dir() == isolated / "cache"


def test_kubebuilder_assets_with_the_pinned_version_win(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_binary(
        isolated / "cache" / "bin" / KUBERNETES_VERSION, "kube-apiserver", f"Kubernetes {KUBERNETES_VERSION}"
    )
    assets = fake_binary(isolated / "assets", "kube-apiserver", f"Kubernetes {KUBERNETES_VERSION}")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets.parent))
    found = binaries.find("kube-apiserver")
    assert found is not None
    assert (found.path, found.source) == (assets, "KUBEBUILDER_ASSETS")


def test_kubebuilder_assets_of_another_version_are_skipped(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assets = fake_binary(isolated / "assets", "kube-apiserver", "Kubernetes v1.30.0")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets.parent))
    assert binaries.find("kube-apiserver") is None


def test_path_kubectl_of_another_version_is_ignored(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = fake_binary(isolated / "sdk", "kubectl", "Client Version: v1.32.2")
    monkeypatch.setenv("PATH", f"{old.parent}:/bin:/usr/bin")
    assert binaries.find("kubectl") is None


def test_path_binary_of_the_pinned_version_is_used(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = fake_binary(isolated / "tools", "kubectl", f"Client Version: {KUBERNETES_VERSION}")
    monkeypatch.setenv("PATH", f"{good.parent}:/bin:/usr/bin")
    found = binaries.find("kubectl")
    assert found is not None
    assert (found.path, found.source) == (good, "PATH")


def test_unmarked_cache_is_trusted_only_per_verified_binary(isolated: Path) -> None:
    directory = binaries.bin_dir(binaries.KUBERNETES)
    fake_binary(directory, "kube-scheduler", f"Kubernetes {KUBERNETES_VERSION}")
    fake_binary(directory, "kube-apiserver", "")  # an interrupted build left something unusable
    assert binaries.find("kube-scheduler") is not None
    assert binaries.find("kube-apiserver") is None


def test_marked_cache_is_trusted_without_running(isolated: Path) -> None:
    directory = binaries.bin_dir(binaries.KUBERNETES)
    fake_binary(directory, "kube-apiserver", "")
    (directory / binaries.MARKER).write_text(json.dumps({}))
    found = binaries.find("kube-apiserver")
    assert found is not None
    assert found.source == "cache"


def test_a_fully_verified_cache_directory_gets_the_marker(isolated: Path) -> None:
    group = binaries.KWOK
    fake_binary(binaries.bin_dir(group), "kwok", f"kwok version {group.version}")
    assert binaries.ensure(("kwok",)) == {"kwok": binaries.bin_dir(group) / "kwok"}
    assert json.loads((binaries.bin_dir(group) / binaries.MARKER).read_text()) == {"kwok": group.version}


def test_building_without_go_says_what_to_do(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(isolated / "empty"))
    with pytest.raises(binaries.BinaryError, match=r"Go toolchain.*KUBEBUILDER_ASSETS"):
        binaries.ensure(("kwok",), progress=lambda _m: None)


def test_unknown_binary() -> None:
    with pytest.raises(KeyError):
        binaries.find("dockerd")


def test_every_binary_has_a_group_and_a_version() -> None:
    assert set(binaries.GROUP_OF) == {
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubectl",
        "etcd",
        "kubelet",
        "kube-proxy",
        "coredns",
        "kwok",
        "helm",
        "kuberay-operator",
        "kueue",
    }


def test_a_marked_directory_missing_a_binary_is_rebuilt_not_trusted(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The marker alone does not make a deleted binary appear: ensure goes on to build it (no Go here)."""
    directory = binaries.bin_dir(binaries.KWOK)
    directory.mkdir(parents=True)
    (directory / binaries.MARKER).write_text("{}")
    monkeypatch.setenv("PATH", str(isolated / "empty"))
    assert binaries.find("kwok") is None
    with pytest.raises(binaries.BinaryError, match="Go toolchain"):
        binaries.ensure(("kwok",), progress=lambda _m: None)
