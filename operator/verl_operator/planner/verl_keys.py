"""The keys of verl's ``ppo_trainer`` config per release line, and the check of override keys against them.

``data/verl-config-keys.json`` is generated from verl's own config by ``tests/fidelity/verl_keys.py`` (the
fidelity tier fails when it drifts). Hydra composes verl's config in struct mode, so before verl starts:

- ``key=value`` and ``~key`` need ``key`` to exist (``Could not override 'key'``); a dict value
  (``key={a:1}``) is merged into the node, so every key it sets must exist too;
- ``+key=value`` needs it not to exist (``Could not append to config. An item is already at 'key'``), unless
  its value is null (the file's ``null`` keys) or the new value is a dict or a list (Hydra then merges or
  replaces, adding what is missing; hydra-core 1.3.2 ``_internal/config_loader_impl.py`` lines 370-374);
- ``++key=value`` adds or replaces, and always composes.

Scripts written for one release often carry keys another release renamed (verl 0.6's
``critic.model.fsdp_config.param_offload`` is ``critic.fsdp.param_offload`` in 0.9). An unknown key gets the
known keys that look like it as suggestions. They are looked for near the key only (the children of its
closest existing parents, and the same last name under the same top-level section), for at most
``MAX_SUGGESTED`` keys of one request, on the plan's budget (``budget.spend``: one step per key compared);
when the budget runs out the remaining keys are refused without suggestions.
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

from verl_operator.api.plan import Violation
from verl_operator.planner import budget
from verl_operator.planner.overrides import Override, Value, shorten

_FILE = "verl-config-keys.json"
#: Unknown keys of one request that get suggestions; the others are refused with the general advice only.
MAX_SUGGESTED = 16
#: Known keys one unknown key is compared with, at most.
MAX_CANDIDATES = 160
#: Parents followed per level when a key's parent is misspelt too.
MAX_BRANCHES = 3
#: difflib's similarity a suggestion needs (the same as before the index: ``get_close_matches`` cutoff).
CUTOFF = 0.75
#: Similarity a misspelt parent name needs to be followed.
SEGMENT_CUTOFF = 0.6


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


@functools.cache
def null_keys(version: str) -> frozenset[str]:
    """The keys of verl's config for a version line whose value is null (``+key=value`` may add to them)."""
    keys = _table()[version].get("null", [])
    assert isinstance(keys, list)
    return frozenset(str(k) for k in keys)


def source_release(version: str) -> str:
    """The verl release the key list of ``version`` was read from (``0.9`` -> ``0.9.1``)."""
    return str(_table()[version]["release"])


@dataclass(frozen=True)
class KeyIndex:
    """The known keys of one release line, indexed for suggestions.

    Attributes:
        keys: Every key path.
        children: Parent path (``""``: the root) -> its child paths, sorted.
        same_leaf: ``(top-level section, last name)`` -> the paths with them, sorted.
        by_name: Last name -> the paths that end in it, sorted.
        name_edits: A last name with one character deleted (or as it is) -> the last names it comes from: two
            names one edit apart (a letter added, dropped, changed, or two swapped) share an entry.
    """

    keys: frozenset[str]
    children: dict[str, tuple[str, ...]]
    same_leaf: dict[tuple[str, str], tuple[str, ...]]
    by_name: dict[str, tuple[str, ...]]
    name_edits: dict[str, frozenset[str]]

    def near_names(self, name: str) -> set[str]:
        """The last names at most one edit from ``name``."""
        out: set[str] = set()
        for variant in _deletions(name):
            out.update(self.name_edits.get(variant, ()))
        return out


def _deletions(name: str) -> set[str]:
    return {name} | {name[:i] + name[i + 1 :] for i in range(len(name))}


@functools.cache
def key_index(version: str) -> KeyIndex:
    """The index of ``known_keys(version)`` (built once per release line)."""
    keys = known_keys(version)
    children: dict[str, list[str]] = {}
    same_leaf: dict[tuple[str, str], list[str]] = {}
    by_name: dict[str, list[str]] = {}
    for key in sorted(keys):
        parent, _, leaf = key.rpartition(".")
        children.setdefault(parent, []).append(key)
        same_leaf.setdefault((key.split(".", 1)[0], leaf), []).append(key)
        by_name.setdefault(leaf, []).append(key)
    edits: dict[str, set[str]] = {}
    for name in by_name:
        for variant in _deletions(name):
            edits.setdefault(variant, set()).add(name)
    return KeyIndex(
        keys=keys,
        children={k: tuple(v) for k, v in children.items()},
        same_leaf={k: tuple(v) for k, v in same_leaf.items()},
        by_name={k: tuple(v) for k, v in by_name.items()},
        name_edits={k: frozenset(v) for k, v in edits.items()},
    )


