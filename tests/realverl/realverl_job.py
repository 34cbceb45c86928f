"""A planned tiny VerlJob run by the real launcher on a local two-node Ray, with verl 0.6.1's own trainer.

The chain is the product's: :func:`plan` gives the spec and two one-GPU Node objects to the planner, the
operator's ``build_launch_spec`` turns the plan into ``launch.json``, and ``verl-launcher head`` and
``worker`` (run by the real-verl environment's interpreter, as a verl image's python runs the injected
launcher) start Ray with one fake GPU each and run ``python3 -m verl.trainer.main_ppo`` with the planner's
overrides. Only the pod's surroundings are local: the head's address (127.0.0.1 and a free port instead of
the head Service), the network interface (``lo``), and the CPU shim switched on in every process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_contract.launch_spec import LaunchSpec
from verl_operator.api.spec import VerlJobSpec
from verl_operator.manifests.launchspec import LaunchPlan, build_launch_spec
from verl_operator.planner import plan_job

REPO = Path(__file__).resolve().parents[2]
SHIM_DIR = Path(__file__).resolve().parent / "cpu_shim"
sys.path.insert(0, str(REPO / "tests" / "ray"))
from launcher_cluster import (  # noqa: E402
    FAST_RAY_ENV,
    PORT_TRIES,
    free_ports,
    head_ports_outcome,
    node_args,
    pids_with,
)
from launcher_cluster import _kill_group as kill_group  # noqa: E402

#: Configuration verl needs on CPU (docs/realverl.md, items 2-3), given as the job's spec.overrides: FSDP2
#: (FSDP1's sync_module_states needs a device), SDPA attention (flash-attn needs CUDA), no torch.compile,
#: padding kept, no gradient checkpointing, no dataloader worker processes.
CPU_OVERRIDES: tuple[str, ...] = (
    "actor_rollout_ref.actor.strategy=fsdp2",
    "critic.strategy=fsdp2",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "+critic.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.actor.use_torch_compile=False",
    "actor_rollout_ref.ref.use_torch_compile=False",
    "actor_rollout_ref.model.use_remove_padding=False",
    "actor_rollout_ref.model.enable_gradient_checkpointing=False",
    "critic.model.enable_gradient_checkpointing=False",
    "data.dataloader_num_workers=0",
)

#: A short run (the steps are job_spec's) that prints verl's console lines and writes nothing else.
RUN_OVERRIDES: tuple[str, ...] = (
    "trainer.logger=[console]",
    "trainer.val_before_train=False",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "trainer.project_name=realverl",
)

#: The GPU the two Node objects advertise (their labels) and each "pod" reports (nvidia-smi's listing, from a
#: file): the launcher checks every node against the plan's expectations, as on GPUs.
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
GPU_MEMORY_MIB = 81559
GPU_QUERY_CSV = f"0, {GPU_PRODUCT.replace('-', ' ')}, {GPU_MEMORY_MIB} MiB\n"


def tiny_nodes(count: int = 2, gpus: int = 1) -> list[dict[str, Any]]:
    """Node objects as the API server returns them: ``count`` nodes with ``gpus`` GPUs each."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": f"cpu-{i}",
                "labels": {
                    "kubernetes.io/hostname": f"cpu-{i}",
                    "nvidia.com/gpu.product": GPU_PRODUCT,
                    "nvidia.com/gpu.memory": str(GPU_MEMORY_MIB),
                },
            },
            "spec": {},
            "status": {
                "allocatable": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": str(gpus)},
                "capacity": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": str(gpus)},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        for i in range(count)
    ]


