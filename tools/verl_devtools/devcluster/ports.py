"""Free loopback ports for a devcluster instance (picked at first start, then kept in its state file)."""

from __future__ import annotations

import socket
from collections.abc import Iterable

#: The listening sockets of one instance.
PORT_NAMES: tuple[str, ...] = (
    "etcd_client",
    "etcd_peer",
    "apiserver",
    "controller_manager",
    "scheduler",
    "kwok",
)


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether nothing listens on ``host:port`` (a bind test, with SO_REUSEADDR like the servers use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def pick_free_ports(
    names: Iterable[str], avoid: Iterable[int] = (), host: str = "127.0.0.1"
) -> dict[str, int]:
    """Distinct free ports, one per name, none of them in ``avoid``.

    The kernel hands out an ephemeral port for a bind to port 0; all sockets stay open until every port is
    chosen, so the ports are distinct from each other.

    Args:
        names: One name per port wanted.
        avoid: Ports that must not be returned (e.g. those saved for other instances).
        host: The address the servers will listen on.

    Returns:
        A port per name.
    """
    taken = set(avoid)
    held: list[socket.socket] = []
    ports: dict[str, int] = {}
    try:
        for name in names:
            while True:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.bind((host, 0))
                held.append(sock)
                port = int(sock.getsockname()[1])
                if port not in taken:
                    taken.add(port)
                    ports[name] = port
                    break
    finally:
        for sock in held:
            sock.close()
    return ports


def listening(ports: Iterable[int], host: str = "127.0.0.1") -> list[int]:
    """The ports among ``ports`` that accept a TCP connection on ``host`` right now."""
    open_ports = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            if sock.connect_ex((host, port)) == 0:
                open_ports.append(port)
    return open_ports
