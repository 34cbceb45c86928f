"""Command lines of the control-plane components: loopback only, the security settings the issue requires."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_devtools.devcluster.layout import COMPONENTS, Layout, component_argv
from verl_devtools.devcluster.ports import PORT_NAMES

PORTS = {name: 20000 + i for i, name in enumerate(PORT_NAMES)}
LAYOUT = Layout(Path("/tmp/dc"))


def argv(component: str) -> list[str]:
    return component_argv(component, Path(f"/bin/{component}"), LAYOUT, PORTS, "t")


def flags(component: str) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in argv(component)[1:])


@pytest.mark.parametrize("component", COMPONENTS)
def test_every_component_listens_on_loopback_only(component: str) -> None:
    line = " ".join(argv(component))
    assert "0.0.0.0" not in line
    addresses = [a for a in argv(component) if "address=" in a or "-urls=" in a]
    assert addresses
    for arg in addresses:
        value = arg.split("=", 1)[1]
        assert value.startswith(("127.0.0.1", "http://127.0.0.1")), arg


@pytest.mark.parametrize(
    ("component", "flag", "value"),
    [
        pytest.param("kube-apiserver", "authorization-mode", "Node,RBAC", id="rbac"),
        pytest.param("kube-apiserver", "secure-port", str(PORTS["apiserver"]), id="apiserver-port"),
        pytest.param("kube-apiserver", "etcd-servers", f"http://127.0.0.1:{PORTS['etcd_client']}", id="etcd"),
        pytest.param(
            "kube-apiserver", "service-account-signing-key-file", "/tmp/dc/pki/sa.key", id="sa-signing"
        ),
        pytest.param("kube-apiserver", "service-account-key-file", "/tmp/dc/pki/sa.pub", id="sa-verify"),
        pytest.param("kube-controller-manager", "use-service-account-credentials", "true", id="kcm-sa-creds"),
        pytest.param("kube-controller-manager", "root-ca-file", "/tmp/dc/pki/ca.crt", id="kcm-root-ca"),
        pytest.param(
            "kube-controller-manager", "secure-port", str(PORTS["controller_manager"]), id="kcm-port"
        ),
        pytest.param("kube-scheduler", "secure-port", str(PORTS["scheduler"]), id="scheduler-port"),
        pytest.param("kwok", "manage-all-nodes", "false", id="kwok-not-all-nodes"),
        pytest.param(
            "kwok", "manage-nodes-with-annotation-selector", "kwok.x-k8s.io/node=fake", id="kwok-selector"
        ),
        pytest.param("kwok", "server-address", f"127.0.0.1:{PORTS['kwok']}", id="kwok-port"),
    ],
)
def test_component_flags(component: str, flag: str, value: str) -> None:
    assert flags(component)[flag] == value


def test_controller_manager_runs_the_lifecycle_controllers() -> None:
    controllers = set(flags("kube-controller-manager")["controllers"].split(","))
    assert {
        "garbage-collector-controller",
        "namespace-controller",
        "serviceaccount-controller",
        "serviceaccount-token-controller",
        "root-ca-certificate-publisher-controller",
    } <= controllers


def test_unknown_component() -> None:
    with pytest.raises(KeyError):
        argv("kubelet")
