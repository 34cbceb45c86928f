"""The build orchestration (generated module, tidy, build, verification, marker) driven through a stand-in
``go`` executable: the real toolchain takes minutes and the network (measured in docs/devcluster.md)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from verl_devtools.devcluster import binaries
from verl_devtools.devcluster.versions import CACHE_ENV, ETCD_VERSION, KUBERNETES_VERSION, KWOK_VERSION

KUBERNETES_GO_MOD = """module k8s.io/kubernetes

go 1.24.0

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
)
"""

# A stand-in for `go`: logs its argv, answers `mod download -json` with a go.mod file, and for `build -o OUT PKG`
# writes an executable that reports the version the ldflags stamp (or the etcd version for ./etcd).
FAKE_GO = r"""#!/bin/sh
echo "$PWD :: $*" >> "$GO_LOG"
if [ "$1" = mod ] && [ "$2" = download ]; then
  printf '{"Path": "%s", "GoMod": "%s"}\n' "$4" "$FAKE_GO_MOD"; exit 0
fi
if [ "$1" = mod ] && [ "$2" = tidy ]; then exit "${FAKE_TIDY_EXIT:-0}"; fi
if [ "$1" = build ]; then
  out=""; pkg=""; flags=""
  while [ $# -gt 0 ]; do
    case "$1" in -o) out="$2"; shift;; -ldflags) flags="$2"; shift;; build|-trimpath) ;; *) pkg="$1";; esac
    shift
  done
  version=$(echo "$flags" | tr ' ' '\n' | grep -E 'gitVersion=|consts.Version=|version.version=' | head -1 | sed 's/.*=//')
  [ "$pkg" = ./etcd ] && version="$FAKE_ETCD_VERSION"
  printf '#!/bin/sh\necho "reports %s"\n' "$version" > "$out"; chmod +x "$out"; exit 0
fi
exit 2
"""


@pytest.fixture
def fake_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    tools = tmp_path / "tools"
    tools.mkdir()
    go = tools / "go"
    go.write_text(FAKE_GO)
    go.chmod(go.stat().st_mode | stat.S_IXUSR)
    go_mod = tmp_path / "kubernetes.mod"
    go_mod.write_text(KUBERNETES_GO_MOD)
    monkeypatch.setenv("PATH", f"{tools}:/bin:/usr/bin")
    monkeypatch.setenv("GO_LOG", str(tmp_path / "go.log"))
    monkeypatch.setenv("FAKE_GO_MOD", str(go_mod))
    monkeypatch.setenv("FAKE_ETCD_VERSION", ETCD_VERSION.removeprefix("v"))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    return tmp_path


def go_calls(root: Path) -> list[str]:
    return [line.split(" :: ", 1)[1] for line in (root / "go.log").read_text().splitlines()]


def test_kubernetes_group_is_built_from_a_generated_module(fake_go: Path) -> None:
    steps: list[str] = []
    paths = binaries.ensure(("kube-apiserver", "etcd"), progress=steps.append)
    directory = binaries.bin_dir(binaries.KUBERNETES)
    assert paths == {"kube-apiserver": directory / "kube-apiserver", "etcd": directory / "etcd"}
    calls = go_calls(fake_go)
    assert calls[0] == f"mod download -json k8s.io/kubernetes@{KUBERNETES_VERSION}"
    assert calls[1] == "mod tidy"
    built = [c.rsplit(" ", 1)[1] for c in calls if c.startswith("build ")]
    assert built == [t.package for t in binaries.KUBERNETES.tools]
    module = (fake_go / "cache" / "gotools" / f"kubernetes-{KUBERNETES_VERSION}" / "go.mod").read_text()
    assert "\tk8s.io/client-go => k8s.io/client-go v0.34.4\n" in module
    assert json.loads((directory / binaries.MARKER).read_text())["etcd"] == ETCD_VERSION
    assert not list(directory.glob(".*.partial"))
    assert steps[-1].startswith(f"kubernetes {KUBERNETES_VERSION} ready in")


def test_a_second_ensure_builds_nothing(fake_go: Path) -> None:
    binaries.ensure(("kwok",), progress=lambda _m: None)
    calls = len(go_calls(fake_go))
    assert binaries.ensure(("kwok",), progress=lambda _m: None) == {
        "kwok": binaries.bin_dir(binaries.KWOK) / "kwok"
    }
    assert len(go_calls(fake_go)) == calls


def test_a_binary_reporting_another_version_is_not_marked(
    fake_go: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_ETCD_VERSION", "3.5.0")
    with pytest.raises(binaries.BinaryError, match=r"etcd does not report version v3\.6\.4"):
        binaries.ensure(("etcd",), progress=lambda _m: None)
    assert not (binaries.bin_dir(binaries.KUBERNETES) / binaries.MARKER).exists()


def test_a_failing_go_step_is_reported_with_its_name(fake_go: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_TIDY_EXIT", "1")
    with pytest.raises(binaries.BinaryError, match=r"go mod tidy failed \(exit 1\)"):
        binaries.ensure(("kwok",), progress=lambda _m: None)
    assert binaries.find("kwok") is None
    assert f"mod download -json sigs.k8s.io/kwok@{KWOK_VERSION}" in go_calls(fake_go)
