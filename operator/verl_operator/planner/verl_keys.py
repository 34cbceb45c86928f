"""The keys of verl's ``ppo_trainer`` config per release line, and the check of override keys against them.

``data/verl-config-keys.json`` is generated from verl's own config by ``tests/fidelity/verl_keys.py`` (the
fidelity tier fails when it drifts). Hydra composes verl's config in struct mode, so before verl starts:

- ``key=value`` and ``~key`` need ``key`` to exist (``Could not override 'key'``);
- ``+key=value`` needs it not to exist (``Could not append to config. An item is already at 'key'``);
- ``++key=value`` adds or replaces, and always composes.

Scripts written for one release often carry keys another release renamed (verl 0.6's
``critic.model.fsdp_config.param_offload`` is ``critic.fsdp.param_offload`` in 0.9).
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Sequence
from importlib import resources

from verl_operator.planner.overrides import Override
from verl_operator.planner.result import Violation

_FILE = "verl-config-keys.json"


@functools.cache
def _table() -> dict[str, dict[str, object]]:
    text = resources.files("verl_operator").joinpath("data", _FILE).read_text(encoding="utf-8")
    lines: dict[str, dict[str, object]] = json.loads(text)["lines"]
    return lines


@functools.cache
def known_keys(version: str) -> frozenset[str]:
    """Every key path (nodes and leaves) of verl's ``ppo_trainer`` config for a VerlJob version line."""
    keys = _table()[version]["keys"]
    assert isinstance(keys, list)
    return frozenset(str(k) for k in keys)


def source_release(version: str) -> str:
    """The verl release the key list of ``version`` was read from (``0.9`` -> ``0.9.1``)."""
    return str(_table()[version]["release"])


def _similar(key: str, keys: frozenset[str]) -> list[str]:
    """Known keys that look like ``key``: the same last name under another parent first, then close spellings."""
    leaf = key.rsplit(".", 1)[-1]
    head = key.split(".", 1)[0]
    same_leaf = sorted(k for k in keys if k.rsplit(".", 1)[-1] == leaf and k.split(".", 1)[0] == head)
    close = difflib.get_close_matches(key, sorted(keys), n=3, cutoff=0.75)
    return list(dict.fromkeys(same_leaf[:3] + close))[:3]


def key_violations(overrides: Sequence[Override], version: str) -> list[Violation]:
    """Overrides that Hydra's struct mode refuses for ``version``'s config (see the module docstring)."""
    keys = known_keys(version)
    release = source_release(version)
    out: list[Violation] = []
    for ov in overrides:
        if ov.prefix == "++" or ov.key.startswith("hydra."):
            continue
        present = ov.key in keys
        if ov.prefix == "+" and present:
            out.append(
                Violation(
                    field=ov.source,
                    rule="override-add-existing",
                    message=f"+{ov.key} adds a key, but verl {release}'s config already has {ov.key} (Hydra refuses it)",
                    suggestions=[f"write {ov.key}={ov.text} (or ++{ov.key}={ov.text})"],
                )
            )
        elif ov.prefix != "+" and not present:
            similar = _similar(ov.key, keys)
            out.append(
                Violation(
                    field=ov.source,
                    rule="override-unknown-key",
                    message=f"{ov.key} is not a key of verl {release}'s ppo_trainer config (Hydra refuses it)",
                    suggestions=[f"use {' or '.join(similar)}" for _ in similar[:1]]
                    + [f"write +{ov.key}=... to add a key verl reads but does not declare"],
                )
            )
    return out