def job_spec(
    assets: Path,
    algorithm: str,
    *,
    train_file: Path | None = None,
    steps: int = 2,
) -> dict[str, Any]:
    """The VerlJob's spec (camelCase, as a user writes it) for the tiny model and data under ``assets``."""
    overrides = [
        *CPU_OVERRIDES,
        *RUN_OVERRIDES,
        f"trainer.total_training_steps={steps}",
        f"trainer.experiment_name={algorithm}",
        f"custom_reward_function.path={assets / 'reward.py'}",
        "custom_reward_function.name=compute_score",
    ]
    if algorithm == "grpo":  # the reference model: KL loss against it
        overrides += ["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.01"]
    return {
        "verl": {"image": "local/verl-cpu:0.6.1", "version": "0.6"},
        "model": {
            "path": str(assets / "model"),
            # Not in the planner's catalog: the shape is given (assets.build_model's config).
            "shape": {
                "modelType": "qwen2",
                "layers": 2,
                "hiddenSize": 64,
                "attentionHeads": 4,
                "kvHeads": 2,
                "intermediateSize": 128,
                "vocabSize": 512,
                "maxPositionEmbeddings": 1024,
                "tieWordEmbeddings": True,
            },
        },
        "algorithm": algorithm,
        "data": {
            "trainFiles": [str(train_file or assets / "data" / "train.parquet")],
            "valFiles": [str(assets / "data" / "val.parquet")],
            "trainBatchSize": 4,
            "maxPromptLength": 32,
            "maxResponseLength": 16,
        },
        "resources": {"gpus": 2, "gpusPerNode": 1},
        "rollout": {"responsesPerPrompt": 2},
        "overrides": overrides,
    }


