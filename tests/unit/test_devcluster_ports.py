"""Port picking for devcluster instances."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_devtools.devcluster.ports import PORT_NAMES, listening, pick_free_ports, port_is_free


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
