"""Every use of kopf's private modules and methods, in one place, with :func:`problems` saying what changed.

kopf (pinned in pyproject.toml to the tested range) exposes no public hook for the two mechanisms below; a
kopf release may move or change them, so each is reached only from here and :func:`problems` checks the
names and signatures they rely on (a unit test fails naming each difference; at run time a mismatch leaves
kopf's own behaviour in place with a warning).

1. ``kopf._cogs.aiokits.aiotoggles.ToggleSet``: the start-up barrier without a wake-up storm (:func:`install`).
2. ``kopf._core.engines.admission``'s errors and ``kopf.WebhookServer``'s private helpers (``_build_ssl``,
   ``_get_accessible_addr``, ``_build_url``): ``controller/webhook_server.py`` serves kopf's admission on a
   thread of its own and answers kopf's errors as kopf's own server does.
3. ``kopf._cogs.clients.api``'s module name ``json``: its watch streams decode each event with ``json.loads``
   (``stream``), the largest single cost of a batch of creations on 1000 nodes (9% of the operator's CPU);
   :func:`install_fast_json` gives that module :func:`verl_operator.controller.rawapi.loads` (orjson) instead.

The start-up barrier: toggle sets notify their waiters when their state flips.

kopf holds every object's handlers until every index is populated: in its watchers each object of an
indexed resource (here nodes, pods, VerlJobs, PriorityClasses) gets a toggle in one ``ToggleSet`` when its
first event arrives and drops it once its index handler ran; every object's worker then waits for the set
to be empty (``kopf/_core/reactor/queueing.py`` ``watcher``, ``processing.py`` ``process_resource_event``,
kopf 1.38-1.45). Each ``make_toggle`` and ``drop_toggle`` calls ``notify_all`` on the set's condition, so
each of n objects wakes every one of the up to n workers already waiting: n squared task wake-ups, each a
trip through the event loop. On 5000 nodes with 3750 pods and 1000 jobs the operator spent over 15 minutes
of a core in them after a restart, reconciling nothing (``docs/benchmarks.md``).

Adding or dropping a toggle changes no toggle's own state, only possibly the set's (``any`` / ``all`` of
its toggles), and the set's waiters wait for the set's state (``ToggleSet.wait_for``). So notifying only
when that state flipped wakes every waiter whose condition became true and no other: the same behaviour,
with O(n) wake-ups in all. :func:`install` replaces the three methods once, and leaves kopf as it is if
its ``ToggleSet`` does not look as expected (a later kopf).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import ssl
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger("verl_operator.kopf")

#: The methods replaced, and the attributes they rely on.
_METHODS = ("make_toggle", "drop_toggle", "drop_toggles")
_ATTRIBUTES = ("_condition", "_toggles", "is_on")


#: The private names used, each with the parameters it must accept (None: only its presence is relied on).
EXPECTED: dict[str, dict[str, tuple[str, ...] | None]] = {
    "kopf._cogs.aiokits.aiotoggles": {
        "ToggleSet": ("fn",),
        "ToggleSet.make_toggle": ("self", "name"),
        "ToggleSet.drop_toggle": ("self", "toggle"),
        "ToggleSet.drop_toggles": ("self", "toggles"),
        "ToggleSet.is_on": ("self",),
        "Toggle": ("name", "condition"),
    },
    "kopf._core.engines.admission": {
        "AmbiguousResourceError": None,
        "UnknownResourceError": None,
        "WebhookError": None,
    },
    "kopf": {
        "WebhookServer._build_ssl": ("self",),
        "WebhookServer._get_accessible_addr": ("addr",),
        "WebhookServer._build_url": ("schema", "host", "port", "path"),
        "WebhookServer.DEFAULT_HOST": None,
    },
    "kopf._cogs.clients.api": {
        "stream": None,
        "json": None,
    },
}


def problems() -> list[str]:
    """What differs in the installed kopf from what this module relies on (empty: nothing)."""
    found: list[str] = []
    for module_name, names in EXPECTED.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            found.append(f"{module_name}: cannot be imported ({exc})")
            continue
        for dotted, params in names.items():
            obj: Any = module
            for part in dotted.split("."):
                if not hasattr(obj, part):
                    found.append(f"{module_name}.{dotted}: missing")
                    break
                obj = getattr(obj, part)
            else:
                if params is not None:
                    have = set(inspect.signature(obj).parameters)
                    missing = [p for p in params if p not in have]
                    if missing:
                        found.append(
                            f"{module_name}.{dotted}: no parameter {', '.join(missing)} (has {sorted(have)})"
                        )
    if not found:
        from kopf._cogs.aiokits import aiotoggles

        probe: Any = aiotoggles.ToggleSet(all)
        found += [f"ToggleSet instance: no attribute {a}" for a in _ATTRIBUTES if not hasattr(probe, a)]
    return found


def toggle_set_class() -> Any:
    """kopf's ``ToggleSet`` (the class :func:`install` changes)."""
    from kopf._cogs.aiokits import aiotoggles

    return aiotoggles.ToggleSet


