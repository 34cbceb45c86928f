"""What ``DevCluster.status()`` reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_devtools.devcluster.nodes import NodeRow


@dataclass(frozen=True)
class ComponentStatus:
    """A component's pid and whether it runs."""

    name: str
    pid: int | None
    running: bool
    log: Path


@dataclass(frozen=True)
class DevClusterStatus:
    """An instance: its components, its API server and (when it runs) its nodes."""

    name: str
    directory: Path
    running: bool
    server: str | None
    kubeconfig: Path | None
    profiles: tuple[str, ...]
    components: tuple[ComponentStatus, ...]
    nodes: tuple[NodeRow, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly dict."""
        return {
            "name": self.name,
            "directory": str(self.directory),
            "running": self.running,
            "server": self.server,
            "kubeconfig": str(self.kubeconfig) if self.kubeconfig else None,
            "profiles": list(self.profiles),
            "components": [
                {"name": c.name, "pid": c.pid, "running": c.running, "log": str(c.log)}
                for c in self.components
            ],
            "nodes": [n.as_dict() for n in self.nodes],
        }
