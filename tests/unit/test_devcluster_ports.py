"""Port picking for devcluster instances."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_devtools.devcluster.ports import (
    PORT_NAMES,
    listening,
    pick_free_ports,
    port_is_free,
    serves_certificate,
)
from verl_operator.controller.webhook import write_self_signed


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_one_distinct_free_port_per_component() -> None:
    ports = pick_free_ports(PORT_NAMES)
    assert list(ports) == list(PORT_NAMES)
    assert len(set(ports.values())) == len(PORT_NAMES)
    assert all(port_is_free(p) for p in ports.values())


def test_a_listening_port_is_neither_free_nor_picked(listener: int) -> None:
    assert not port_is_free(listener)
    assert listening([listener]) == [listener]
    assert listener not in pick_free_ports(PORT_NAMES).values()


def test_a_closed_port_is_not_listening() -> None:
    (port,) = pick_free_ports(["x"]).values()
    assert listening([port]) == []


@settings(max_examples=20, deadline=None)
@given(st.sets(st.integers(1024, 65535), max_size=200))
def test_avoided_ports_are_never_returned(avoid: set[int]) -> None:
    """Ports saved by other instances (which may be stopped right now) are not handed out again."""
    assert not set(pick_free_ports(PORT_NAMES, avoid=avoid).values()) & avoid


def tls_server(cert: Path, key: Path) -> tuple[int, socket.socket, threading.Thread]:
    """A TLS listener on a port of its own (bound to port 0, the port read back) that answers one handshake."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()

    def serve() -> None:
        conn, _ = sock.accept()
        with contextlib.suppress(OSError), context.wrap_socket(conn, server_side=True) as tls:
            tls.recv(1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return int(sock.getsockname()[1]), sock, thread


def test_a_listener_is_told_apart_by_its_certificate(tmp_path: Path, listener: int) -> None:
    own_cert, own_key = write_self_signed(tmp_path / "own", ["127.0.0.1"])
    other_cert, _ = write_self_signed(tmp_path / "other", ["127.0.0.1"])
    port, sock, thread = tls_server(own_cert, own_key)
    with sock:
        assert serves_certificate(port, own_cert.read_bytes()) is True
        thread.join(5)
    port, sock, thread = tls_server(own_cert, own_key)
    with sock:
        assert serves_certificate(port, other_cert.read_bytes()) is False  # another server's certificate
        thread.join(5)
    # A plain TCP listener (the foreign one of "first record does not look like a TLS handshake").
    assert serves_certificate(listener, own_cert.read_bytes(), timeout=0.5) is False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as closed:
        closed.bind(("127.0.0.1", 0))
        nothing = int(closed.getsockname()[1])  # bound, not listening: connections are refused
        assert serves_certificate(nothing, own_cert.read_bytes()) is None
