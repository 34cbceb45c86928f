"""The pure parts of the real-node tier: its addresses, the agents' configuration, the OCI archive writer."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import yaml

from verl_devtools.devcluster import nodeconfig, oci
from verl_devtools.devcluster.layout import Layout, component_argv
from verl_devtools.devcluster.nodenet import NetworkError, choose_range, plan_network

PORTS = {
    "etcd_client": 1,
    "etcd_peer": 2,
    "apiserver": 3,
    "controller_manager": 4,
    "scheduler": 5,
    "kwok": 6,
}


@pytest.mark.parametrize(
    ("in_use", "chosen"),
    [
        pytest.param(["127.0.0.1/8"], "192.0.2.0/24", id="test-net-1-when-free"),
        pytest.param(["127.0.0.1/8", "192.0.2.2/24"], "198.51.100.0/24", id="machine-on-test-net-1"),
        pytest.param(["192.0.2.2/24", "198.51.100.7/32"], "203.0.113.0/24", id="two-in-use"),
        pytest.param(["0.0.0.0/0", "10.0.0.5/8"], "192.0.2.0/24", id="default-route-is-no-overlap"),
    ],
)
def test_the_first_free_documentation_range_is_chosen(in_use: list[str], chosen: str) -> None:
    assert str(choose_range(in_use)) == chosen


def test_no_free_range_is_an_error_naming_the_ranges() -> None:
    with pytest.raises(NetworkError, match=r"192\.0\.2\.0/24, 198\.51\.100\.0/24, 203\.0\.113\.0/24"):
        choose_range(["192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"])


def test_the_pod_range_must_be_free() -> None:
    with pytest.raises(NetworkError, match=r"10\.245\.0\.0/16 overlaps 10\.245\.3\.0/24"):
        plan_network("x", 2, ["10.245.3.0/24"])


def test_network_plan() -> None:
    net = plan_network("pytest-node-1", 3, ["192.0.2.2/24"])
    assert (net.api_ip, net.dns_ip) == ("198.51.100.1", "198.51.100.1")
    assert net.node_ips == ("198.51.100.11", "198.51.100.12", "198.51.100.13")
    assert net.gateway == "10.245.0.1" and net.kubernetes_service_ip == "10.97.0.1"
    # Link names fit the kernel's 15 characters and differ per instance.
    assert len(net.bridge) <= 15 and len(net.address_link) <= 15
    assert plan_network("other", 2, []).bridge != net.bridge


def node(tmp_path: Path, index: int) -> nodeconfig.RealNode:
    return nodeconfig.RealNode(
        index=index,
        name=f"real-{index}",
        ip=f"198.51.100.{11 + index}",
        directory=tmp_path / "inst" / "nodes" / f"real-{index}",
        kubelet_port=20000 + index,
        healthz_port=21000 + index,
    )


def test_each_kubelet_has_its_own_ports_root_and_cgroup(tmp_path: Path) -> None:
    net = plan_network("inst", 2, ["192.0.2.2/24"])
    configs = [
        yaml.safe_load(nodeconfig.kubelet_config(node(tmp_path, i), net, tmp_path / "pki", tmp_path / "r"))
        for i in range(2)
    ]
    for key in ("port", "healthzPort", "address", "cgroupRoot", "containerRuntimeEndpoint", "podLogsDir"):
        assert configs[0][key] != configs[1][key], key
    for index, config in enumerate(configs):
        assert config["registerWithTaints"] == [nodeconfig.REAL_NODE_TAINT]
        assert config["authentication"]["anonymous"]["enabled"] is False
        assert config["readOnlyPort"] == 0 and config["healthzBindAddress"] == "127.0.0.1"
        assert config["clusterDNS"] == [net.dns_ip]
        assert config["cgroupRoot"] == f"/verl-devcluster-inst-real-{index}"


def test_containerd_config_keeps_everything_under_the_nodes_directory(tmp_path: Path) -> None:
    text = nodeconfig.containerd_config(node(tmp_path, 0), tmp_path / "net.d", "localhost/pause:1")
    assert "restrict_oom_score_adj = true" in text
    assert "SystemdCgroup = false" in text
    assert 'sandbox_image = "localhost/pause:1"' in text
    base = str(node(tmp_path, 0).containerd_dir)
    for key in ("root", "state", "address"):
        values = [
            line.split("=", 1)[1].strip().strip('"')
            for line in text.splitlines()
            if line.strip().startswith(f"{key} =")
        ]
        assert values and all(v == "" or v.startswith(base) for v in values), (key, values)


def test_kube_proxy_serves_node_ports_only_on_the_node_addresses(tmp_path: Path) -> None:
    net = plan_network("inst", 2, ["192.0.2.2/24"])
    config = yaml.safe_load(
        nodeconfig.kube_proxy_config(
            net, tmp_path / "kp", "real-0", {"kube_proxy_healthz": 1, "kube_proxy_metrics": 2}
        )
    )
    assert config["nodePortAddresses"] == ["198.51.100.11/32", "198.51.100.12/32"]
    assert config["iptables"]["localhostNodePorts"] is False
    assert config["conntrack"]["maxPerCore"] == 0
    assert config["healthzBindAddress"].startswith("127.0.0.1:")
    # A taken healthz or metrics port ends kube-proxy (the devcluster then starts it on new ports).
    assert config["bindAddressHardFail"] is True


def test_cni_network_uses_the_tiers_bridge_and_pod_range(tmp_path: Path) -> None:
    net = plan_network("inst", 2, [])
    [bridge] = json.loads(nodeconfig.cni_conflist(net, tmp_path / "ipam"))["plugins"]
    assert bridge["bridge"] == net.bridge and bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.245.0.0/16", "gateway": "10.245.0.1"}]]


def test_apiserver_listens_on_the_bridge_address_with_real_nodes(tmp_path: Path) -> None:
    net = plan_network("inst", 2, ["192.0.2.2/24"])
    layout = Layout(tmp_path)
    real = component_argv("kube-apiserver", Path("/bin/kube-apiserver"), layout, PORTS, "inst", net)
    plain = component_argv("kube-apiserver", Path("/bin/kube-apiserver"), layout, PORTS, "inst")
    assert "--bind-address=198.51.100.1" in real and "--advertise-address=198.51.100.1" in real
    assert "--service-cluster-ip-range=10.97.0.0/16" in real and "--endpoint-reconciler-type=lease" in real
    assert "--bind-address=127.0.0.1" in plain and "--endpoint-reconciler-type=none" in plain
    manager = component_argv("kube-controller-manager", Path("/bin/kcm"), layout, PORTS, "inst", net)
    assert "daemonset-controller" in next(a for a in manager if a.startswith("--controllers="))


def test_oci_archive_is_importable_layout_and_deterministic(tmp_path: Path) -> None:
    layer = tmp_path / "layer.tar"
    with tarfile.open(layer, "w") as archive:
        (tmp_path / "hello").write_text("hi\n")
        archive.add(tmp_path / "hello", arcname="hello")
    config = oci.ImageConfig(entrypoint=("/hello",), user="65532:65532")
    first = oci.write_archive(tmp_path / "a.tar", [layer], config, "localhost/x:1")
    second = oci.write_archive(tmp_path / "b.tar", [layer], config, "localhost/x:1")
    assert first == second
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    with tarfile.open(tmp_path / "a.tar") as archive:
        names = archive.getnames()
        index = json.loads(archive.extractfile("index.json").read())  # type: ignore[union-attr]
        manifest = json.loads(archive.extractfile(f"blobs/sha256/{first.split(':')[1]}").read())  # type: ignore[union-attr]
    assert names[:2] == ["oci-layout", "index.json"]
    assert index["manifests"][0]["annotations"][oci.CONTAINERD_NAME] == "localhost/x:1"
    assert manifest["layers"][0]["digest"] == oci.file_digest(layer)
    assert f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}" in names
