"""The command line and environment verl is started with (pure functions; the fidelity tier calls them)."""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from verl_contract.launch_spec import LaunchSpec

#: Variables verl's PPO entrypoint puts in its Ray runtime env (trainer/constants_ppo.py), set here too so the
#: driver process and the Ray nodes agree; a value already in the pod's environment always wins.
VERL_RECOMMENDED_ENV: dict[str, str] = {
    "TOKENIZERS_PARALLELISM": "true",
    "NCCL_DEBUG": "WARN",
    "VLLM_LOGGING_LEVEL": "WARN",
    # verl's metric lines must reach the launcher as they are printed, not when a buffer fills.
    "PYTHONUNBUFFERED": "1",
}


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RAY_PREFIX = re.compile(r"^\(\S+ pid=\d+[^()]*\)\s*")
#: The last line of a Python traceback, ``ExceptionType: message`` (dotted names, Ray's
#: ``ray.exceptions.RayTaskError(FileNotFoundError): ...`` too).
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)(?:\([\w.]+\))?: \S")


def failure_line(lines: Sequence[str]) -> str:
    """The line of verl's last output that says why it failed.

    The last exception line of a traceback (``FileNotFoundError: Unable to find '/data/x.parquet'``) when
    there is one, else the last line that is not empty. verl's entrypoint runs under Hydra, whose error
    handler ends the output with ``Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack
    trace.``, after the exception it reports. Ray's ``(Actor pid=...)`` prefix and colours are removed.

    Args:
        lines: The last lines verl printed, oldest first.
    """
    cleaned = [_RAY_PREFIX.sub("", _ANSI.sub("", line).strip()) for line in lines]
    cleaned = [line for line in cleaned if line]
    return next(
        (line for line in reversed(cleaned) if _EXCEPTION.match(line)), cleaned[-1] if cleaned else ""
    )


def override_key(override: str) -> str:
    """The config key a Hydra override sets (``++trainer.x=1`` -> ``trainer.x``, ``~a.b`` -> ``a.b``)."""
    return override.lstrip("+~").split("=", 1)[0]


def resume_requested(spec: LaunchSpec, attempt: int) -> bool:
    """True when verl must resume: a restart (``attempt > 0``) or ``checkpoint.resume``."""
    return attempt > 0 or spec.checkpoint.resume


def build_argv(spec: LaunchSpec, attempt: int) -> list[str]:
    """verl's argv: ``entrypoint + overrides`` plus the checkpoint overrides the user did not set.

    ``trainer.default_local_dir=<checkpoint.dir>`` is added whenever ``checkpoint.dir`` is set (attempt 0 must
    save where a restart will look). ``trainer.resume_mode=auto`` is added when resuming (see
    :func:`resume_requested`), ``trainer.resume_mode=disable`` otherwise: verl's own default is ``auto``,
    which would silently continue from old checkpoints on a first attempt with ``checkpoint.resume: false``.
    An override the user wrote for either key is kept as written.

    Args:
        spec: The launch spec.
        attempt: ``VERL_OPERATOR_ATTEMPT`` (0-based restart count).

    Returns:
        The argv list (never passed through a shell).

    Raises:
        ValueError: ``attempt`` is negative.
    """
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt}")
    argv = [*spec.entrypoint, *spec.overrides]
    user_keys = {override_key(o) for o in spec.overrides}
    if spec.checkpoint.dir and "trainer.default_local_dir" not in user_keys:
        argv.append(f"trainer.default_local_dir={spec.checkpoint.dir}")
    if "trainer.resume_mode" not in user_keys:
        argv.append(f"trainer.resume_mode={'auto' if resume_requested(spec, attempt) else 'disable'}")
    return argv


def head_address(spec: LaunchSpec) -> str:
    """The Ray GCS address every process of the job uses (``head.host:head.port``)."""
    return f"{spec.head.host}:{spec.head.port}"


def build_env(
    spec: LaunchSpec,
    base_env: Mapping[str, str],
    *,
    with_ray_address: bool = True,
    ray_address: str | None = None,
) -> dict[str, str]:
    """The environment verl (and the Ray node processes) run with.

    Order of precedence: the pod's environment (``base_env``) first, then the spec's ``env``, then verl's
    recommended variables and ``RAY_ADDRESS``. Nothing already set is overridden.

    Args:
        spec: The launch spec.
        base_env: The launcher's own environment.
        with_ray_address: Add ``RAY_ADDRESS`` (verl's ``ray.init()`` joins the job's cluster through it).
        ray_address: Its value; default ``head.host:head.port`` (the head passes its local address).

    Returns:
        A new dict.
    """
    env = dict(base_env)
    for name, value in spec.env.items():
        env.setdefault(name, value)
    for name, value in VERL_RECOMMENDED_ENV.items():
        env.setdefault(name, value)
    if with_ray_address:
        env.setdefault("RAY_ADDRESS", ray_address or head_address(spec))
    archive = launcher_archive()
    if archive is not None:
        # Run from the injected zipapp: Ray's worker processes (the GPU probe task) import verl_launcher
        # from the same archive.
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if archive not in paths:
            env["PYTHONPATH"] = os.pathsep.join([archive, *paths])
    return env


def launcher_archive(module_file: str | None = None) -> str | None:
    """The zipapp this launcher runs from (``.../verl-launcher.pyz``), or None when it is installed."""
    path = Path(module_file or __file__)
    for parent in path.parents:
        if parent.suffix == ".pyz" or (parent.is_file() and zipfile.is_zipfile(parent)):
            return str(parent)
    return None
