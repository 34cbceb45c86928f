"""The cached virtualenv in which verl 0.6.1's real trainer runs on CPU (the real-verl tier).

Layout: ``${VERL_OPERATOR_CACHE:-~/.cache/verl-operator}/venvs/realverl-0.6.1``, a plain virtualenv with
verl 0.6.1 and its own requirements (not ``--no-deps``: the trainer imports far more than the configuration
path the fidelity tier runs), PyPI's default torch wheel (it runs on CPU; its CUDA libraries are installed
but never loaded for a device) and the pins below, which make the trainer run on this machine
(docs/realverl.md). The launcher runs from this interpreter too, as it does from a verl image's: its
``ray start`` and verl's ``ray.init`` must be the same Ray.

The environment counts as built only when its marker holds the hash of everything it was built from (the
pins, the Python version): an interrupted or outdated build is removed and redone. Build it with progress on
stderr: ``python tests/realverl/cpu_env.py`` (``make test-realverl`` does).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VERL_VERSION = "0.6.1"
#: What pip installs, in one resolve. torch 2.8.0 and transformers 4.56.2 are the versions verl 0.6.1's
#: trainer was run with on CPU; verl 0.6.1 needs numpy<2, and pyarrow 22 and newer need numpy 2.
PINS: tuple[str, ...] = (
    f"verl=={VERL_VERSION}",
    "torch==2.8.0",
    "transformers==4.56.2",
    "numpy==1.26.4",
    "pyarrow==21.0.0",
    "tensordict==0.10.0",
    "ray[default]==2.60.0",
    "pydantic>=2.7,<3",  # the launch contract (verl_contract) parses launch.json with it
)
MARKER = ".realverl-ready"


def cache_root() -> Path:
    """The folder holding the cached environments (``$VERL_OPERATOR_CACHE/venvs``)."""
    base = os.environ.get("VERL_OPERATOR_CACHE") or str(Path.home() / ".cache" / "verl-operator")
    return Path(base).expanduser() / "venvs"


def env_root() -> Path:
    """The environment's folder."""
    return cache_root() / f"realverl-{VERL_VERSION}"


def python() -> Path:
    """The environment's interpreter (it may not be built yet)."""
    return env_root() / "bin" / "python"


def fingerprint() -> str:
    """The hash of the environment's inputs: the pins and the base interpreter's version."""
    inputs = "\n".join((*PINS, f"python={platform.python_version()}"))
    return hashlib.sha256(inputs.encode()).hexdigest()[:16]


def is_ready() -> bool:
    """Whether the environment is built from the current inputs."""
    marker = env_root() / MARKER
    return marker.is_file() and marker.read_text().strip() == fingerprint()


def _log(message: str) -> None:
    print(f"[realverl-env] {message}", file=sys.stderr, flush=True)


def _run(argv: list[str]) -> None:
    started = time.monotonic()
    _log("$ " + " ".join(argv))
    subprocess.run(argv, check=True)
    _log(f"  done in {time.monotonic() - started:.0f}s")


def ensure() -> Path:
    """Build the environment when missing or outdated; return its interpreter.

    Raises:
        subprocess.CalledProcessError: pip failed (the folder is left without its marker).
    """
    root = env_root()
    root.parent.mkdir(parents=True, exist_ok=True)
    with (root.parent / ".realverl.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs must not build the same folder at once
        if is_ready():
            return python()
        started = time.monotonic()
        if root.exists():
            _log(f"removing the incomplete or outdated {root}")
            shutil.rmtree(root)
        _log(f"building {root} (downloads about 3 GB once: torch and its CUDA libraries)")
        # A venv's interpreter creates venvs based on its own base interpreter.
        _run([sys.executable, "-m", "venv", str(root)])
        _run([str(python()), "-m", "pip", "install", "--disable-pip-version-check", *PINS])
        (root / MARKER).write_text(fingerprint() + "\n")
        _log(f"{root} ready in {time.monotonic() - started:.0f}s")
    return python()


ASSETS_SCRIPT = Path(__file__).resolve().parent / "assets.py"


def ensure_assets(interpreter: Path) -> Path:
    """The tiny model, tokenizer, data and reward, built by ``assets.py`` with ``interpreter`` when missing.

    Cached in ``<cache>/realverl-assets/<hash>``; the hash covers ``assets.py`` and the environment's inputs
    (another torch or transformers may write other files), so a change to either builds a new folder.
    """
    key = hashlib.sha256(ASSETS_SCRIPT.read_bytes() + fingerprint().encode()).hexdigest()[:16]
    folder = cache_root().parent / "realverl-assets" / key
    if not (folder / ".assets-ready").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=folder.parent))
        try:
            subprocess.run([str(interpreter), str(ASSETS_SCRIPT), str(staging)], check=True, timeout=600)
            if not folder.exists():  # a concurrent run may have finished first: keep its folder
                os.replace(staging, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return folder


if __name__ == "__main__":
    print(ensure())
