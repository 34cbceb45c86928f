"""Cached virtualenvs holding a real verl release for the fidelity tier.

Layout under ``${VERL_OPERATOR_CACHE:-~/.cache/verl-operator}/venvs``::

    torch-<ver>/   a virtualenv with PyPI's torch and the CUDA libraries it loads at import
    verl-<ver>/    one virtualenv per verl release; a ``.pth`` file adds the torch layer's site-packages

verl's config code imports torch (``verl/__init__.py`` -> ``verl.protocol``), and PyPI's Linux torch wheel
does not import without its CUDA libraries (``libcublasLt`` and friends, loaded by ``torch/__init__.py``), so
the layer is big (about 5 GiB). Both verl environments share it; everything else verl's config path imports
is installed per release, pinned below. verl itself goes in with ``--no-deps``: its own requirements pull
vLLM, wandb, tensorboard and more that the config path never imports.

An environment counts as built only when its marker file holds the hash of its pin list: an interrupted
build leaves no marker and is rebuilt from scratch on the next run. Run this file to build them with
progress on stderr: ``python tests/fidelity/verl_envs.py [0.9.1 0.6.1]``.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

TORCH_VERSION = "2.11.0"  # the torch that verl 0.9.1 pins in its [vllm] extra

#: The packages a fidelity environment installs, beside verl (``--no-deps``) and the shared torch layer.
#: Read from the imports of ``verl.trainer.main_ppo``'s config path (see docs/fidelity.md).
VERL_PINS: dict[str, tuple[str, ...]] = {
    "0.9.1": (
        "hydra-core==1.3.2",
        "omegaconf==2.3.0",
        "transformers==5.9.0",  # verl[vllm] 0.9.1 pins it
        "numpy>=2.0,<2.5",
        "tensordict==0.10.0",
        "ray==2.52.1",
        "datasets==4.4.1",
        "pandas==2.3.3",
        "pyarrow==22.0.0",
        "codetiming==1.4.0",
        "pillow==12.0.0",
        "pydantic==2.14.4",
        "packaging>=20",
        # the Megatron workers' config checks (verl_runner_megatron.py); imports without a GPU
        "megatron-core==0.16.1",
    ),
    "0.6.1": (
        "hydra-core==1.3.2",
        "omegaconf==2.3.0",
        "transformers==4.57.1",
        "numpy==1.26.4",  # verl 0.6.1 requires numpy<2
        "tensordict==0.10.0",
        "ray==2.52.1",
        "datasets==4.4.1",
        "pandas==2.2.3",
        "pyarrow==22.0.0",
        "codetiming==1.4.0",
        "pillow==12.0.0",
        "pydantic==2.14.4",
        "packaging>=20",
        # imported by verl.workers.rollout.replica in 0.6 (server mode)
        "torchdata==0.11.0",
        "peft==0.21.2",
        "accelerate==1.15.0",
        "psutil>=5",
        "megatron-core==0.14.0",  # the megatron-core of verl 0.6.1's docker images (core_v0.14.0rc7)
    ),
}

SUPPORTED_VERSIONS: tuple[str, ...] = tuple(VERL_PINS)
MARKER = ".fidelity-ready"


@dataclasses.dataclass(frozen=True)
class VerlEnv:
    """A built verl environment.

    Attributes:
        version: The verl release, e.g. ``0.9.1``.
        root: The virtualenv folder.
    """

    version: str
    root: Path

    @property
    def python(self) -> Path:
        """The environment's interpreter."""
        return self.root / "bin" / "python"


def cache_root() -> Path:
    """The folder holding the cached environments (``$VERL_OPERATOR_CACHE/venvs``)."""
    base = os.environ.get("VERL_OPERATOR_CACHE") or str(Path.home() / ".cache" / "verl-operator")
    return Path(base).expanduser() / "venvs"


def _log(message: str) -> None:
    print(f"[fidelity-env] {message}", file=sys.stderr, flush=True)


def _run(argv: list[str]) -> None:
    started = time.monotonic()
    _log("$ " + " ".join(argv))
    subprocess.run(argv, check=True)
    _log(f"  done in {time.monotonic() - started:.0f}s")


def _fingerprint(lines: tuple[str, ...]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def _is_ready(root: Path, fingerprint: str) -> bool:
    marker = root / MARKER
    return marker.is_file() and marker.read_text().strip() == fingerprint


def _site_packages(root: Path) -> Path:
    found = sorted((root / "lib").glob("python3*/site-packages"))
    if not found:
        raise RuntimeError(f"no site-packages under {root}")
    return found[0]


def _build(
    root: Path,
    fingerprint: str,
    install: list[list[str]],
    base_python: str,
    extra_paths: tuple[Path, ...] = (),
) -> None:
    """Create ``root`` from scratch, add ``extra_paths`` to its sys.path, run the pip commands, write the marker."""
    started = time.monotonic()
    if root.exists():
        _log(f"removing the incomplete or outdated {root}")
        shutil.rmtree(root)
    _run([base_python, "-m", "venv", str(root)])
    if extra_paths:
        # On sys.path before pip runs: pip then sees what they hold (torch) as installed.
        (_site_packages(root) / "verl_fidelity_layers.pth").write_text("".join(f"{p}\n" for p in extra_paths))
    pip = [str(root / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check"]
    for args in install:
        _run(pip + args)
    (root / MARKER).write_text(fingerprint + "\n")
    _log(f"{root} ready in {time.monotonic() - started:.0f}s")


def _base_python() -> str:
    # A venv's interpreter creates venvs based on its own base interpreter.
    return sys.executable


def ensure_torch_layer() -> Path:
    """Build the shared torch layer when missing; return its site-packages folder."""
    root = cache_root() / f"torch-{TORCH_VERSION}"
    pins = (f"torch=={TORCH_VERSION}",)
    fingerprint = _fingerprint(pins)
    if not _is_ready(root, fingerprint):
        _log(f"building the torch layer {root} (downloads about 2.6 GB once)")
        _build(root, fingerprint, [list(pins)], _base_python())
    return _site_packages(root)


def ensure_env(version: str) -> VerlEnv:
    """Build the environment for one verl release when missing or outdated, then return it.

    Args:
        version: A key of ``VERL_PINS`` (``0.9.1`` or ``0.6.1``).

    Returns:
        The ready environment.

    Raises:
        ValueError: ``version`` is not supported.
        subprocess.CalledProcessError: pip failed (the environment is left without its marker).
    """
    if version not in VERL_PINS:
        raise ValueError(f"verl version {version!r} is not supported; choose one of {SUPPORTED_VERSIONS}")
    venvs = cache_root()
    venvs.mkdir(parents=True, exist_ok=True)
    with (venvs / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs must not build the same folder at once
        torch_site = ensure_torch_layer()
        root = venvs / f"verl-{version}"
        pins = VERL_PINS[version]
        fingerprint = _fingerprint((f"verl=={version}", f"torch-layer={torch_site}", *pins))
        if not _is_ready(root, fingerprint):
            _log(f"building {root}")
            # tensordict's requirement on torch is met by the shared layer, so no second torch is fetched.
            install = [list(pins), ["--no-deps", f"verl=={version}"]]
            _build(root, fingerprint, install, _base_python(), extra_paths=(torch_site,))
    return VerlEnv(version=version, root=root)


def main(argv: list[str]) -> int:
    """Build the named environments (all supported ones when none is named)."""
    started = time.monotonic()
    for version in argv or list(SUPPORTED_VERSIONS):
        env = ensure_env(version)
        _log(f"verl {env.version}: {env.python}")
    _log(f"all environments ready in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
