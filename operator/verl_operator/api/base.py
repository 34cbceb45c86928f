"""The base of every VerlJob API model (spec, status, plan): one configuration for the whole API."""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """Immutable, camelCase on the wire (snake_case accepted too), unknown fields refused."""

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)

    def changed(self, **fields: Any) -> Self:
        """A copy with ``fields`` set, validated as a new object of this model.

        The typed write of a status part (a placement, a plan, a condition, a violation), as
        :class:`~verl_operator.api.status.StatusChange` is of the status: ``model_copy(update=...)`` sets
        whatever it is given, while here a misspelt field or a value of the wrong type raises
        ``ValidationError`` naming it.
        """
        return type(self).model_validate({**dict(self), **fields})

    def to_wire(self) -> dict[str, Any]:
        """The camelCase dict as it appears in YAML, without unset (None) fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
