"""Free loopback ports for a devcluster instance (picked at first start, then kept in its state file)."""

from __future__ import annotations

import socket
import ssl
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


#: What a server's log says when its port was taken between the pick and its bind (Python's and Go's errno text).
ADDRESS_IN_USE = "address already in use"


class PortTaken(RuntimeError):
    """A port picked for a server was taken by another program before the server bound it (a lost race)."""


def serves_certificate(
    port: int, cert_pem: bytes, host: str = "127.0.0.1", timeout: float = 1.0
) -> bool | None:
    """Whether the listener on ``host:port`` is the server holding ``cert_pem``.

    A port picked free and bound later can be taken in between by another program; a server that lost that race
    exits (its bind fails) while the other program answers on the port. Comparing the certificate presented in
    the TLS handshake with the server's own tells the two apart before anything is sent to the port.

    Returns:
        True: the listener presents this certificate. False: another listener answers (another certificate, or
        not TLS at all: "first record does not look like a TLS handshake"). None: nothing listens yet.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # identity is checked below, by comparing the certificate itself
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return None
    with sock:
        try:
            with context.wrap_socket(sock) as tls:
                presented = tls.getpeercert(binary_form=True)
        except (ssl.SSLError, OSError):
            return False
    end = "-----END CERTIFICATE-----"
    first = cert_pem.decode("ascii").split(end)[0].strip() + "\n" + end  # the leaf, of a file with its chain
    return presented == ssl.PEM_cert_to_DER_cert(first)
