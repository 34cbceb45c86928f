"""Build container images without a container engine: a Debian base from packages (``mmdebstrap``), Python
packages installed into a virtualenv inside it (``chroot``), written as an OCI archive that
``ctr images import`` reads.

This is the same recipe as the project's ``Dockerfile`` (a Debian bookworm base with Debian's Python 3 and
a virtualenv under ``/opt/verl-operator``), for machines with no Docker engine and no registry. Every
result is cached under ``<cache>/images`` by a hash of everything it is made from, so a warm build is a
file lookup.

Layout of the cache::

    images/base-<hash>.tar            the Debian root filesystem (one layer, shared by the images)
    images/<image>-<hash>.oci.tar     an image archive (base layer + one layer with /opt/...)
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from verl_devtools.devcluster import oci
from verl_devtools.devcluster.locking import file_lock
from verl_devtools.devcluster.versions import cache_dir
from verl_operator.manifests.launchspec import LAUNCHER_IN_OPERATOR_IMAGE

#: Debian release and mirror of the base (the Dockerfile's default base is the same release).
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
#: Debian's Python 3 (3.11 on bookworm) and what ``python3 -m venv`` needs.
BASE_PACKAGES: tuple[str, ...] = ("python3", "python3-venv", "ca-certificates")
#: Where the image's virtualenv lives (the Dockerfile uses the same path).
VENV = "/opt/verl-operator"
#: The self-contained launcher inside the operator image (copied into Ray pods by an init container).
LAUNCHER_PYZ = LAUNCHER_IN_OPERATOR_IMAGE
#: The operator image's user (non-root; the chart's securityContext uses the same ids), with the account
#: lines the image gets (Python's getpass and others look the user up).
NONROOT = "65532:65532"
NONROOT_PASSWD = "nonroot:x:65532:65532:nonroot:/tmp:/usr/sbin/nologin\n"
NONROOT_GROUP = "nonroot:x:65532:\n"

Progress = Callable[[str], None]


class ImageBuildError(RuntimeError):
    """A build step failed (the message names the step and shows its output's tail)."""


@dataclass(frozen=True)
class Recipe:
    """One image: a virtualenv with ``requirements`` on the Debian base, plus extra files.

    Attributes:
        name: Short name (cache file names).
        reference: Image reference with tag.
        requirements: pip requirement strings or local project paths, installed into the virtualenv.
        files: ``{path in image: content}`` added to the top layer.
        config: Entrypoint, environment and user.
        sources: Local paths whose content is part of the cache key (a project being installed).
        venv: Where the virtualenv goes.
        nonroot: Add the ``nonroot`` (65532) account to ``/etc/passwd`` and ``/etc/group``.
    """

    name: str
    reference: str
    requirements: tuple[str, ...]
    files: dict[str, bytes] = field(default_factory=dict)
    config: oci.ImageConfig = field(default_factory=oci.ImageConfig)
    sources: tuple[Path, ...] = ()
    venv: str = VENV
    nonroot: bool = False


def _say(message: str) -> None:
    print(f"[images] {message}", file=sys.stderr, flush=True)


def _run(argv: list[str], what: str, cwd: Path | None = None) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        raise ImageBuildError(f"{what} failed (exit {done.returncode}):\n{tail}")


def tree_hash(paths: Iterable[Path]) -> str:
    """A hash of the files under ``paths`` (names and bytes; caches, ``.pyc`` and VCS data skipped)."""
    digest = hashlib.sha256()
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            if path.suffix == ".pyc" or "__pycache__" in path.parts or ".egg-info" in str(path):
                continue
            digest.update(str(path.relative_to(root.parent)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def _tools() -> dict[str, str]:
    found = {tool: shutil.which(tool) for tool in ("mmdebstrap", "tar")}
    missing = [tool for tool, path in found.items() if path is None]
    if missing:
        raise ImageBuildError(
            f"{', '.join(missing)} not found: install Debian's mmdebstrap (apt-get install mmdebstrap)"
        )
    return {tool: str(path) for tool, path in found.items()}


def base_rootfs(root: Path | None = None, say: Progress = _say) -> Path:
    """The Debian base root filesystem tarball, built once with ``mmdebstrap`` (about 1.5 min cold).

    Returns:
        ``<cache>/images/base-<hash>.tar``.
    """
    images = (root or cache_dir()) / "images"
    key = hashlib.sha256(
        json.dumps([DEBIAN_SUITE, DEBIAN_MIRROR, BASE_PACKAGES, "no-doc-man-locale"]).encode()
    ).hexdigest()[:16]
    out = images / f"base-{key}.tar"
    with file_lock(images / "base.lock"):
        if out.is_file():
            return out
        tools = _tools()
        started = time.monotonic()
        say(f"building the Debian {DEBIAN_SUITE} base with mmdebstrap (cold: about 2 min) -> {out}")
        partial = out.with_name(f".{out.name}.partial")
        _run(
            [
                tools["mmdebstrap"],
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                # Smaller image: no apt lists, no docs or man pages.
                "--dpkgopt=path-exclude=/usr/share/doc/*",
                "--dpkgopt=path-exclude=/usr/share/man/*",
                # Translations of the base's tools (30 MiB); the image's programs speak English.
                "--dpkgopt=path-exclude=/usr/share/locale/*",
                '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*',
                "--format=tar",
                DEBIAN_SUITE,
                str(partial),
                DEBIAN_MIRROR,
            ],
            "mmdebstrap",
        )
        partial.replace(out)
        _drop_older(images, "base", out, suffix=".tar")
        say(f"base ready in {time.monotonic() - started:.0f}s ({out.stat().st_size >> 20} MiB)")
    return out


def _drop_older(images: Path, name: str, keep: Path, suffix: str = ".oci.tar") -> None:
    """Remove the earlier builds of ``name`` (the cache keeps the newest of each image, not every version)."""
    for old in images.glob(f"{name}-*{suffix}"):
        if old != keep and old.name.removeprefix(f"{name}-").removesuffix(suffix).isalnum():
            old.unlink(missing_ok=True)


def _recipe_key(recipe: Recipe, base: Path) -> str:
    digest = hashlib.sha256()
    digest.update(base.name.encode())
    digest.update(
        json.dumps(
            [
                recipe.reference,
                recipe.requirements,
                recipe.venv,
                recipe.nonroot,
                oci.config_document(recipe.config, []),
            ]
        ).encode()
    )
    for path, content in sorted(recipe.files.items()):
        digest.update(path.encode() + b"\0" + hashlib.sha256(content).digest())
    digest.update(tree_hash(recipe.sources).encode())
    return digest.hexdigest()[:16]


def _top_layer(rootfs: Path, out: Path, tops: list[str]) -> None:
    """Tar ``rootfs/<top>`` for each top (what the install added or changed) as one layer, parents first."""
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as layer:
        added: set[str] = set()
        for top in sorted(tops):
            parts = Path(top.strip("/")).parts
            for depth in range(1, len(parts)):
                parent = "/".join(parts[:depth])
                if parent not in added:
                    layer.add(rootfs / parent, arcname=parent, recursive=False)
                    added.add(parent)
            layer.add(rootfs / top.strip("/"), arcname=top.strip("/"))
            added.add(top.strip("/"))


def build(recipe: Recipe, root: Path | None = None, say: Progress = _say) -> Path:
    """Build (or find in the cache) an image archive.

    Steps: the base rootfs is unpacked into a scratch directory; ``python3 -m venv`` and
    ``pip install`` run inside it with ``chroot`` (wheels prepared by the host's pip, so the chroot needs no
    network); pip itself is removed again; the virtualenv becomes the top layer.

    Args:
        recipe: What to build.
        root: The cache root.
        say: Progress lines.

    Returns:
        The OCI archive (``<cache>/images/<name>-<hash>.oci.tar``).

    Raises:
        ImageBuildError: A step failed.
    """
    cache = root or cache_dir()
    base = base_rootfs(cache, say)
    images = cache / "images"
    out = images / f"{recipe.name}-{_recipe_key(recipe, base)}.oci.tar"
    with file_lock(images / f"{recipe.name}.lock"):
        if out.is_file():
            return out
        tools = _tools()
        started = time.monotonic()
        say(f"building image {recipe.reference} -> {out}")
        with tempfile.TemporaryDirectory(prefix=f"verl-image-{recipe.name}-", dir=images) as scratch:
            work = Path(scratch)
            rootfs = work / "rootfs"
            rootfs.mkdir()
            _run([tools["tar"], "-xf", str(base), "-C", str(rootfs)], "unpack the base")
            _install_venv(rootfs, recipe)
            _add_files(rootfs, recipe)
            top = work / "top.tar"
            _top_layer(rootfs, top, _top_paths(recipe))
            oci.write_archive(out, [base, top], recipe.config, recipe.reference)
        _drop_older(images, recipe.name, out)
        size = out.stat().st_size >> 20
        say(f"image {recipe.reference} ready in {time.monotonic() - started:.0f}s ({size} MiB uncompressed)")
    return out


def _install_venv(rootfs: Path, recipe: Recipe) -> None:
    """Create the recipe's virtualenv in ``rootfs`` with its requirements installed, and pip removed again."""
    wheels = rootfs / "tmp" / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    # The host's pip fetches and builds every wheel (same Python minor and libc as Debian bookworm).
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(wheels), *recipe.requirements],
        "pip wheel",
    )
    env_python = f"{recipe.venv}/bin/python"
    _run(["chroot", str(rootfs), "/usr/bin/python3", "-m", "venv", recipe.venv], "python3 -m venv")
    names = sorted(p.name for p in wheels.glob("*.whl"))
    _run(
        [
            "chroot",
            str(rootfs),
            env_python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-compile",
            "--find-links",
            "/tmp/wheels",
            *(f"/tmp/wheels/{n}" for n in names),
        ],
        "pip install in the image",
    )
    _run(["chroot", str(rootfs), env_python, "-m", "pip", "uninstall", "-q", "-y", "pip"], "remove pip")


def _add_files(rootfs: Path, recipe: Recipe) -> None:
    """Add the non-root account (when asked) and the recipe's files (executable when they start with ``#!``)."""
    if recipe.nonroot:
        for name, line in (("passwd", NONROOT_PASSWD), ("group", NONROOT_GROUP)):
            account = rootfs / "etc" / name
            account.write_text(account.read_text() + line)
    for path, content in recipe.files.items():
        target = rootfs / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        target.chmod(0o755 if content.startswith(b"#!") else 0o644)


def _top_paths(recipe: Recipe) -> list[str]:
    """What the top layer holds: the virtualenv, the files outside it and the changed account files."""
    tops = [recipe.venv, *(p for p in recipe.files if not p.startswith(recipe.venv + "/"))]
    if recipe.nonroot:
        tops += ["/etc/passwd", "/etc/group"]
    return tops


def single_file_image(
    name: str, reference: str, path: str, content: bytes, config: oci.ImageConfig, root: Path | None = None
) -> Path:
    """An image of one executable file (the pod sandbox's pause binary), cached by its content."""
    images = (root or cache_dir()) / "images"
    key = hashlib.sha256(content + reference.encode()).hexdigest()[:16]
    out = images / f"{name}-{key}.oci.tar"
    with file_lock(images / f"{name}.lock"):
        if out.is_file():
            return out
        with tempfile.TemporaryDirectory(prefix=f"verl-image-{name}-", dir=images) as scratch:
            layer = Path(scratch) / "layer.tar"
            with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as archive:
                info = tarfile.TarInfo(path.lstrip("/"))
                info.size = len(content)
                info.mode = 0o755
                archive.addfile(info, io.BytesIO(content))
            oci.write_archive(out, [layer], config, reference)
    return out
