"""The launcher against a real local Ray on CPU: bootstrap, deadlines, verl's argv/env, exit codes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import launcher_cluster
import pytest
from launcher_cluster import Env

pytestmark = pytest.mark.ray

FIXTURES = Path(__file__).resolve().parents[1] / "unit" / "fixtures" / "nvidia-smi"
TWO_GPU_NVLINK = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tNV4\t0-7\t0\nGPU1\tNV4\t X \t0-7\t0\n"


def test_two_nodes_run_verl_with_the_planned_argv_and_env(ray_env: Env) -> None:
    ray_env.spec(
        nnodes=2,
        env={
            "FAKE_VERL_RECORD": str(ray_env.root / "verl-record.json"),
            "FAKE_VERL_RAY_INIT": "1",
            "NCCL_SOCKET_IFNAME": "lo",
            "TOKENIZERS_PARALLELISM": "from-spec",
        },
        checkpoint={"dir": str(ray_env.root / "ckpt"), "resume": False},
    )
    worker = ray_env.start("worker", "w-1")
    head = ray_env.start(
        "head", "h-0", extra_env={"VERL_OPERATOR_ATTEMPT": "1", "NCCL_SOCKET_IFNAME": "pod-eth9"}
    )
    assert head.wait(240) == 0, head.output()
    record = json.loads((ray_env.root / "verl-record.json").read_text())
    assert record["argv"] == [
        "algorithm.adv_estimator=grpo",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=2",
        f"trainer.default_local_dir={ray_env.root / 'ckpt'}",
        "trainer.resume_mode=auto",
    ]
    env = record["env"]
    assert env["NCCL_SOCKET_IFNAME"] == "pod-eth9"  # the pod's value is never overridden by the spec
    assert env["TOKENIZERS_PARALLELISM"] == "from-spec"  # the spec's value wins over verl's default
    assert env["VLLM_LOGGING_LEVEL"] == "WARN" and env["NCCL_DEBUG"] == "WARN"
    assert env["RAY_ADDRESS"] == f"127.0.0.1:{ray_env.port}"
    # verl's ray.init() through RAY_ADDRESS sees the whole planned cluster: 2 nodes x 2 fake GPUs.
    assert record["aliveNodes"] == 2 and record["clusterResources"]["GPU"] == 4
    output = head.output()
    assert "cluster ready after" in output
    assert 'VERL_PROGRESS {"step":2,"totalSteps":2,"throughput":120.5,"stepSeconds":1.25}' in output
    assert '"node":"w-1"' in output and '"node":"h-0"' in output  # every node was probed
    progress = json.loads((ray_env.root / "progress.json").read_text())
    assert progress["step"] == 2 and progress["metrics"]["perf/throughput"] == 120.5
    assert head.termination() == {"reason": "Succeeded", "message": "verl finished at step 2 of 2"}
    # The head stopped its Ray cluster; the worker notices and leaves with 0.
    assert worker.wait(60) == 0, worker.output()
    assert worker.termination()["reason"] == "Succeeded"


def test_verl_failure_maps_to_10(ray_env: Env) -> None:
    ray_env.spec(nnodes=1, env={"FAKE_VERL_EXIT": "3"})
    head = ray_env.start("head", "h-0")
    assert head.wait(120) == 10, head.output()
    termination = head.termination()
    assert termination["reason"] == "VerlFailed"
    assert termination["message"].startswith("verl exited with code 3 at step 2 of 2")


def test_missing_worker_hits_the_deadline_with_a_message(ray_env: Env) -> None:
    ray_env.spec(nnodes=2, timeouts={"clusterReadySeconds": 15, "workerJoinSeconds": 15})
    head = ray_env.start("head", "h-0")
    assert head.wait(120) == 13, head.output()
    message = head.termination()["message"]
    assert "not ready 15s after the head started (timeouts.clusterReadySeconds)" in message
    assert "1 of 2 nodes and 2 of 4 GPUs registered (plan: 2 nodes x 2 GPUs)" in message
    assert "missing: 1 node(s)" in message and f"127.0.0.1:{ray_env.port}" in message
    assert not (ray_env.root / "verl-record.json").exists()


def test_worker_killed_mid_run_maps_to_11(ray_env: Env) -> None:
    ray_env.spec(
        nnodes=2, env={"FAKE_VERL_SLEEP": "120", "FAKE_VERL_RECORD": str(ray_env.root / "verl-record.json")}
    )
    worker = ray_env.start("worker", "w-1")
    head = ray_env.start("head", "h-0")
    record = ray_env.root / "verl-record.json"
    deadline = time.monotonic() + 180
    while not record.exists() and head.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert record.exists(), head.output()
    verl_pid = json.loads(record.read_text())["pid"]
    killed_at = time.monotonic()
    ray_env.kill_node(worker)
    assert head.wait(90) == 11, head.output()
    detected_in = time.monotonic() - killed_at
    termination = head.termination()
    assert termination["reason"] == "WorkerLost"
    assert "1 of 2 Ray node(s) vanished while verl was running" in termination["message"]
    assert not Path(f"/proc/{verl_pid}").exists() or "zombie" in Path(f"/proc/{verl_pid}/status").read_text()
    print(f"worker loss detected and verl stopped in {detected_in:.1f}s")


def test_topology_mismatch_names_the_node_and_maps_to_12(ray_env: Env) -> None:
    good = ray_env.root / "nvlink2.txt"
    good.write_text(TWO_GPU_NVLINK)
    ray_env.spec(nnodes=2, expect={"requireNvlink": True, "nvlinkGroupSize": 2})
    ray_env.start(
        "worker",
        "w-pcie",
        extra_env={"VERL_LAUNCHER_TOPO_FILE": str(FIXTURES / "a100_pcie_2gpu_no_nvlink_della.txt")},
    )
    head = ray_env.start("head", "h-0", extra_env={"VERL_LAUNCHER_TOPO_FILE": str(good)})
    assert head.wait(180) == 12, head.output()
    termination = head.termination()
    assert termination["reason"] == "TopologyMismatch"
    assert (
        "node w-pcie" in termination["message"] and "GPUs 0,1 (an NVLink group of 2" in termination["message"]
    )
    assert "node h-0" not in termination["message"]
    assert not (ray_env.root / "verl-record.json").exists()


def test_worker_without_a_head_gives_up_with_14(ray_env: Env) -> None:
    ray_env.spec(nnodes=2, timeouts={"clusterReadySeconds": 5, "workerJoinSeconds": 4})
    worker = ray_env.start("worker", "w-1")
    assert worker.wait(60) == 14, worker.output()
    termination = worker.termination()
    assert termination["reason"] == "HeadUnreachable"
    assert f"could not join the Ray head at 127.0.0.1:{ray_env.port} within 4s" in termination["message"]
    assert "cannot connect" in termination["message"]


def test_invalid_spec_maps_to_2(ray_env: Env) -> None:
    path = ray_env.spec(nnodes=0)
    head = ray_env.start("head", "h-0")
    assert head.wait(60) == 2, head.output()
    termination = head.termination()
    assert termination["reason"] == "InvalidLaunchSpec"
    assert "field `nnodes`" in termination["message"] and str(path) in termination["message"]


def test_sigterm_stops_verl_and_ray(ray_env: Env) -> None:
    """Pod deletion: the launcher gets SIGTERM, stops verl's process group and its Ray head, then exits."""
    record = ray_env.root / "verl-record.json"
    ray_env.spec(nnodes=1, env={"FAKE_VERL_SLEEP": "300", "FAKE_VERL_RECORD": str(record)})
    head = ray_env.start("head", "h-0")
    deadline = time.monotonic() + 120
    while not record.exists() and head.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert record.exists(), head.output()
    verl_pid = json.loads(record.read_text())["pid"]
    head.proc.send_signal(signal.SIGTERM)
    assert head.wait(60) == 128 + signal.SIGTERM, head.output()
    assert "stopping the Ray head" in head.output()
    time.sleep(0.5)
    status = Path(f"/proc/{verl_pid}/status")
    assert not status.exists() or "zombie" in status.read_text()
    assert not launcher_cluster.pids_with(str(ray_env.ray_tmp))  # no Ray process of this head is left


