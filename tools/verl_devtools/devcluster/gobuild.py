"""Build a group of binaries from a generated Go module (``go mod tidy`` + ``go build``, argv lists only).

``k8s.io/kubernetes`` is built through a tools module that repeats its staging ``replace`` lines with the
published ``v0.X.Y`` versions (see :mod:`verl_devtools.devcluster.gomod`); kwok and helm through a module
that requires them. Binaries are written under a temporary name and renamed; the group's marker is written
only after every binary reported its version.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from verl_devtools.devcluster import gomod
from verl_devtools.devcluster.locking import file_lock
from verl_devtools.devcluster.tools import (
    COREDNS,
    KUBERNETES,
    KUBERNETES_NODE,
    MARKER,
    BinaryError,
    Progress,
    ToolGroup,
    bin_dir,
    verified,
    write_marker,
)
from verl_devtools.devcluster.versions import ETCD_VERSION, KUBERNETES_VERSION


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise BinaryError(
            "the Go toolchain (go >= 1.24) is needed to build the control-plane binaries and is not on PATH; "
            "install Go, or put matching binaries in $KUBEBUILDER_ASSETS"
        )
    return go


def _run_go(argv: list[str], cwd: Path, env: dict[str, str], what: str) -> None:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        raise BinaryError(f"{what} failed (exit {done.returncode}) in {cwd}:\n{tail}")


def module_download(go: str, module: str, version: str, env: dict[str, str], key: str) -> Path:
    """Download ``module@version`` through the module proxy; the path ``go mod download -json`` reports
    under ``key`` (``Dir``: the source in the module cache, ``GoMod``: its go.mod file)."""
    with tempfile.TemporaryDirectory(prefix="verl-operator-gomod-") as scratch:
        done = subprocess.run(
            [go, "mod", "download", "-json", f"{module}@{version}"],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise BinaryError(f"go mod download {module}@{version} failed: {done.stdout}{done.stderr}".strip())
    info = json.loads(done.stdout)
    if key not in info:
        raise BinaryError(f"go mod download {module}@{version}: {info.get('Error', f'no {key} reported')}")
    return Path(info[key])


def _module_go_mod(go: str, module: str, version: str, env: dict[str, str]) -> str:
    """The go.mod text of ``module@version`` (downloaded through the module proxy)."""
    return module_download(go, module, version, env, "GoMod").read_text()


def _write_module(group: ToolGroup, workdir: Path, go: str, env: dict[str, str]) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    if group in (KUBERNETES, KUBERNETES_NODE):
        k8s_mod = _module_go_mod(go, "k8s.io/kubernetes", KUBERNETES_VERSION, env)
        text = gomod.kubernetes_tools_go_mod(
            k8s_mod, KUBERNETES_VERSION, ETCD_VERSION, go_directive=gomod.go_directive(k8s_mod)
        )
        if group is KUBERNETES_NODE:
            (workdir / "tools.go").write_text(gomod.KUBERNETES_NODE_TOOLS_GO)
        else:
            (workdir / "tools.go").write_text(gomod.KUBERNETES_TOOLS_GO)
            (workdir / "etcd").mkdir(exist_ok=True)
            (workdir / "etcd" / "main.go").write_text(gomod.ETCD_MAIN_GO)
    elif group is COREDNS:
        module = "github.com/coredns/coredns"
        tool_mod = _module_go_mod(go, module, group.version, env)
        text = gomod.single_tool_go_mod(module, group.version, go_directive=gomod.go_directive(tool_mod))
        (workdir / "coredns").mkdir(exist_ok=True)
        (workdir / "coredns" / "main.go").write_text(gomod.coredns_main_go())
    else:
        tool = group.tools[0]
        module = tool.package.rsplit("/cmd/", 1)[0]
        tool_mod = _module_go_mod(go, module, group.version, env)
        text = gomod.single_tool_go_mod(module, group.version, go_directive=gomod.go_directive(tool_mod))
        (workdir / "tools.go").write_text(gomod.single_tool_go(tool.package))
    (workdir / "go.mod").write_text(text)


def build_group(group: ToolGroup, root: Path, progress: Progress) -> Path:
    """Build every binary of a group into its cache directory and write the completion marker.

    Args:
        group: :data:`KUBERNETES`, :data:`KUBERNETES_NODE`, :data:`KWOK` or :data:`HELM`.
        root: The cache root.
        progress: Called with one line per step.

    Returns:
        The bin directory.

    Raises:
        BinaryError: Go is missing or a step failed (the message carries the tail of Go's output).
    """
    go = _go()
    target = bin_dir(group, root)
    workdir = root / "gotools" / f"{group.name}-{group.version}"
    with file_lock(root / "gotools" / f"{group.name}.lock"):
        if (target / MARKER).is_file():
            if all((target / t.name).is_file() for t in group.tools):
                return target  # another process finished the build while this one waited
            (target / MARKER).unlink()  # a binary was removed since: the directory is no longer complete
        # Static binaries (no C toolchain needed); -mod=mod lets `go mod tidy` update the generated module.
        goflags = f"{os.environ.get('GOFLAGS', '')} -mod=mod".strip()
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": goflags}
        started = time.monotonic()
        progress(f"building {group.name} {group.version} (cold: minutes) in {workdir}")
        _write_module(group, workdir, go, env)
        progress("go mod tidy (downloads modules through the Go module proxy)")
        _run_go([go, "mod", "tidy"], workdir, env, "go mod tidy")
        target.mkdir(parents=True, exist_ok=True)
        for tool in group.tools:
            begun = time.monotonic()
            progress(f"go build {tool.package} -> {target / tool.name}")
            partial = target / f".{tool.name}.partial"
            _run_go(
                [
                    go,
                    "build",
                    "-trimpath",
                    "-ldflags",
                    " ".join(("-s", "-w", *group.ldflags)),
                    "-o",
                    str(partial),
                    tool.package,
                ],
                workdir,
                env,
                f"go build {tool.package}",
            )
            partial.replace(target / tool.name)
            progress(f"built {tool.name} in {time.monotonic() - begun:.0f}s")
        for tool in group.tools:
            if verified(target / tool.name, tool, "cache") is None:
                raise BinaryError(f"{target / tool.name} does not report version {tool.version}")
        write_marker(group, target)
        progress(f"{group.name} {group.version} ready in {time.monotonic() - started:.0f}s")
    return target
