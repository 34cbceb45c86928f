"""Typed access to the pinned inputs: a value of the wrong type or out of its bounds (the settings registry's,
``api/settings_registry.py``) is a violation (collected in ``Reader.violations``), never an exception."""

from __future__ import annotations

import math
from collections.abc import Mapping

from verl_operator.api.limits import DEFAULT_INT_BOUNDS
from verl_operator.api.plan import Violation
from verl_operator.api.settings_registry import SETTINGS, Registry
from verl_operator.planner.overrides import Pinned


class Reader:
    """Typed access to pinned values; a value of the wrong type becomes a violation."""

    def __init__(
        self, pins: Mapping[str, Pinned], reads: Mapping[str, Pinned], registry: Registry = SETTINGS
    ) -> None:
        self.pins = pins
        self.reads = reads
        self.registry = registry
        self._int_bounds = registry.int_bounds()
        self.violations: list[Violation] = []

    def _bad(self, pin: Pinned, want: str) -> None:
        self.violations.append(
            Violation(
                field=pin.source,
                rule="override-type",
                message=f"{pin.value!r} is not {want}",
                suggestions=[f"write {want}"],
            )
        )

    def _out_of_range(self, pin: Pinned, shown: str, lo: str, hi: str) -> None:
        self.violations.append(
            Violation(
                field=pin.source,
                rule="out-of-range",
                message=f"{shown} is outside the supported range {lo} to {hi}",
                suggestions=[f"use a value from {lo} to {hi}"],
            )
        )

    def get_int(self, name: str, reads: bool = False) -> int | None:
        """The pinned integer ``name``, or None; a value past the setting's bounds is a violation."""
        pin = (self.reads if reads else self.pins).get(name)
        if pin is None or pin.value is None:
            return None
        if isinstance(pin.value, bool) or not isinstance(pin.value, int):
            self._bad(pin, "an integer")
            return None
        lo, hi = self._int_bounds.get(name, DEFAULT_INT_BOUNDS)
        if not lo <= pin.value <= hi:
            digits = len(str(abs(pin.value)))
            shown = str(pin.value) if digits <= 20 else f"a {digits}-digit integer"
            self._out_of_range(pin, shown, str(lo), str(hi))
            return None
        return pin.value

    def get_bool(self, name: str, reads: bool = False) -> bool | None:
        pin = (self.reads if reads else self.pins).get(name)
        if pin is None or pin.value is None:
            return None
        if not isinstance(pin.value, bool):
            self._bad(pin, "True or False")
            return None
        return pin.value

    def get_float(self, name: str) -> float | None:
        """The pinned number ``name`` within the setting's bounds, or None (a value outside is a violation)."""
        bounds = self.registry[name].bounds
        assert bounds is not None and bounds.low_exclusive, f"{name}: a number needs bounds (low exclusive)"
        low, high = bounds.low, bounds.high
        pin = self.pins.get(name)
        if pin is None or pin.value is None:
            return None
        if isinstance(pin.value, bool) or not isinstance(pin.value, int | float):
            self._bad(pin, "a number")
            return None
        value = pin.value
        if not (isinstance(value, int) or math.isfinite(value)) or not low < value <= high:
            shown = repr(value) if len(repr(value)) <= 20 else f"a {len(str(value))}-digit number"
            self._out_of_range(pin, shown, f"{low} (exclusive)", str(high))
            return None
        return float(value)

    def get_str(self, name: str, reads: bool = False) -> str | None:
        """The pinned value ``name`` as text, or None; a list or dict value is a violation."""
        pin = (self.reads if reads else self.pins).get(name)
        if pin is None or pin.value is None:
            return None
        if isinstance(pin.value, list | dict):
            self._bad(pin, "a string")
            return None
        return str(pin.value)

    def get_strings(self, name: str, reads: bool = False) -> tuple[str, ...] | None:
        """The pinned list of names ``name``, or None; anything but a list of strings is a violation."""
        pin = (self.reads if reads else self.pins).get(name)
        if pin is None or pin.value is None:
            return None
        if not isinstance(pin.value, list) or not all(isinstance(v, str) for v in pin.value):
            self._bad(pin, "a list of names")
            return None
        return tuple(str(v) for v in pin.value)

    def check_paths(self, name: str) -> None:
        """A pinned ``name`` (``train_files``, ``val_files``) is a path or a list of paths."""
        pin = self.pins.get(name)
        if pin is None or pin.value is None:
            return
        value = pin.value
        if isinstance(value, dict) or (
            isinstance(value, list) and any(isinstance(v, list | dict) for v in value)
        ):
            self._bad(pin, "a path or a list of paths")