def _ratio(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def _parents(key: str, index: KeyIndex) -> list[str]:
    """The known nodes that could be ``key``'s parent: its parent path, each missing or misspelt name replaced
    by the closest names at that level (at most ``MAX_BRANCHES`` per level)."""
    frontier = [""]
    for name in key.split(".")[:-1]:
        found: list[str] = []
        for node in frontier:
            exact = f"{node}.{name}" if node else name
            if exact in index.keys:
                found.append(exact)
                continue
            near = index.children.get(node, ())
            budget.spend(len(near))
            scored = [(_ratio(name, path.rpartition(".")[2]), path) for path in near]
            found += [p for r, p in sorted(scored, reverse=True)[:MAX_BRANCHES] if r >= SEGMENT_CUTOFF]
        frontier = found[:MAX_BRANCHES]
        if not frontier:
            break
    return frontier


def candidates(key: str, index: KeyIndex) -> list[str]:
    """The known keys a suggestion for ``key`` is chosen from (at most ``MAX_CANDIDATES``): for each possible
    parent, the parent itself, its children and grandchildren; the keys anywhere whose last name is at most
    one edit from ``key``'s (of a length difflib's cutoff allows)."""
    out: dict[str, None] = {}
    for parent in _parents(key, index):
        if parent:
            out[parent] = None
        for child in index.children.get(parent, ()):
            out[child] = None
            out.update(dict.fromkeys(index.children.get(child, ())))
    leaf = key.rpartition(".")[2]
    size = len(key)
    for name in sorted(index.near_names(leaf)):
        for path in index.by_name[name]:
            if 2 * min(size, len(path)) >= CUTOFF * (size + len(path)):
                out[path] = None
    return list(out)[:MAX_CANDIDATES]


def closest(key: str, paths: Sequence[str], n: int = 3) -> list[str]:
    """``difflib.get_close_matches(key, paths, n, CUTOFF)``, comparing fewer pairs in full.

    Each path's cheap upper bounds of the ratio (lengths, then letter counts) are taken first; the full
    ratio is computed best bound first, and stops once no bound left can reach the ``n``-th best ratio.
    """
    matcher = difflib.SequenceMatcher()
    matcher.set_seq2(key)
    bounds: list[tuple[float, str]] = []
    for path in paths:
        matcher.set_seq1(path)
        if matcher.real_quick_ratio() >= CUTOFF and (bound := matcher.quick_ratio()) >= CUTOFF:
            bounds.append((bound, path))
    best: list[tuple[float, str]] = []
    for bound, path in sorted(bounds, reverse=True):
        if len(best) >= n and bound < best[n - 1][0]:
            break
        matcher.set_seq1(path)
        ratio = matcher.ratio()
        if ratio >= CUTOFF:
            best = sorted([*best, (ratio, path)], reverse=True)
    return [path for _, path in best[:n]]


def similar(key: str, version: str) -> list[str]:
    """Known keys that look like ``key``: the same last name under the same section first, then the closest
    spellings (as ``difflib.get_close_matches``, among :func:`candidates`).

    Spends one step of the current plan's budget per known key compared.
    """
    index = key_index(version)
    leaf = key.rpartition(".")[2]
    same_leaf = list(index.same_leaf.get((key.split(".", 1)[0], leaf), ()))
    near = candidates(key, index)
    budget.spend(len(near))
    return list(dict.fromkeys(same_leaf[:3] + closest(key, near)))[:3]


def _written(ov: Override) -> list[tuple[str, Value]]:
    """The keys an override without ``++`` needs to exist: itself, or each key of a dict value."""
    return ov.leaves() if ov.merges else [(ov.key, ov.value)]


def key_violations(overrides: Sequence[Override], version: str) -> list[Violation]:
    """Overrides that Hydra's struct mode refuses for ``version``'s config (see the module docstring), in
    order: a key an earlier override deleted (``~key``, or a parent of it) is gone for the overrides after it.
    """
    keys = known_keys(version)
    release = source_release(version)
    out: list[Violation] = []
    deleted: dict[str, Override] = {}
    suggesting = MAX_SUGGESTED

    def gone(key: str) -> Override | None:
        parts = key.split(".")
        return next((d for i in range(1, len(parts) + 1) if (d := deleted.get(".".join(parts[:i])))), None)

    for ov in overrides:
        if ov.key.startswith("hydra."):
            continue
        if ov.prefix in ("+", "++"):
            if (
                ov.prefix == "+"
                and ov.key in keys
                and ov.key not in null_keys(version)
                and not gone(ov.key)
                and not isinstance(ov.value, dict | list)
            ):
                out.append(
                    Violation(
                        field=ov.source,
                        rule="override-add-existing",
                        message=f"+{ov.key} adds a key, but verl {release}'s config already has {ov.key} (Hydra refuses it)",
                        suggestions=[f"write {ov.key}={ov.text} (or ++{ov.key}={ov.text})"],
                    )
                )
            for d in [d for d in deleted if d == ov.key or d.startswith(ov.key + ".")]:
                del deleted[d]  # added again
            continue
        written = [ov.key] if ov.key not in keys else [k for k, _ in _written(ov) if k not in keys or gone(k)]
        if ov.prefix == "~" and not written:
            deleted[ov.key] = ov
        for key in written[:1]:
            earlier = gone(key)
            if earlier is not None:
                out.append(
                    Violation(
                        field=ov.source,
                        rule="override-deleted-key",
                        message=f"{key} was deleted by {earlier.source}, so Hydra cannot set or delete it after that",
                        suggestions=[f"drop {shorten(earlier.raw)!r}, or write ++{ov.key}=..."],
                    )
                )
                continue
            similar_keys: list[str] = []
            if suggesting > 0:
                suggesting -= 1
                try:
                    similar_keys = similar(key, version)
                except budget.PlanTooLarge:
                    suggesting = 0  # out of time: the rest are refused without suggestions
            inside = "" if key == ov.key else f" (set by {ov.key}={{...}})"
            out.append(
                Violation(
                    field=ov.source,
                    rule="override-unknown-key",
                    message=f"{key}{inside} is not a key of verl {release}'s ppo_trainer config (Hydra refuses it)",
                    suggestions=[f"use {' or '.join(similar_keys)}" for _ in similar_keys[:1]]
                    + [f"write +{ov.key}=... to add a key verl reads but does not declare"],
                )
            )
    return out
