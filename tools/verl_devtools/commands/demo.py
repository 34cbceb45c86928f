"""``verl-operator-dev demo``: the whole story on the local devcluster, with a readable summary.

Steps: devcluster up (profile dgx-h100: 4 DGX H100 nodes in 2 racks), the CRD installed, the operator
started as a local process (webhook included), then the examples of ``examples/jobs``: one that plans and is
placed, one rejected at admission with suggestions, one that waits for capacity and is placed once the first
is deleted. The operator is stopped at the end (the cluster is left running for inspection:
``verl-operator-dev devcluster down`` removes it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from verl_operator.api.plan import Plan

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "jobs"
PLACED = "grpo-qwen7b-dgx.yaml"
REJECTED = "rejected-batch-size.yaml"
WAITING = "waits-for-capacity.yaml"


def add_parser(subparsers: Any) -> None:
    """Register the ``demo`` subcommand."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "demo", help="devcluster + operator + example VerlJobs, with a summary"
    )
    p.add_argument("--name", default="default", help="devcluster instance (default: default)")
    p.add_argument("--examples", default=str(EXAMPLES), help="directory of the example VerlJobs")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each step")
    p.set_defaults(func=run)


def _title(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def _wait(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise SystemExit(f"demo: timed out waiting for {what}")


def run(args: argparse.Namespace) -> int:
    """Run the demo; exit 0 when every example behaved as described."""
    from kubernetes import client, config

    from verl_devtools.devcluster import DevCluster, binaries
    from verl_devtools.devcluster.localrun import LocalOperator, install_crd
    from verl_operator.api.spec import GROUP, PLURAL, VERSION

    examples = Path(args.examples)
    cluster = DevCluster(name=args.name, profile="dgx-h100")
    _title("devcluster")
    cluster.up()
    kubeconfig = cluster.kubeconfig
    kubectl_bin = str(binaries.ensure(("kubectl",))["kubectl"])

    def kubectl(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [kubectl_bin, f"--kubeconfig={kubeconfig}", *argv], capture_output=True, text=True, check=False
        )

    _title("CRD")
    install_crd(kubeconfig)
    print("verljobs.verl-operator.io established")
    for name in ("grpo-qwen7b", "grpo-qwen14b-wait"):  # a previous demo run's jobs
        kubectl("delete", "verljob", name, "--ignore-not-found", "--wait=true")

    api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)

    def job(name: str) -> dict[str, Any]:
        obj: Any = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
        return dict(obj)

    operator = LocalOperator(
        kubeconfig, cluster.layout.base / "operator", webhook_name="demo.verl-operator.io"
    )
    _title("operator")
    operator.start()
    print(f"verl-operator run: pid {operator.proc.pid if operator.proc else '?'}, log {operator.log_path}")
    try:
        _scenario(kubectl, examples, job, core, args.timeout)
    finally:
        operator.stop()
        api.close()
    _title("done")
    # Name the programs by the paths that ran here: neither need be on PATH (the project lives in a venv).
    dev = sys.argv[0]  # verl-operator-dev, as it was run
    operator_cli = shutil.which("verl-operator") or str(Path(dev).with_name("verl-operator"))
    print(
        "The operator was stopped; the devcluster keeps running with the jobs. Inspect it with\n"
        f"  export KUBECONFIG={kubeconfig}\n  {kubectl_bin} get verljobs,pods -o wide\n"
        f"run the operator again with\n  {operator_cli} run --kubeconfig {kubeconfig}\n"
        f"and remove everything with\n  {dev} devcluster down --name {args.name}"
    )
    return 0


def _scenario(
    kubectl: Callable[..., subprocess.CompletedProcess[str]],
    examples: Path,
    job: Callable[[str], dict[str, Any]],
    core: Any,
    timeout: float,
) -> None:
    """The walk-through: placed, rejected, waiting, then placed once the first job is deleted."""
    from verl_operator.clusters.labels import RACK

    def phase(name: str) -> str | None:
        return (job(name).get("status") or {}).get("phase")

    _title(f"kubectl apply -f {PLACED}  (plans and places)")
    print((kubectl("apply", "-f", str(examples / PLACED)).stdout or "").strip())
    _wait("grpo-qwen7b Running", lambda: phase("grpo-qwen7b") == "Running", timeout)

    _title(f"kubectl apply -f {REJECTED}  (rejected with suggestions)")
    rejected = kubectl("apply", "-f", str(examples / REJECTED))
    print(rejected.stderr.strip())
    if rejected.returncode == 0:
        raise SystemExit("demo: the invalid example was admitted")

    _title(f"kubectl apply -f {WAITING}  (waits for capacity)")
    print((kubectl("apply", "-f", str(examples / WAITING)).stdout or "").strip())
    _wait("grpo-qwen14b-wait Pending", lambda: phase("grpo-qwen14b-wait") == "Pending", timeout)
    print("message:", job("grpo-qwen14b-wait")["status"].get("message"))
    _summary(kubectl, core, RACK)

    _title("kubectl delete verljob grpo-qwen7b  (frees two nodes: the waiting job is placed)")
    print(kubectl("delete", "verljob", "grpo-qwen7b").stdout.strip())
    _wait("grpo-qwen14b-wait Running", lambda: phase("grpo-qwen14b-wait") == "Running", timeout)
    _summary(kubectl, core, RACK)
    uid = job("grpo-qwen14b-wait")["metadata"]["uid"]
    print("\nevents of grpo-qwen14b-wait:")
    events = kubectl(
        "get", "events", f"--field-selector=involvedObject.uid={uid}", "--sort-by=.lastTimestamp"
    )
    print(events.stdout.strip())


def _count(n: Any, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _plan_line(name: str, plan: Plan) -> str:
    """One line of the plan a person wants to see."""
    b, r, m = plan.batching, plan.rollout, plan.memory
    return (
        f"{name}: {plan.nnodes} x {plan.gpus_per_node} GPUs, dp{plan.data_parallel_size} "
        f"sp{plan.sequence_parallel_size} rollout tp{r.tensor_parallel_size} x {r.replicas} "
        f"replicas; batch {b.train_batch_size} x n {b.rollout_n}, mini-batch "
        f"{b.ppo_mini_batch_size} ({b.mini_batch_per_gpu}/GPU), micro {b.ppo_micro_batch_size_per_gpu} "
        f"({_count(b.gradient_accumulation_steps, 'accumulation step')}); peak GiB rollout {m.rollout_peak_gib} "
        f"train {m.train_peak_gib} of {m.gpu_memory_gib}"
    )


def _summary(kubectl: Callable[..., subprocess.CompletedProcess[str]], core: Any, rack_label: str) -> None:
    from verl_operator.api.status import parse_status

    _title("summary")
    print(kubectl("get", "verljobs").stdout.rstrip())
    listed = kubectl("get", "verljobs", "-o", "json")
    for item in json.loads(listed.stdout or "{}").get("items", []):
        plan = parse_status(item.get("status")).plan
        if plan is not None:
            print(_plan_line(item["metadata"]["name"], plan))
    racks = {n.metadata.name: (n.metadata.labels or {}).get(rack_label, "-") for n in core.list_node().items}
    pods = core.list_namespaced_pod("default", label_selector="verl-operator.io/job").items
    print(f"\n{'POD':34} {'ROLE':7} {'GPUS':5} {'NODE':14} {'RACK':10} PHASE")
    for pod in sorted(pods, key=lambda p: p.metadata.name):
        gpus = pod.spec.containers[0].resources.requests.get("nvidia.com/gpu", "0")
        node = pod.spec.node_name or "-"
        print(
            f"{pod.metadata.name:34} {pod.metadata.labels.get('verl-operator.io/role', '?'):7} {gpus:5} "
            f"{node:14} {racks.get(node, '-'):10} {pod.status.phase}"
        )
