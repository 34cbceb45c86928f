"""The base of every VerlJob API model (spec, status, plan): one configuration for the whole API."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """Immutable, camelCase on the wire (snake_case accepted too), unknown fields refused."""

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)

    def to_wire(self) -> dict[str, Any]:
        """The camelCase dict as it appears in YAML, without unset (None) fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
