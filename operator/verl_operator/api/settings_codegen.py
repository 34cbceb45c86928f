"""The typed views of the settings registry, written as code from its rows.

``planner/_settings_generated.py`` holds three frozen dataclasses that mypy checks like any other code:

- ``Chosen``: one field per row the search decides or keeps (``search="choose"`` / ``"keep"``), the value of
  a candidate layout (``planner.inputs.Settings`` adds the layout's own facts). Its type is the row's kind; a
  row emitted only in some jobs (``batching``, ``critic_only``, ``optional``) may be None and is None unless
  set; a row with a ``verl_default`` takes it unless set (the Megatron sizes are 1 for an FSDP candidate); any
  other is required.
- ``Fixed``: one field per row the search reads as pinned (any ``search``), None unless pinned.
- ``Held``: one field per row the job holds fixed while the search varies the candidate (``held``), the
  base of ``planner.inputs.Problem``: ``held="pin"`` may be None and is None unless set, ``held="value"`` is
  required unless the row has a ``verl_default``. Its type is the row's kind (``paths``: the value as written).
- ``KEPT``: the settings every candidate takes from ``Fixed`` as they are (``search="keep"``).

``api/_plan_generated.py`` holds ``BatchingSettings``, the base of ``api.plan.BatchingPlan``: one field per
row whose plan field is directly under ``batching``, with the row's description (the status schema's) and
the candidate field's type.

``make settings`` writes both modules (``python -m verl_operator.api.settings_codegen planner`` and
``... plan``); a unit test fails when either differs from what the rows give.
"""

from __future__ import annotations

import json
import sys

from verl_operator.api.settings_registry import SETTINGS, Registry, SettingRow

PATH = "operator/verl_operator/planner/_settings_generated.py"
PLAN_PATH = "operator/verl_operator/api/_plan_generated.py"

_TYPES = {"int": "int", "bool": "bool", "float": "float", "str": "str"}


def _type(row: SettingRow) -> str:
    if row.kind not in _TYPES:
        raise ValueError(f"setting {row.name!r}: the search cannot choose a value of kind {row.kind!r}")
    return _TYPES[row.kind]


def _held_type(row: SettingRow) -> str:
    if row.kind == "paths":
        return "Value"  # a list from the spec, a list or one path from an override, as written
    if row.kind not in _TYPES:
        raise ValueError(f"setting {row.name!r}: the job cannot hold a value of kind {row.kind!r}")
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
    if row.unset_in_some_jobs:
        return f"{row.name}: {kind} | None = None"
    if row.verl_default is not None:
        return f"{row.name}: {kind} = {_literal(row.verl_default)}"
    return f"{row.name}: {kind}"


def _held_field(row: SettingRow) -> str:
    kind = _held_type(row)
    if row.held == "pin":
        return f"{row.name}: {kind} | None = None"
    if row.verl_default is not None:
        return f"{row.name}: {kind} = {_literal(row.verl_default)}"
    return f"{row.name}: {kind}"


def render(registry: Registry = SETTINGS) -> str:
    """The module's text for ``registry``'s rows (row order)."""
    chosen = [_chosen_field(row) for row in registry if row.search in ("choose", "keep")]
    kept = [row.name for row in registry if row.search == "keep"]
    fixed = [f"{row.name}: {_type(row)} | None = None" for row in registry if row.search is not None]
    held_rows = [row for row in registry if row.held is not None]
    held = [_held_field(row) for row in held_rows]
    paths = any(row.kind == "paths" for row in held_rows)
    value = ["from verl_operator.planner.overrides import Value", ""] if paths else []
    lines = [
        '"""The planner\'s views of the settings registry: written by ``make settings`` from',
        "``api/settings_registry.py`` (``api/settings_codegen.py``); do not edit (a unit test fails on drift).",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from dataclasses import dataclass",
        "",
        *value,
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
        "",
        "@dataclass(frozen=True, kw_only=True)",
        "class Held:",
        '    """The job\'s settings the search holds fixed (``held`` rows): the base of ``planner.inputs.Problem``."""',
        "",
        *(f"    {line}" for line in held),
        "",
    ]
    return "\n".join(lines)


def _assign(target: str, call: str, args: list[str]) -> list[str]:
    """``target = call(args)`` as ruff formats it at class level (4 spaces in, 110 columns)."""
    one = f"    {target} = {call}({', '.join(args)})"
    if len(one) <= 110:
        return [one]
    if len(args) > 1 and len(inner := f"        {', '.join(args)}") <= 110:
        return [f"    {target} = {call}(", inner, "    )"]
    return [f"    {target} = {call}(", *(f"        {arg}," for arg in args), "    )"]


def render_plan(registry: Registry = SETTINGS) -> str:
    """The plan module's text for ``registry``'s rows (row order): the descriptions as text, so that the
    module imports nothing that a changed row could break (``make settings`` can always run)."""
    fields: list[str] = []
    for name, field in registry.plan_fields("batching").items():
        row = registry[name]
        args = [f"description={_literal(row.description)}"]
        if row.unset_in_some_jobs:
            fields += _assign(f"{field}: {_type(row)} | None", "Field", ["default=None", *args])
        else:
            fields += _assign(f"{field}: {_type(row)}", "Field", args)
    lines = [
        '"""The plan\'s fields that carry a setting as chosen: written by ``make settings`` from',
        "``api/settings_registry.py`` (``api/settings_codegen.py``); do not edit (a unit test fails on drift).",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from pydantic import Field",
        "",
        "from verl_operator.api.base import ApiModel",
        "",
        "",
        "class BatchingSettings(ApiModel):",
        '    """The settings under ``status.plan.batching``, as chosen (rows with a ``batching.`` plan field); their',
        '    descriptions are the rows\'."""',
        "",
        *fields,
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    """``planner``: the planner's module; ``plan``: the plan's."""
    which = sys.argv[1] if len(sys.argv) > 1 else "planner"
    if which not in ("planner", "plan"):
        raise SystemExit(f"usage: python -m verl_operator.api.settings_codegen [planner|plan], not {which!r}")
    sys.stdout.write(render() if which == "planner" else render_plan())


if __name__ == "__main__":
    main()
