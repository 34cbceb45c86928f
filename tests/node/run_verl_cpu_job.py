"""Watch verl train on real Kubernetes nodes: a devcluster with two real kubelet nodes, the operator installed
by its chart, and one tiny VerlJob whose head and worker pods run verl 0.6.1's real trainer on CPU (the node
tier's ``test_verl_cpu.py`` job). Prints the head pod's log as it comes (the launcher's, Ray's and verl's own
step lines), then the job's status. Needs root (real nodes). ``make verl-cpu-job-nodes`` runs it.

    sudo .venv/bin/python tests/node/run_verl_cpu_job.py [--algorithm grpo|ppo] [--steps N] [--keep]

Without ``--cluster`` it starts the devcluster ``verl-cpu-job`` and removes it afterwards (``--keep`` leaves
it and the job running for kubectl); ``--cluster NAME`` uses a running instance started with
``verl-operator-dev devcluster up --name NAME --real-nodes 2`` and installs the chart there when missing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml
from kubernetes import client

from node.conftest import (
    GPUS_PER_REAL_NODE,
    OPERATOR_NAMESPACE,
    REAL_NODES,
    RELEASE,
    SESSION_PROFILE,
    chart_install_argv,
    python_ray_recipe,
)
from node.verl_cpu import HostVerl, verl_cpu_job
from verl_devtools.devcluster import DevCluster, binaries, imagebuild, projectimages, realnodes
from verl_devtools.devcluster.layout import COMPONENTS

NAMESPACE = "verl-cpu-job"
JOB_SECONDS = 900


def say(message: str) -> None:
    print(f"[verl-cpu-job] {message}", file=sys.stderr, flush=True)


def _kubectl(cluster: DevCluster) -> list[str]:
    return [str(binaries.ensure(("kubectl",))["kubectl"]), f"--kubeconfig={cluster.kubeconfig}"]


def _install_chart(cluster: DevCluster) -> None:
    helm = [str(binaries.ensure(("helm",))["helm"]), f"--kubeconfig={cluster.kubeconfig}"]
    installed = subprocess.run(
        [*helm, "status", RELEASE, "--namespace", OPERATOR_NAMESPACE], capture_output=True, check=False
    )
    if installed.returncode == 0:
        say(f"the chart is installed as {RELEASE} already")
        return
    say("installing the operator's chart (hostPath volumes allowed: the pods mount the host's verl)")
    subprocess.run([*helm, *chart_install_argv()], check=True, timeout=300)


def _head_pod(core: client.CoreV1Api, name: str, deadline: float) -> Any:
    """The head pod once its Ray container started (or ended)."""
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(
            NAMESPACE, label_selector=f"verl-operator.io/job={name},verl-operator.io/role=head"
        ).items
        for pod in pods:
            for state in pod.status.container_statuses or []:
                if state.state.running or state.state.terminated:
                    return pod
        time.sleep(1)
    raise TimeoutError(f"the head pod of {name} did not start")


def run(cluster: DevCluster, host: HostVerl, image: str, args: argparse.Namespace) -> int:
    kubectl = _kubectl(cluster)
    name = f"verl-{args.algorithm}"
    job = verl_cpu_job(name, image, host, algorithm=args.algorithm, steps=args.steps)
    with cluster.api_client() as api:
        core = client.CoreV1Api(api)
        custom = client.CustomObjectsApi(api)
        if not any(n.metadata.name == NAMESPACE for n in core.list_namespace().items):
            core.create_namespace({"metadata": {"name": NAMESPACE}})
        subprocess.run(
            [*kubectl, "delete", "verljob", name, "-n", NAMESPACE, "--ignore-not-found", "--wait"], check=True
        )
        say(f"applying VerlJob {NAMESPACE}/{name}; verl's argv gets the planner's overrides:")
        print(yaml.safe_dump(job, sort_keys=False), flush=True)
        subprocess.run(
            [*kubectl, "apply", "-n", NAMESPACE, "-f", "-"], input=yaml.safe_dump(job), text=True, check=True
        )
        deadline = time.monotonic() + JOB_SECONDS
        head = _head_pod(core, name, deadline)
        say(f"following {head.metadata.name} on {head.spec.node_name} ({head.status.pod_ip})")
        subprocess.run(
            [*kubectl, "logs", "-f", "-n", NAMESPACE, head.metadata.name, "-c", "ray"], check=False
        )
        status: dict[str, Any] = {}
        while time.monotonic() < deadline and status.get("phase") not in ("Succeeded", "Failed"):
            time.sleep(1)
            status = (
                custom.get_namespaced_custom_object(
                    "verl-operator.io", "v1alpha1", NAMESPACE, "verljobs", name
                ).get("status")
                or {}
            )
        summary = {k: status.get(k) for k in ("phase", "reason", "message", "progress")}
        print(yaml.safe_dump({"status": summary}, sort_keys=False), flush=True)
        if not args.keep:
            subprocess.run([*kubectl, "delete", "verljob", name, "-n", NAMESPACE, "--wait"], check=False)
    return 0 if status.get("phase") == "Succeeded" else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", choices=("grpo", "ppo"), default="grpo")
    parser.add_argument("--steps", type=int, default=2, help="training steps (1-16)")
    parser.add_argument("--cluster", help="a running devcluster with real nodes (left running)")
    parser.add_argument("--keep", action="store_true", help="leave the devcluster and the job")
    args = parser.parse_args(argv)
    if not 1 <= args.steps <= 16:
        parser.error(f"--steps {args.steps}: choose 1 to 16")
    if os.geteuid() != 0:
        parser.error("real kubelet nodes need root (containerd, network links, cgroups)")
    realnodes.ensure_host_packages(say)
    binaries.ensure((*COMPONENTS, "kubectl", "helm", "kubelet", "kube-proxy", "coredns"))
    projectimages.pause_image()
    projectimages.build_operator_image()
    recipe = python_ray_recipe()
    archive = imagebuild.build(recipe)
    host = HostVerl.ensure()
    cluster = DevCluster(
        name=args.cluster or "verl-cpu-job",
        profile=SESSION_PROFILE,
        real_nodes=REAL_NODES,
        real_node_gpus=GPUS_PER_REAL_NODE,
    )
    try:
        cluster.up()
        cluster.import_image(archive)
        _install_chart(cluster)
        return run(cluster, host, recipe.reference, args)
    finally:
        if args.cluster is None and not args.keep:
            cluster.down()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
