"""The shipped cluster profiles, by name: ``examples/clusters/<name>.yaml``.

The profile model and its Node manifests are the product's (:mod:`verl_operator.clusters.profile`); this
module finds the example files the devcluster, the tests and the benchmarks name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_operator.clusters.profile import Profile, ProfileError, read_profile

#: The profile ``devcluster up`` loads when none is named.
DEFAULT_PROFILE = "dgx-h100"


def examples_dir() -> Path:
    """The shipped profiles: ``devcluster/profiles/`` of the package.

    In the source tree that directory is a symbolic link to ``examples/clusters`` (the files are edited
    there); a built wheel carries copies.
    """
    return Path(__file__).with_name("profiles")


def available_profiles() -> list[str]:
    """Names of the profiles in :func:`examples_dir`."""
    return sorted(p.stem for p in examples_dir().glob("*.yaml"))


def resolve_profile_path(name_or_path: str) -> Path:
    """A profile name (``dgx-h100``) or a path to a YAML file -> the file.

    Raises:
        ProfileError: Neither a file nor a known profile name.
    """
    candidate = Path(name_or_path).expanduser()
    if candidate.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if candidate.is_file():
            return candidate
        raise ProfileError(f"profile file {candidate} does not exist")
    named = examples_dir() / f"{name_or_path}.yaml"
    if named.is_file():
        return named
    raise ProfileError(f"unknown profile {name_or_path!r}; known: {', '.join(available_profiles())}")


def load_profile(name_or_path: str) -> Profile:
    """Load and validate a profile by name or path.

    Raises:
        ProfileError: Unknown, unreadable or invalid profile.
    """
    return read_profile(resolve_profile_path(name_or_path))


def node_group_like(name: str, **changes: Any) -> dict[str, Any]:
    """The first node group of the shipped profile ``name`` as a profile dict (camelCase, no spine block), with
    ``changes`` (camelCase keys) applied: a group of the same machines for a test or a benchmark."""
    group = load_profile(name).node_groups[0]
    return {**group.model_dump(by_alias=True, mode="json", exclude_none=True, exclude={"block"}), **changes}
