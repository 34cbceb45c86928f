"""KubeRay's operator for the scale benchmark: version from Go build information, CRDs from the module source."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml

from verl_devtools.devcluster import binaries, kuberay
from verl_devtools.devcluster.tools import KUBERAY, buildinfo_version
from verl_devtools.devcluster.versions import CACHE_ENV, KUBERAY_VERSION

BUILDINFO = """{binary}: go1.26.8
\tpath\tgithub.com/ray-project/kuberay/ray-operator
\tmod\tverl-operator.io/tools\t(devel)\t
\tdep\tgithub.com/go-logr/logr\tv1.4.3\th1:abc=
\tdep\tgithub.com/ray-project/kuberay/ray-operator\t{version}\th1:def=
\tdep\tk8s.io/client-go\tv0.34.1\th1:ghi=
\tbuild\tCGO_ENABLED=0
"""


@pytest.mark.parametrize(
    ("text", "module", "expected"),
    [
        pytest.param(BUILDINFO.format(binary="x", version="v1.5.0"), kuberay.MODULE, "v1.5.0", id="mod-line"),
        pytest.param(
            "x: go1.26\n\tdep\tgithub.com/go-logr/logr\tv1.4.3\th1:a=\n",
            "github.com/go-logr/logr",
            "v1.4.3",
            id="dep-line",
        ),
        pytest.param(BUILDINFO.format(binary="x", version="v1.4.0"), kuberay.MODULE, "v1.4.0", id="other"),
        pytest.param(BUILDINFO, "github.com/absent/module", None, id="not-listed"),
        pytest.param(
            "x: go1.26\n\tmod\tverl-operator.io/tools\t(devel)\t\n",
            "verl-operator.io/tools",
            None,
            id="devel-main-module",
        ),
        pytest.param("", kuberay.MODULE, None, id="empty"),
    ],
)
def test_buildinfo_version(text: str, module: str, expected: str | None) -> None:
    assert buildinfo_version(text, module) == expected


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    return tmp_path


def fake_go(directory: Path, version: str) -> None:
    """A ``go`` on PATH whose ``go version -m BINARY`` prints build information naming ``version``."""
    directory.mkdir(parents=True, exist_ok=True)
    text = BUILDINFO.format(binary="$3", version=version)
    go = directory / "go"
    go.write_text(f"#!/bin/sh\ncat <<END\n{text}END\n")
    go.chmod(go.stat().st_mode | stat.S_IXUSR)


def cached_binary() -> Path:
    directory = binaries.bin_dir(KUBERAY)
    directory.mkdir(parents=True)
    path = directory / "kuberay-operator"
    path.write_text("#!/bin/sh\nexit 1\n")  # the binary itself is never run to learn its version
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.parametrize(
    ("reported", "found"),
    [pytest.param(KUBERAY_VERSION, True, id="pinned"), pytest.param("v1.4.0", False, id="other-version")],
)
def test_an_unmarked_binary_is_trusted_by_its_build_information(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, reported: str, found: bool
) -> None:
    path = cached_binary()
    fake_go(isolated / "gobin", reported)
    monkeypatch.setenv("PATH", f"{isolated / 'gobin'}:/bin:/usr/bin")
    hit = binaries.find("kuberay-operator")
    assert (hit is not None and hit.path == path) is found


def test_the_control_plane_never_builds_kuberay() -> None:
    """``make test`` asks for the control plane, kwok and helm: none of them is in KubeRay's group."""
    from verl_devtools.devcluster.layout import COMPONENTS

    assert all(binaries.GROUP_OF[name] is not KUBERAY for name in (*COMPONENTS, "kubectl", "helm"))


def test_crds_are_copied_from_the_module_source(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = isolated / "module"
    bases = source / "config" / "crd" / "bases"
    bases.mkdir(parents=True)
    for name in kuberay.CRD_FILES:
        (bases / name).write_text(
            yaml.safe_dump({"kind": "CustomResourceDefinition", "metadata": {"name": name}})
        )
    path = cached_binary()
    (path.parent / binaries.MARKER).write_text("{}")
    monkeypatch.setattr(kuberay, "_module_dir", lambda env: source)
    build = kuberay.ensure_kuberay()
    assert build.binary == path
    assert [p.name for p in build.crds] == list(kuberay.CRD_FILES)
    assert all(p.read_text() == (bases / p.name).read_text() for p in build.crds)


def test_a_module_without_the_crds_is_an_error(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (isolated / "module").mkdir()
    path = cached_binary()
    (path.parent / binaries.MARKER).write_text("{}")
    monkeypatch.setattr(kuberay, "_module_dir", lambda env: isolated / "module")
    with pytest.raises(binaries.BinaryError, match=r"no config/crd/bases/ray\.io_rayclusters\.yaml"):
        kuberay.ensure_kuberay()
