"""The planner's typed views of the settings registry, written as code from its rows.

``planner/_settings_generated.py`` holds two frozen dataclasses that mypy checks like any other code:

- ``Chosen``: one field per row the search decides or keeps (``search="choose"`` / ``"keep"``), the value of
  a candidate layout (``planner.inputs.Settings`` adds the layout's own facts). Its type is the row's kind; a
  row emitted only in some jobs (``batching``, ``critic_only``, ``optional``) may be None and is None unless
  set; a row with a ``verl_default`` takes it unless set (the Megatron sizes are 1 for an FSDP candidate); any
  other is required.
- ``Fixed``: one field per row the search reads as pinned (any ``search``), None unless pinned.
- ``KEPT``: the settings every candidate takes from ``Fixed`` as they are (``search="keep"``).

``make settings`` writes the module (``python -m verl_operator.api.settings_codegen``); a unit test fails
when it differs from what the rows give.
"""

from __future__ import annotations

import json
import sys

from verl_operator.api.settings_registry import SETTINGS, Registry, SettingRow

PATH = "operator/verl_operator/planner/_settings_generated.py"

_TYPES = {"int": "int", "bool": "bool", "float": "float", "str": "str"}


def _type(row: SettingRow) -> str:
    if row.kind not in _TYPES:
        raise ValueError(f"setting {row.name!r}: the search cannot choose a value of kind {row.kind!r}")
    return _TYPES[row.kind]


def _literal(value: object) -> str:
    """``value`` as ruff formats it (strings in double quotes)."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _tuple(target: str, names: list[str]) -> list[str]:
    """``target = (names)`` as ruff formats it: one name per line after the first."""
    if len(names) < 2:
        return [f"{target} = ({''.join(f'{_literal(n)},' for n in names)})"]
    return [f"{target} = (", *(f"    {_literal(n)}," for n in names), ")"]


def _chosen_field(row: SettingRow) -> str:
    kind = _type(row)
    if row.batching is not None or row.critic_only or row.optional:
        return f"{row.name}: {kind} | None = None"
    if row.verl_default is not None:
        return f"{row.name}: {kind} = {_literal(row.verl_default)}"
    return f"{row.name}: {kind}"


def render(registry: Registry = SETTINGS) -> str:
    """The module's text for ``registry``'s rows (row order)."""
    chosen = [_chosen_field(row) for row in registry if row.search in ("choose", "keep")]
    kept = [row.name for row in registry if row.search == "keep"]
    fixed = [f"{row.name}: {_type(row)} | None = None" for row in registry if row.search is not None]
    lines = [
        '"""The planner\'s views of the settings registry: written by ``make settings`` from',
        "``api/settings_registry.py`` (``api/settings_codegen.py``); do not edit (a unit test fails on drift).",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from dataclasses import dataclass",
        "",
        '#: The settings every candidate keeps as pinned (``search="keep"``).',
        *_tuple("KEPT: tuple[str, ...]", kept),
        "",
        "",
        "@dataclass(frozen=True, kw_only=True)",
        "class Chosen:",
        '    """The settings of one candidate: chosen by the search or kept as pinned (``search`` rows)."""',
        "",
        *(f"    {line}" for line in chosen),
        "",
        "",
        "@dataclass(frozen=True)",
        "class Fixed:",
        '    """The pinned values with their types checked, None: the planner decides (``search`` rows)."""',
        "",
        *(f"    {line}" for line in fixed),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
