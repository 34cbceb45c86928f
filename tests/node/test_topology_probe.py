"""The chart's topology-probe DaemonSet on the real nodes: the DaemonSet controller creates a pod per node,
the probe runs nvidia-smi in a real container and labels its node through the API server (via the
``kubernetes`` Service and kube-proxy), and the pause container keeps the pod."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from cluster.polling import wait_for
from node.conftest import CHART, OPERATOR_NAMESPACE, RELEASE, Run
from verl_devtools.devcluster import projectimages
from verl_devtools.devcluster.nodeconfig import REAL_NODE_LABEL, REAL_NODE_TAINT
from verl_operator.clusters import labels as L

REAL_NODES = ("real-0", "real-1")


def probe_values(image: str, enabled: bool) -> list[str]:
    repository, tag = image.rsplit(":", 1)
    pause_repository, pause_tag = projectimages.PAUSE_IMAGE.rsplit(":", 1)
    if not enabled:
        return ["--set", "topologyProbe.enabled=false"]
    return [
        "--set",
        "topologyProbe.enabled=true",
        "--set",
        f"topologyProbe.image.repository={repository}",
        "--set",
        f"topologyProbe.image.tag={tag}",
        "--set",
        "topologyProbe.image.pullPolicy=Never",
        "--set",
        f"topologyProbe.pauseImage.repository={pause_repository}",
        "--set-string",
        f"topologyProbe.pauseImage.tag={pause_tag}",
        "--set",
        "topologyProbe.pauseImage.pullPolicy=Never",
        "--set-string",
        f"topologyProbe.nodeSelector.{REAL_NODE_LABEL.replace('.', chr(92) + '.')}=true",
        "--set",
        f"topologyProbe.tolerations[0].key={REAL_NODE_TAINT['key']}",
        "--set",
        "topologyProbe.tolerations[0].operator=Exists",
    ]


def test_the_probe_daemonset_labels_the_real_nodes(
    operator_release: dict[str, Any],
    launcher_test_image: str,
    helm: Run,
    kubectl: Run,
    kube: client.ApiClient,
) -> None:
    core = client.CoreV1Api(kube)
    for node in REAL_NODES:
        kubectl(["label", "node", node, f"{L.NVLINK_DOMAIN_SIZE}-"], check=True)
        assert L.NVLINK_DOMAIN_SIZE not in (core.read_node(node).metadata.labels or {})
    upgrade = ["upgrade", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE, "--reuse-values"]
    helm(
        [*upgrade, *probe_values(launcher_test_image, True), "--wait", "--timeout=180s"],
        check=True,
        timeout=240,
    )
    try:

        def labelled() -> dict[str, str] | None:
            found = {
                n: (core.read_node(n).metadata.labels or {}).get(L.NVLINK_DOMAIN_SIZE) for n in REAL_NODES
            }
            return found if all(found.values()) else None

        # The stand-in nvidia-smi reports 2 GPUs joined by NV18 links: one NVLink domain of 2.
        assert wait_for(labelled, "the probe to label both real nodes", timeout=120) == {
            n: "2" for n in REAL_NODES
        }
        apps = client.AppsV1Api(kube)
        [daemonset] = apps.list_namespaced_daemon_set(
            OPERATOR_NAMESPACE, label_selector="app.kubernetes.io/component=topology-probe"
        ).items
        assert daemonset.status.desired_number_scheduled == len(REAL_NODES)
        pods = core.list_namespaced_pod(
            OPERATOR_NAMESPACE, label_selector="app.kubernetes.io/component=topology-probe"
        ).items
        assert sorted(p.spec.node_name for p in pods) == list(REAL_NODES)
        for pod in pods:
            [probe] = pod.status.init_container_statuses
            assert probe.state.terminated.exit_code == 0
            log = core.read_namespaced_pod_log(pod.metadata.name, OPERATOR_NAMESPACE, container="probe")
            assert f"{L.NVLINK_DOMAIN_SIZE}=2" in log and "labelled node" in log, log
    finally:
        helm([*upgrade, *probe_values(launcher_test_image, False), "--wait", "--timeout=120s"], timeout=180)
