"""The message of a succeeded job carries the head launcher's outcome (its termination message)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from verl_operator.controller.status import pod_success


def head(message: str | None) -> dict[str, Any]:
    terminated: dict[str, Any] = {"exitCode": 0}
    if message is not None:
        terminated["message"] = message
    return {
        "metadata": {"name": "j-head-0"},
        "status": {"containerStatuses": [{"state": {"terminated": terminated}}]},
    }


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        pytest.param(
            json.dumps({"reason": "Succeeded", "message": "verl finished at step 2 of 2"}),
            "the verl run finished: verl finished at step 2 of 2",
            id="launcher-json",
        ),
        pytest.param("plain text, not JSON", "the verl run finished", id="not-json"),
        pytest.param(json.dumps({"reason": "Succeeded"}), "the verl run finished", id="json-without-message"),
        pytest.param(None, "the verl run finished", id="no-termination-message"),
    ],
)
def test_success_message(message: str | None, expected: str) -> None:
    assert pod_success(head(message)) == expected