def plan(name: str, spec_doc: dict[str, Any]) -> LaunchSpec:
    """Plan the job on two one-GPU nodes and build its launch spec as the operator does.

    Raises:
        AssertionError: the planner refused the job (its violations are the message).
    """
    spec = VerlJobSpec.model_validate(spec_doc)
    result = plan_job(spec, tiny_nodes())
    assert result.feasible and result.plan is not None, [v.message for v in result.violations]
    job = {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"}}
    return build_launch_spec(job, spec, LaunchPlan.from_plan(result.plan, spec, nodes=("cpu-0", "cpu-1")))


def local_document(spec: LaunchSpec, port: int, dashboard_port: int) -> dict[str, Any]:
    """``launch.json`` with the head Service's address replaced by this machine's (127.0.0.1)."""
    document = spec.to_document()
    document["head"] = {
        **document["head"],
        "host": "127.0.0.1",
        "port": port,
        "dashboardPort": dashboard_port,
    }
    return document


@dataclass
class Node:
    """One launcher process (a "pod")."""

    name: str
    proc: subprocess.Popen[str]
    log: Path
    termination_log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def termination(self) -> dict[str, Any]:
        return dict(json.loads(self.termination_log.read_text()))


@dataclass
class LocalJob:
    """The workspace of one job: its launch.json, its launcher processes and their logs."""

    root: Path
    python: Path
    port: int = field(default_factory=lambda: free_ports(1)[0])
    client_port: int = field(default_factory=lambda: free_ports(1)[0])  # the head's Ray Client server
    nodes: list[Node] = field(default_factory=list)

    @property
    def ray_tmp(self) -> Path:
        return self.root / "r"

    @property
    def progress(self) -> dict[str, Any]:
        return dict(json.loads((self.root / "progress.json").read_text()))

    def write_spec(self, spec: LaunchSpec) -> None:
        document = local_document(spec, self.port, free_ports(1)[0])
        (self.root / "launch.json").write_text(json.dumps(document))

    def environment(self, role: str, name: str) -> dict[str, str]:
        """The "pod's" environment: the real-verl interpreter first on PATH (the entrypoint's ``python3``),
        the launcher and the CPU shim on PYTHONPATH, one GPU that is not there."""
        bin_dir = str(self.python.parent)
        listing = self.root / "nvidia-smi-query.csv"
        listing.write_text(GPU_QUERY_CSV)
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VIRTUAL_ENV", "PYTHON"))},
            **FAST_RAY_ENV,
            "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
            "PYTHONPATH": os.pathsep.join([str(REPO / "launcher"), str(SHIM_DIR)]),
            "VERL_CPU_SHIM": "1",
            "VERL_LAUNCH_SPEC": str(self.root / "launch.json"),
            "VERL_OPERATOR_ROLE": role,
            "VERL_LAUNCHER_TERMINATION_LOG": str(self.root / f"{name}.termination-log"),
            "VERL_LAUNCHER_PROGRESS_FILE": str(self.root / "progress.json"),
            "VERL_LAUNCHER_FAKE_GPUS": "1",  # Ray's --num-gpus: verl counts Ray's GPUs
            "VERL_LAUNCHER_GPU_QUERY_FILE": str(listing),
            "VERL_LAUNCHER_NODE_NAME": name,
            # The pod's interface; the spec's eth0 does not exist here (a pod's value wins over the spec's).
            "GLOO_SOCKET_IFNAME": "lo",
            "NCCL_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            "WANDB_MODE": "disabled",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
        }

    def start(self, role: str, name: str) -> Node:
        log = self.root / f"{name}.log"
        argv = [
            str(self.python),
            "-m",
            "verl_launcher",
            role,
            f"--ray-executable={self.python.parent / 'ray'}",
            # verl's TaskRunner takes 1 CPU, each worker's placement bundle 1 CPU and 1 GPU.
            "--num-cpus=2",
            "--stop-grace-seconds=10",
            *node_args(head=role == "head", client_port=self.client_port),
        ]
        if role == "head":
            argv += [f"--ray-start-arg=--temp-dir={self.ray_tmp}", "--poll-seconds=1"]
        else:
            # A node's own temp dir, as in a pod: with the head's, its log monitor streams the same actor log
            # files to verl's driver a second time.
            argv += [
                f"--ray-start-arg=--temp-dir={self.root / 'w'}",
                "--retry-seconds=1",
                "--head-gone-grace-seconds=5",
            ]
        with log.open("w") as handle:
            proc = subprocess.Popen(
                argv,
                env=self.environment(role, name),
                stdout=handle,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
                cwd=self.root,
            )
        node = Node(name, proc, log, self.root / f"{name}.termination-log")
        self.nodes.append(node)
        return node

    def stop(self) -> None:
        """SIGTERM every launcher still running, then remove whatever of this job's Ray is left."""
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        for node in self.nodes:
            try:
                node.proc.wait(40)
            except subprocess.TimeoutExpired:
                kill_group(node.proc.pid)
        for text in (
            str(self.ray_tmp),
            str(self.root / "w"),
            f"--address=127.0.0.1:{self.port}",
            f"-address=127.0.0.1:{self.port}",
        ):
            for pid in pids_with(text):
                if pid != os.getpid():
                    kill_group(pid)


def start_two_nodes(job: LocalJob, spec: LaunchSpec) -> tuple[Node, Node]:
    """Start a worker and the head for ``spec``; return (head, worker) once the head's Ray holds its GCS and
    Ray Client ports (or the head exited). A port taken by another program before Ray bound it stops both and
    starts them again on new ports (``PORT_TRIES``; ``tests/ray/launcher_cluster.py`` tells a lost race)."""
    for _ in range(PORT_TRIES):
        job.write_spec(spec)
        worker = job.start("worker", "w-1")
        head = job.start("head", "h-0")
        ports = {"gcs": job.port, "client": job.client_port}
        if head_ports_outcome(head.proc, head.log, ports) != "lost":
            break
        print(f"--- the head lost a port race on {ports}; starting both nodes again on new ports ---")
        job.stop()
        job.nodes.clear()
        job.port, job.client_port = free_ports(2)
    return head, worker


def run_two_nodes(job: LocalJob, spec: LaunchSpec, timeout: float) -> tuple[Node, Node]:
    """Start a worker and the head for ``spec``; wait for the head to end; return (head, worker)."""
    head, worker = start_two_nodes(job, spec)
    head.proc.wait(timeout)
    return head, worker
