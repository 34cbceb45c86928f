"""Reading the launch spec (``launch.json``) in a Ray pod: the contract's model, the launcher's exit codes.

The document's model is the contract's own (:class:`verl_contract.launch_spec.LaunchSpec`, the one the
operator writes); here a missing file, bad JSON or a bad field becomes ``InvalidLaunchSpec`` (exit 2) with a
message naming every bad field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from verl_contract.launch_spec import LaunchSpec
from verl_launcher.exits import ExitCode, LauncherError


def _field_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts) or "(root)"


def format_validation_error(source: str, error: ValidationError) -> str:
    """Render a pydantic error as ``<source>: field `a.b`: problem; ...`` naming every bad field.

    Args:
        source: Where the spec came from (a path), shown first.
        error: The validation error.

    Returns:
        One line naming each failing field and its problem.
    """
    problems = [f"field `{_field_path(tuple(e['loc']))}`: {e['msg']}" for e in error.errors()]
    return f"invalid launch spec {source}: " + "; ".join(problems)


def parse_launch_spec(data: Any, source: str = "launch.json") -> LaunchSpec:
    """Validate decoded JSON as a launch spec.

    Args:
        data: The decoded JSON document.
        source: A name for messages (usually the file path).

    Returns:
        The validated spec.

    Raises:
        LauncherError: With ``INVALID_LAUNCH_SPEC``, naming every bad field.
    """
    if not isinstance(data, dict):
        raise LauncherError(
            ExitCode.INVALID_LAUNCH_SPEC,
            f"invalid launch spec {source}: the document must be a JSON object, got {type(data).__name__}",
        )
    try:
        return LaunchSpec.model_validate(data)
    except ValidationError as exc:
        raise LauncherError(ExitCode.INVALID_LAUNCH_SPEC, format_validation_error(source, exc)) from exc


def load_launch_spec(path: str | Path) -> LaunchSpec:
    """Read and validate the launch spec file.

    Args:
        path: The JSON file (normally ``$VERL_LAUNCH_SPEC``).

    Returns:
        The validated spec.

    Raises:
        LauncherError: With ``INVALID_LAUNCH_SPEC`` when the file is missing, not JSON, or invalid.
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise LauncherError(
            ExitCode.INVALID_LAUNCH_SPEC, f"cannot read the launch spec {source}: {exc.strerror or exc}"
        ) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LauncherError(
            ExitCode.INVALID_LAUNCH_SPEC,
            f"invalid launch spec {source}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
        ) from exc
    return parse_launch_spec(data, source)