def admission_errors() -> tuple[type[Exception], type[Exception], type[Exception]]:
    """kopf's admission errors: (ambiguous resource: HTTP 409, unknown resource: 404, other: 400)."""
    from kopf._core.engines import admission

    return admission.AmbiguousResourceError, admission.UnknownResourceError, admission.WebhookError


def server_ssl(server: Any) -> tuple[bytes | None, ssl.SSLContext | None]:
    """kopf's ``WebhookServer._build_ssl``: the CA data to announce and the server's TLS context."""
    built: tuple[bytes | None, ssl.SSLContext | None] = server._build_ssl()
    return built


def server_url(server: Any, schema: str, port: int) -> str:
    """The URL kopf's ``WebhookServer`` announces for ``port`` (its host, address and path rules)."""
    host = server.host or server.DEFAULT_HOST or server._get_accessible_addr(server.addr)
    url: str = server._build_url(schema, host, port, server.path or "")
    return url


def install() -> bool:
    """Make kopf's ``ToggleSet`` notify on state changes only; True when installed (or already)."""
    try:
        from kopf._cogs.aiokits import aiotoggles
    except ImportError:  # pragma: no cover - kopf moved its internals
        log.warning("kopf's toggles not found; its start-up barrier is left as it is")
        return False
    cls: Any = aiotoggles.ToggleSet
    if getattr(cls, "_notifies_on_flips", False):
        return True
    probe = cls(all)
    if not all(hasattr(cls, m) for m in _METHODS) or not all(hasattr(probe, a) for a in _ATTRIBUTES):
        log.warning("kopf's ToggleSet is not as expected; its start-up barrier is left as it is")
        return False

    async def changed(self: Any, change: Callable[[], object]) -> None:
        """Apply ``change`` to the set's toggles; wake the waiters only if the set's state flipped."""
        async with self._condition:
            before = self.is_on()
            change()
            if self.is_on() != before:
                self._condition.notify_all()

    async def make_toggle(self: Any, __val: bool = False, *, name: str | None = None) -> Any:
        toggle = aiotoggles.Toggle(__val, name=name, condition=self._condition)
        await changed(self, lambda: self._toggles.add(toggle))
        return toggle

    async def drop_toggle(self: Any, toggle: Any) -> None:
        await changed(self, lambda: self._toggles.discard(toggle))

    async def drop_toggles(self: Any, toggles: Iterable[Any]) -> None:
        await changed(self, lambda: self._toggles.difference_update(toggles))

    cls.make_toggle, cls.drop_toggle, cls.drop_toggles = make_toggle, drop_toggle, drop_toggles
    cls._notifies_on_flips = True
    return True


class _FastJSON:
    """The ``json`` module as kopf's API client sees it: ``loads`` by orjson (the standard library's for what
    orjson refuses), everything else the standard library's."""

    def __init__(self) -> None:
        from verl_operator.controller.rawapi import loads

        self.loads = loads

    def __getattr__(self, name: str) -> Any:
        import json

        return getattr(json, name)


def install_fast_json() -> bool:
    """Decode kopf's watch events with orjson; True when installed (or already), False when kopf's API
    module no longer reads its JSON through a module name ``json`` (left as it is, with a warning)."""
    try:
        from kopf._cogs.clients import api
    except ImportError:  # pragma: no cover - kopf moved its internals
        log.warning("kopf's API client not found; its watch events are decoded by the standard library")
        return False
    current = getattr(api, "json", None)
    if isinstance(current, _FastJSON):
        return True
    if getattr(current, "loads", None) is None or not hasattr(api, "stream"):
        log.warning(
            "kopf's API client is not as expected; its watch events are decoded by the standard library"
        )
        return False
    setattr(api, "json", _FastJSON())  # noqa: B010  # a module attribute of kopf, replaced on purpose
    return True
