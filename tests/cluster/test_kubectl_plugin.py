"""``kubectl verl`` against the real control plane: kubectl finds the plugin on ``PATH`` and runs it with the
current context; one of verl's own launch scripts becomes a running VerlJob with ``kubectl verl import | kubectl
apply``; ``status`` and ``top`` read it back (``logs`` needs a real kubelet); the context's namespace, ``-A`` and the exit codes
follow kubectl's conventions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from cluster.polling import wait_for
from verl_devtools.devcluster import DevCluster, binaries
from verl_devtools.devcluster.localrun import LocalOperator, install_crd
from verl_operator.commands.kubectl import head_pod

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "unit" / "data" / "verl-scripts" / "grpo-run_qwen2-7b.sh"
JOB = ROOT / "examples" / "jobs" / "grpo-qwen7b-dgx.yaml"
GROUP, VERSION, PLURAL = "verl-operator.io", "v1alpha1", "verljobs"
IMAGE = "ghcr.io/example/verl:0.9.1"
#: The directory of this interpreter's console scripts: ``kubectl-verl`` is there.
SCRIPTS_DIR = Path(sys.executable).parent

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def operator(devcluster: DevCluster, dgx: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One operator process (no webhook) for the module, with the DGX H100 nodes."""
    install_crd(devcluster.kubeconfig)
    op = LocalOperator(devcluster.kubeconfig, tmp_path_factory.mktemp("operator"), webhook_name=None)
    op.start()
    yield
    op.stop()
    print(op.log_tail(40))


def kubectl_verl(
    devcluster: DevCluster, argv: list[str], *, kubeconfig: Path | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``kubectl verl ...`` as a user runs it: the real kubectl finds ``kubectl-verl`` on PATH."""
    exe = str(binaries.ensure(("kubectl",))["kubectl"])
    env = {
        **os.environ,
        "PATH": f"{SCRIPTS_DIR}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(kubeconfig or devcluster.kubeconfig),
    }
    return subprocess.run(
        [exe, "verl", *argv], input=stdin, capture_output=True, text=True, env=env, timeout=60, check=False
    )


def apply(devcluster: DevCluster, manifest: str, namespace: str) -> None:
    exe = str(binaries.ensure(("kubectl",))["kubectl"])
    done = subprocess.run(
        [exe, f"--kubeconfig={devcluster.kubeconfig}", "apply", "-n", namespace, "-f", "-"],
        input=manifest,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def phase(kube: client.ApiClient, namespace: str, name: str) -> str | None:
    obj: Any = client.CustomObjectsApi(kube).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return (obj.get("status") or {}).get("phase")


def context_kubeconfig(devcluster: DevCluster, path: Path, namespace: str) -> Path:
    """The devcluster's kubeconfig with ``namespace`` set on its current context."""
    config = yaml.safe_load(devcluster.kubeconfig.read_text())
    for context in config["contexts"]:
        if context["name"] == config["current-context"]:
            context["context"]["namespace"] = namespace
    path.write_text(yaml.safe_dump(config))
    return path


def test_plan_against_the_contexts_live_nodes(devcluster: DevCluster, dgx: None) -> None:
    done = kubectl_verl(devcluster, ["plan", "-f", str(JOB)])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("FEASIBLE") and "NVIDIA-H100-80GB-HBM3" in done.stdout
    as_json = kubectl_verl(devcluster, ["plan", "-f", str(JOB), "-o", "json"])
    assert json.loads(as_json.stdout)["plan"]["nnodes"] == 2
    too_big = yaml.safe_load(JOB.read_text())
    too_big["spec"]["resources"]["gpus"] = 4096
    refused = kubectl_verl(devcluster, ["plan", "-f", "/dev/stdin"], stdin=yaml.safe_dump(too_big))
    assert refused.returncode == 1 and refused.stdout.startswith("INFEASIBLE"), refused.stdout


def test_a_verl_script_becomes_a_running_job_and_reads_back(
    devcluster: DevCluster, operator: None, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    imported = kubectl_verl(
        devcluster, ["import", str(SCRIPT), "--image", IMAGE, "--set", "HOME=/data", "--name", "qwen2-7b"]
    )
    assert imported.returncode == 0, imported.stderr
    assert "warning: $@" in imported.stderr
    apply(devcluster, imported.stdout, namespace)
    wait_for(lambda: phase(kube, namespace, "qwen2-7b") == "Running" or None, "qwen2-7b Running", 60)

    status = kubectl_verl(devcluster, ["status", "qwen2-7b", "-n", namespace])
    assert status.returncode == 0, status.stderr
    obj: Any = client.CustomObjectsApi(kube).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "qwen2-7b"
    )
    placed = f"Placement:   {obj['status']['nodes']}"
    for needle in ("Phase:       Running", "Plan:        1 x 8 GPUs", placed, "Progress:    -"):
        assert needle in status.stdout, status.stdout
    as_yaml = yaml.safe_load(
        kubectl_verl(devcluster, ["status", "qwen2-7b", "-n", namespace, "-o", "yaml"]).stdout
    )
    assert as_yaml["spec"]["verl"]["entrypoint"] == "verl.trainer.main_ppo"

    # The context's namespace is the default, as for kubectl get.
    config = context_kubeconfig(devcluster, tmp_path / "config", namespace)
    top = kubectl_verl(devcluster, ["top"], kubeconfig=config)
    assert top.returncode == 0, top.stderr
    header, row = top.stdout.splitlines()
    assert header.split()[:3] == ["NAME", "PHASE", "STEP"] and row.split()[:2] == ["qwen2-7b", "Running"]
    everywhere = json.loads(kubectl_verl(devcluster, ["top", "-A", "-o", "json"]).stdout)
    assert {"namespace": namespace, "name": "qwen2-7b", "phase": "Running"}.items() <= next(
        r for r in everywhere if r["name"] == "qwen2-7b" and r["namespace"] == namespace
    ).items()

    # `logs` reads the head pod it finds here; the log itself is not asked for: the API server would ask the
    # simulated node's kubelet, at an address no node holds.
    assert head_pod(kube, namespace, obj) == "qwen2-7b-r0-head"


def test_errors_follow_kubectl(devcluster: DevCluster, operator: None, namespace: str) -> None:
    missing = kubectl_verl(devcluster, ["status", "nope", "-n", namespace])
    assert missing.returncode == 1
    assert missing.stderr.startswith("Error from server (NotFound):") and '"nope" not found' in missing.stderr
    empty = kubectl_verl(devcluster, ["top", "-n", namespace])
    assert empty.returncode == 0 and f"No resources found in {namespace} namespace." in empty.stderr
    usage = kubectl_verl(devcluster, ["status"])
    assert usage.returncode == 2
