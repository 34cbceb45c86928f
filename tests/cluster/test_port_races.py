"""A port picked free and bound later can be taken in between by another program (the flake of a webhook at
127.0.0.1:<port> answered by something else: "tls: first record does not look like a TLS handshake"). Each
test here takes the first port picked for a server with a plain TCP listener of its own, as that other
program would, and checks that the server ends up on new ports of its own, where nothing else can answer."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from verl_devtools.devcluster import DevCluster, cluster, localrun
from verl_devtools.devcluster.localrun import LocalOperator, install_crd
from verl_devtools.devcluster.ports import listening, serves_certificate

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def foreign() -> Iterator[int]:
    """A port held by a plain TCP listener (another program's)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_an_operator_whose_webhook_port_was_taken_serves_on_new_ports(
    devcluster: DevCluster,
    kube: client.ApiClient,
    tmp_path: Path,
    foreign: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install_crd(devcluster.kubeconfig)
    picked: list[dict[str, int]] = []
    real_pick = localrun.pick_free_ports

    def pick(names: Iterable[str]) -> dict[str, int]:
        ports = real_pick(names)
        picked.append(ports)
        return {**ports, "webhook": foreign} if len(picked) == 1 else ports

    monkeypatch.setattr(localrun, "pick_free_ports", pick)
    name = "race.verl-operator.io"
    operator = LocalOperator(devcluster.kubeconfig, tmp_path / "operator", webhook_name=name)
    try:
        operator.start()
        assert len(picked) == 2 and operator.webhook_port not in (foreign, picked[0]["webhook"])
        assert serves_certificate(operator.webhook_port, operator.ca_path.read_bytes()) is True
        assert serves_certificate(foreign, operator.ca_path.read_bytes(), timeout=0.5) is False
        config = client.AdmissionregistrationV1Api(kube).read_validating_webhook_configuration(name)
        assert all(f":{operator.webhook_port}/" in w.client_config.url for w in config.webhooks)
    finally:
        operator.stop()


def test_a_control_plane_whose_api_port_was_taken_starts_on_new_ports(
    foreign: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_choose = cluster.choose_ports

    def choose(*args: object, **kwargs: object) -> dict[str, int]:
        return {**real_choose(*args, **kwargs), "apiserver": foreign}  # type: ignore[arg-type]

    monkeypatch.setattr(cluster, "choose_ports", choose)
    said: list[str] = []
    instance = DevCluster(name=f"pytest-{os.getpid()}-race", profile="dgx-h100", progress=said.append)
    try:
        instance.up()
        ports = instance.ports()
        assert ports["apiserver"] != foreign
        assert listening([ports["apiserver"]]) == [ports["apiserver"]]
        with instance.api_client() as api:
            assert client.CoreV1Api(api).list_node().items
        assert any("a port was taken before it was bound" in line for line in said), said
    finally:
        instance.down()
