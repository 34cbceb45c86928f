"""One change to a job's spec, and the planner's answer for the changed spec (pure).

A change names a setting of the settings registry (or a spec path) and its new value. Applied, it sets the
setting's spec field when it has one, else appends ``key=value`` to ``spec.overrides``; either way every
override that pinned the setting before is taken out, so the changed spec pins exactly the new value. The
planner (``planner.plan_job``) then judges the changed spec on the same nodes as admission does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_operator.api.plan import PlanResult
from verl_operator.api.settings_registry import SETTINGS
from verl_operator.api.spec import VerlJobSpec
from verl_operator.planner import NodeFacts, plan_job

Nodes = Sequence[Mapping[str, Any] | NodeFacts]


@dataclass(frozen=True)
class Change:
    """One setting and its new value.

    Attributes:
        setting: A registry setting (``rollout_tp``), a spec path (``spec.resources.gpus``) or a verl key
            the registry does not hold (passed as an override).
        value: The new value (a dict for a spec object is merged into it).
    """

    setting: str
    value: Any

    @property
    def shown(self) -> str:
        """The name a user sets: the spec path, else the verl override key."""
        if self.setting in SETTINGS:
            row = SETTINGS[self.setting]
            return row.spec_path or (row.keys[0] if row.keys else self.setting)
        return self.setting


def _key(raw: str) -> str:
    return raw.lstrip("+~").split("=", 1)[0].strip()


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) and not value.isidentifier() else str(value)


def apply_change(spec: VerlJobSpec, change: Change) -> VerlJobSpec:
    """The spec with ``change`` applied (see the module's docstring).

    Raises:
        pydantic.ValidationError: the changed spec is out of the fields' bounds.
    """
    wire = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    keys: tuple[str, ...] = ()
    path: str | None = None
    if change.setting in SETTINGS:
        row = SETTINGS[change.setting]
        keys = row.keys
        path = row.spec
    elif change.setting.startswith("spec."):
        path = change.setting[len("spec.") :]
    else:
        keys = (change.setting,)
    overrides = [o for o in wire.get("overrides", []) if _key(o) not in keys]
    if path is not None:
        node = wire
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        if isinstance(change.value, dict) and isinstance(node.get(leaf), dict):
            node[leaf] = {**node[leaf], **change.value}
        else:
            node[leaf] = change.value
    else:
        overrides.append(f"{keys[0]}={_literal(change.value)}")
    wire["overrides"] = overrides
    return VerlJobSpec.model_validate(wire)


def replan(spec: VerlJobSpec, nodes: Nodes, change: Change) -> PlanResult:
    """The planner's result for ``spec`` with ``change`` applied, on ``nodes``."""
    return plan_job(apply_change(spec, change), nodes)
