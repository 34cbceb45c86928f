"""The devcluster's exceptions (one module, so that every part can raise them without import cycles)."""

from __future__ import annotations


class DevClusterError(RuntimeError):
    """The devcluster could not be started or used (the message names the component and shows its log)."""


class RealNodeError(RuntimeError):
    """A real-node agent could not be started or the host is not suitable (the message says why)."""
