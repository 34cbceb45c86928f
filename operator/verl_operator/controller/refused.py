"""A child the API server refused for good, told apart from errors a retry can fix (pure: no client)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any


class ChildRefused(RuntimeError):
    """The API server refused a child for good (400 or 422: its schema or an admission plugin; 403 from Pod
    Security); retrying the same manifest cannot succeed."""

    def __init__(self, kind: str, name: str, status: int, message: str) -> None:
        super().__init__(f"the API server refused {kind} {name} ({status}): {message}")
        self.kind, self.name, self.status, self.api_message = kind, name, status, message


#: Statuses of a create that a retry of the same manifest cannot fix.
REFUSED_STATUSES = frozenset({400, 422})
#: The 403 that is about the manifest (Pod Security admission); other 403s (RBAC, an exceeded quota) pass.
POD_SECURITY_REFUSAL = "violates PodSecurity"


def refusal(exc: Any, manifest: Mapping[str, Any]) -> ChildRefused | None:
    """The :class:`ChildRefused` for an ``ApiException`` of a create, or None when it may be retried."""
    status = getattr(exc, "status", None)
    message = str(getattr(exc, "reason", "") or "")
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        message = str(json.loads(exc.body).get("message") or message)
    if status in REFUSED_STATUSES or (status == 403 and POD_SECURITY_REFUSAL in message):
        return ChildRefused(str(manifest["kind"]), str(manifest["metadata"]["name"]), int(status), message)
    return None
