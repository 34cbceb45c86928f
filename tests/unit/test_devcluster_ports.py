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

from verl_devtools.devcluster.errors import RealNodeError
from verl_devtools.devcluster.ports import (
    PORT_NAMES,
    listening,
    pick_free_ports,
    port_is_free,
    serves_certificate,
)
from verl_devtools.devcluster.realnodes import HOST_AGENT_PORTS, retry_on_taken_ports
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


class _Server:
    """What an agent does with its port: bind it, or exit with Go's bind error when another program holds it."""

    def __init__(self, node_ports: dict[str, int], key: str, fail_with: str | None = None) -> None:
        self.node_ports, self.key, self.fail_with = node_ports, key, fail_with
        self.bound: list[socket.socket] = []
        self.starts = 0

    def __call__(self) -> None:
        self.starts += 1
        if self.fail_with is not None:
            raise RealNodeError(f"kubelet of real-0 exited during start; last lines:\n{self.fail_with}")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        port = self.node_ports[self.key]
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            sock.close()
            raise RealNodeError(
                f"kubelet of real-0 exited during start; last lines:\n"
                f'E1206 "Failed to listen and serve" err="listen tcp 127.0.0.1:{port}: bind: {exc.strerror}"'
            ) from exc
        sock.listen()
        self.bound.append(sock)


KUBELET_KEYS = ["real-0_kubelet", "real-0_healthz"]


def test_a_kubelet_whose_port_was_taken_starts_again_on_new_ports() -> None:
    node_ports = pick_free_ports([*KUBELET_KEYS, "dns_ready"])
    before = dict(node_ports)
    saved: list[dict[str, int]] = []
    server = _Server(node_ports, "real-0_kubelet")
    with socket.socket(
        socket.AF_INET, socket.SOCK_STREAM
    ) as other:  # another program took the kubelet's port
        other.bind(("127.0.0.1", before["real-0_kubelet"]))
        other.listen()
        retry_on_taken_ports(
            server, node_ports, KUBELET_KEYS, avoid={1}, save=lambda: saved.append(dict(node_ports))
        )
    try:
        assert server.starts == 2 and len(server.bound) == 1
        assert server.bound[0].getsockname()[1] == node_ports["real-0_kubelet"] != before["real-0_kubelet"]
        assert node_ports["real-0_healthz"] != before["real-0_healthz"]
        assert node_ports["dns_ready"] == before["dns_ready"]  # the other agents keep theirs
        assert saved == [node_ports]  # the new ports are in the state before the second start
    finally:
        for sock in server.bound:
            sock.close()


@pytest.mark.parametrize("agent", sorted(HOST_AGENT_PORTS))
@pytest.mark.parametrize("taken", [0, 1], ids=["first-port", "second-port"])
def test_kube_proxy_or_coredns_whose_port_was_taken_starts_again_on_new_ports(agent: str, taken: int) -> None:
    """kube-proxy (healthz, metrics) and CoreDNS (health, ready) bind ports picked earlier: one taken in
    between is picked anew with its agent's others, and the kubelets' ports stay as they are."""
    keys = HOST_AGENT_PORTS[agent]
    node_ports = pick_free_ports([*KUBELET_KEYS, *(k for ks in HOST_AGENT_PORTS.values() for k in ks)])
    before = dict(node_ports)
    server = _Server(node_ports, keys[taken])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("127.0.0.1", before[keys[taken]]))
        other.listen()
        retry_on_taken_ports(server, node_ports, keys, avoid=set(), save=lambda: None)
    try:
        assert server.starts == 2
        assert server.bound[0].getsockname()[1] == node_ports[keys[taken]] != before[keys[taken]]
        assert all(node_ports[k] != before[k] for k in keys)
        assert {k: node_ports[k] for k in node_ports if k not in keys} == {
            k: before[k] for k in before if k not in keys
        }
    finally:
        for sock in server.bound:
            sock.close()


@pytest.mark.parametrize(
    ("failure", "starts"),
    [
        pytest.param("listen tcp 127.0.0.1:1: bind: address already in use", 3, id="taken-at-every-try"),
        pytest.param("failed to run Kubelet: unable to load bootstrap kubeconfig", 1, id="another-failure"),
    ],
)
def test_a_kubelet_failure_is_raised_after_the_tries_or_at_once(failure: str, starts: int) -> None:
    node_ports = pick_free_ports(KUBELET_KEYS)
    server = _Server(node_ports, "real-0_kubelet", fail_with=failure)
    with pytest.raises(RealNodeError, match=failure.split(":")[0]):
        retry_on_taken_ports(server, node_ports, KUBELET_KEYS, avoid=set(), save=lambda: None)
    assert server.starts == starts
