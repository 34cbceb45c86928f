"""The images of the real-node tier: the operator image (the project, as the ``Dockerfile`` builds it) and
the pod sandbox (pause) image, built locally and cached (see :mod:`verl_devtools.devcluster.imagebuild`)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from importlib import metadata
from pathlib import Path

from verl_devtools.devcluster import imagebuild, oci
from verl_devtools.devcluster.locking import file_lock
from verl_devtools.devcluster.tools import BinaryError
from verl_devtools.devcluster.versions import cache_dir
from verl_operator.launcher_zipapp import launcher_zipapp

#: The operator image's name (the chart's default ``image.repository``); its tag is the chart's appVersion.
IMAGE_REPOSITORY = "ghcr.io/verl-operator/verl-operator"
#: The pod sandbox image containerd is configured with (built here, never pulled).
PAUSE_IMAGE = "localhost/verl-operator/pause:1"

#: A pause program: sleeps until SIGTERM or SIGINT (a pod sandbox's only process), reaps nothing else.
PAUSE_GO = """package main

import (
\t"os"
\t"os/signal"
\t"syscall"
)

func main() {
\tstop := make(chan os.Signal, 1)
\tsignal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
\t<-stop
}
"""


def project_version() -> str:
    """The installed project's version (the image tag and the chart's appVersion)."""
    return metadata.version("verl-operator")


def operator_image() -> str:
    """``ghcr.io/verl-operator/verl-operator:<version>``."""
    return f"{IMAGE_REPOSITORY}:{project_version()}"


def project_root() -> Path:
    """The source tree this package runs from (an editable install), needed to build the operator image.

    Raises:
        imagebuild.ImageBuildError: The package is not installed from a source tree.
    """
    root = Path(__file__).resolve().parents[3]
    if not (root / "pyproject.toml").is_file() or not (root / "launcher" / "verl_launcher").is_dir():
        raise imagebuild.ImageBuildError(
            f"the operator image is built from the source tree, and {root} is not one "
            "(install the project and its tooling with `make venv` from a checkout)"
        )
    return root


def operator_recipe(root: Path) -> imagebuild.Recipe:
    """The operator image: the project in a virtualenv, ``verl-operator run`` as entrypoint, non-root."""
    return imagebuild.Recipe(
        name="verl-operator",
        reference=operator_image(),
        requirements=(str(root),),
        files={imagebuild.LAUNCHER_PYZ: launcher_zipapp(root / "launcher" / "verl_launcher")},
        config=oci.ImageConfig(
            entrypoint=("verl-operator", "run"),
            env=(
                f"PATH={imagebuild.VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME=/tmp",
                "PYTHONDONTWRITEBYTECODE=1",
                "PYTHONUNBUFFERED=1",
            ),
            user=imagebuild.NONROOT,
            labels={"org.opencontainers.image.title": "verl-operator"},
        ),
        sources=(
            root / "pyproject.toml",
            root / "operator" / "verl_operator",
            root / "launcher" / "verl_launcher",
            root / "launcher" / "verl_contract",
        ),
        nonroot=True,
    )


def build_operator_image(say: imagebuild.Progress | None = None) -> Path:
    """Build (or find in the cache) the operator image archive."""
    return imagebuild.build(operator_recipe(project_root()), say=say or imagebuild._say)


def pause_binary(root: Path | None = None) -> Path:
    """The static pause binary, built once with ``go build`` into ``<cache>/bin/pause-<hash>/pause``."""
    cache = root or cache_dir()
    key = hashlib.sha256(PAUSE_GO.encode()).hexdigest()[:12]
    out = cache / "bin" / f"pause-{key}" / "pause"
    with file_lock(cache / "gotools" / "pause.lock"):
        if out.is_file():
            return out
        work = cache / "gotools" / f"pause-{key}"
        work.mkdir(parents=True, exist_ok=True)
        (work / "go.mod").write_text("module verl-operator.io/pause\n\ngo 1.22\n")
        (work / "main.go").write_text(PAUSE_GO)
        out.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "CGO_ENABLED": "0"}
        partial = out.with_name(".pause.partial")
        try:
            done = subprocess.run(
                ["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(partial), "."],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
        except FileNotFoundError as exc:
            raise BinaryError(
                "the Go toolchain is needed to build the pause binary and is not on PATH"
            ) from exc
        if done.returncode != 0:
            raise BinaryError(f"go build of the pause binary failed: {done.stdout}{done.stderr}".strip())
        partial.replace(out)
    return out


def pause_image(root: Path | None = None) -> Path:
    """The pod sandbox image archive (one static binary, ``/pause``)."""
    binary = pause_binary(root)
    return imagebuild.single_file_image(
        "pause", PAUSE_IMAGE, "/pause", binary.read_bytes(), oci.ImageConfig(entrypoint=("/pause",)), root
    )