@pytest.mark.parametrize(
    ("taken", "nnodes"),
    [pytest.param("gcs", 2, id="gcs-port-with-a-worker"), pytest.param("client", 1, id="ray-client-port")],
)
def test_a_head_port_taken_before_ray_binds_it_starts_the_nodes_on_new_ports(
    ray_env: Env, taken: str, nnodes: int
) -> None:
    """Another program listens on a port picked for the head (its GCS port, which the worker joins, or its Ray
    Client server port) before Ray binds it: the head and the worker start again on new ports and the job runs."""
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        held = listener.getsockname()[1]
        if taken == "gcs":
            ray_env.port = held
        else:
            ray_env.client_port = held
        ray_env.spec(nnodes=nnodes)
        workers = [ray_env.start("worker", f"w-{i}") for i in range(1, nnodes)]
        head = ray_env.start("head", "h-0")
        assert head.wait(180) == 0, head.output()
    assert [race[taken] for race in ray_env.lost_races] == [held]
    assert held not in (ray_env.port, ray_env.client_port)
    assert json.loads((ray_env.root / "launch.json").read_text())["head"]["port"] == ray_env.port
    for worker in workers:
        assert worker.wait(60) == 0, worker.output()


def test_a_port_is_ours_only_when_a_process_of_the_tree_listens_on_it() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        assert launcher_cluster.port_holder(port, {os.getpid()}) is None  # bound, not listening
        listener.listen()
        assert launcher_cluster.port_holder(port, {os.getpid()}) == "ours"
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert launcher_cluster.port_holder(port, launcher_cluster._descendants(child.pid)) == "foreign"
            assert os.getpid() not in launcher_cluster._descendants(child.pid)
        finally:
            child.kill()
            child.wait()


@pytest.mark.parametrize(
    ("line", "lost"),
    [
        pytest.param("Check failed: server_ Failed to start the grpc server. The specified port is 41851. This", True,
                     id="gcs"),
        pytest.param("RuntimeError: Failed to bind to address 127.0.0.1:41851; set GRPC_VERBOSITY", True, id="client"),
        pytest.param("Failed to bind to address 127.0.0.1:418510; set", False, id="other-port"),
        pytest.param("The specified port is 4185.", False, id="prefix-port"),
    ],
)  # fmt: skip
def test_rays_bind_failures_are_read_for_the_picked_port(line: str, lost: bool) -> None:
    assert launcher_cluster.lost_bind(f"[ray-head] {line}\n", 41851) is lost
