"""An instance's state file (``state.json``): its ports, processes, real-node network and applied profiles.

The file is written atomically (a temporary file renamed over it); a missing or unreadable file reads as an
empty state. Ports are picked at an instance's first start, apart from every other instance's, and kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl_devtools.devcluster import hostchanges
from verl_devtools.devcluster.errors import DevClusterError
from verl_devtools.devcluster.layout import Layout
from verl_devtools.devcluster.nodenet import NodeNetwork, plan_network
from verl_devtools.devcluster.ports import PORT_NAMES, pick_free_ports, port_is_free


def read_state(layout: Layout) -> dict[str, Any]:
    """The saved state (empty when there is none yet)."""
    try:
        data: dict[str, Any] = json.loads(layout.state_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return data


def write_state(layout: Layout, state: dict[str, Any]) -> None:
    """Save the state atomically (creating the instance directory if needed)."""
    layout.base.mkdir(parents=True, exist_ok=True)
    tmp = layout.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    tmp.replace(layout.state_file)


def choose_ports(
    state: dict[str, Any], layout: Layout, name: str, say: Callable[[str], None]
) -> dict[str, int]:
    """The saved ports when they are complete and free, otherwise new ones apart from other instances'."""
    saved: dict[str, int] = state.get("ports", {})
    if set(saved) >= set(PORT_NAMES):
        busy = [f"{k}={p}" for k, p in saved.items() if not port_is_free(p)]
        if not busy:
            return saved
        say(f"saved ports taken by other programs ({', '.join(busy)}): picking new ones")
    return pick_free_ports(PORT_NAMES, avoid=ports_of_other_instances(layout.base.parent, name))


def ports_of_other_instances(devclusters_dir: Path, own: str) -> set[int]:
    """Every port saved by the other instances under ``devclusters_dir``."""
    taken: set[int] = set()
    for state_file in devclusters_dir.glob("*/state.json"):
        if state_file.parent.name == own:
            continue
        try:
            taken.update(int(p) for p in json.loads(state_file.read_text()).get("ports", {}).values())
        except (json.JSONDecodeError, OSError, ValueError):
            continue
    return taken


def saved_network(state: dict[str, Any]) -> NodeNetwork | None:
    """The real-node network saved in the state (None without real nodes)."""
    saved = state.get("network")
    if not saved:
        return None
    return NodeNetwork(**{**saved, "node_ips": tuple(saved["node_ips"])})


def plan_instance_network(
    layout: Layout, name: str, real_nodes: int, state: dict[str, Any]
) -> NodeNetwork | None:
    """The saved network, or a new one (recorded in ``state``) for an instance asked for real nodes.

    Raises:
        DevClusterError: The instance exists without real nodes, or with fewer than ``real_nodes``.
    """
    network = saved_network(read_state(layout))
    if real_nodes and network is None:
        if layout.pki.is_dir():
            raise DevClusterError(
                f"devcluster {name!r} was created without real nodes: "
                f"`verl-operator-dev devcluster down --name {name}` it first"
            )
        network = plan_network(name, real_nodes, hostchanges.networks_in_use())
        state["network"] = {**network.__dict__, "node_ips": list(network.node_ips)}
    elif network is not None and real_nodes > len(network.node_ips):
        raise DevClusterError(
            f"devcluster {name!r} was created with {len(network.node_ips)} real nodes: "
            "`down` it to change the number"
        )
    return network
