"""kopf's start-up barrier (``controller/kopf_private.py``) on kopf's own ``ToggleSet``: the waiters are released
exactly when the set's state flips, with a notification per flip instead of one per toggle."""

from __future__ import annotations

import asyncio
import importlib.metadata
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from verl_operator.controller import kopf_private

ToggleSet = kopf_private.toggle_set_class()
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_installed_kopf_is_in_the_pinned_range_with_an_upper_bound() -> None:
    (line,) = [
        d for d in tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"] if d.startswith("kopf")
    ]
    requirement = Requirement(line)
    assert any(spec.operator in ("<", "<=", "==", "~=") for spec in requirement.specifier), line
    assert requirement.specifier.contains(importlib.metadata.version("kopf")), line


def test_kopf_has_every_private_name_and_signature_relied_on() -> None:
    assert kopf_private.problems() == [], "kopf changed:\n" + "\n".join(kopf_private.problems())


def test_a_changed_kopf_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import kopf
    from kopf._core.engines import admission

    monkeypatch.delattr(admission, "UnknownResourceError")
    monkeypatch.setattr(kopf.WebhookServer, "_build_url", staticmethod(lambda schema, host, port: ""))
    assert kopf_private.problems() == [
        "kopf._core.engines.admission.UnknownResourceError: missing",
        "kopf.WebhookServer._build_url: no parameter path (has ['host', 'port', 'schema'])",
    ]


def _count_notifies(toggles: Any) -> list[int]:
    calls = [0]
    notify_all = toggles._condition.notify_all

    def counted() -> None:
        calls[0] += 1
        notify_all()

    toggles._condition.notify_all = counted
    return calls


def test_the_barrier_opens_when_the_last_object_is_indexed_with_two_notifications() -> None:
    assert kopf_private.install() and kopf_private.install()  # once; a second call changes nothing

    async def main() -> tuple[int, int, list[bool]]:
        barrier = ToggleSet(all)  # kopf's operator_indexed: on when empty, off while any toggle is in it
        notified = _count_notifies(barrier)
        objects = [await barrier.make_toggle(name=f"o{i}") for i in range(300)]
        released: list[bool] = []

        async def worker() -> None:
            await barrier.wait_for(True)
            released.append(True)

        workers = [asyncio.create_task(worker()) for _ in range(300)]
        await asyncio.sleep(0)
        for toggle in objects[:-1]:
            await barrier.drop_toggle(toggle)
        await asyncio.sleep(0.01)
        early = len(released)
        await barrier.drop_toggles(objects[-1:])
        await asyncio.wait_for(asyncio.gather(*workers), 5)
        return notified[0], early, released

    notified, early, released = asyncio.run(main())
    assert early == 0, "no worker runs while an object is not indexed"
    assert len(released) == 300
    assert notified == 2  # empty -> off at the first toggle, off -> on at the last drop (was 600)


def test_an_any_set_still_wakes_on_each_flip() -> None:
    kopf_private.install()

    async def main() -> list[str]:
        paused = ToggleSet(any)  # kopf's operator_paused: on while any toggle is on
        seen: list[str] = []
        on = await paused.make_toggle(True, name="peer")
        assert paused.is_on()

        async def resumed() -> None:
            await paused.wait_for(False)
            seen.append("resumed")

        task = asyncio.create_task(resumed())
        await asyncio.sleep(0)
        await paused.make_toggle(False, name="other")  # no flip: still paused
        await asyncio.sleep(0.01)
        seen.append("still paused")
        await paused.drop_toggle(on)  # flips off
        await asyncio.wait_for(task, 5)
        return seen

    assert asyncio.run(main()) == ["still paused", "resumed"]
