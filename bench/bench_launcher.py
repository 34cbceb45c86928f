"""Launcher timings: the topology parser and plan check per node, and (``--ray``) how long a real local
Ray cluster of 2 CPU "nodes" takes from `verl-launcher head` to verl's start.

Run: ``.venv/bin/python bench/bench_launcher.py [--repeat N] [--ray]``. Prints the median and best time per
call of ``parse_topo_matrix`` on every fixture of ``tests/unit/fixtures/nvidia-smi`` and of ``check_node`` on an
8-GPU node; with ``--ray``, the launcher's own "cluster ready after" time and the whole head run (fake verl that
exits at once), from the launcher's output.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from verl_launcher.check import check_node
from verl_launcher.probe import collect_probe
from verl_launcher.spec import parse_launch_spec
from verl_launcher.topology import parse_topo_matrix

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "nvidia-smi"


def timed(call: Callable[[], object], repeat: int) -> tuple[float, float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), min(samples)


def bench_parser(repeat: int) -> None:
    print(f"{'fixture':58} {'GPUs':>4} {'median us':>10} {'best us':>9}")
    for path in sorted(FIXTURES.glob("*.txt")):
        if path.name.endswith(".nvidia-smi-L.txt"):
            continue
        text = path.read_text()
        topo = parse_topo_matrix(text)
        median, best = timed(lambda text=text: parse_topo_matrix(text).nvlink_domains, repeat)
        print(f"{path.name:58} {topo.gpu_count:>4} {median * 1e6:>10.1f} {best * 1e6:>9.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        query = Path(tmp) / "q.csv"
        query.write_text("".join(f"{i}, NVIDIA H100 80GB HBM3, 81559 MiB\n" for i in range(8)))
        env = {
            "VERL_LAUNCHER_GPU_QUERY_FILE": str(query),
            "VERL_LAUNCHER_TOPO_FILE": str(FIXTURES / "hgx_8gpu_nv18_13nic_mlx5_ib_eth.txt"),
        }
        probe = collect_probe(env)
        spec = parse_launch_spec(
            {
                "apiVersion": "verl-operator.io/v1alpha1",
                "kind": "LaunchSpec",
                "job": {"name": "b", "namespace": "b"},
                "verlVersion": "0.9",
                "nnodes": 1,
                "gpusPerNode": 8,
                "head": {"host": "h"},
                "entrypoint": ["python3"],
                "expect": {"gpuProduct": "NVIDIA-H100-80GB-HBM3", "gpuMemoryMiB": 81559, "requireNvlink": True,
                           "nvlinkGroupSize": 8},
            }
        )  # fmt: skip
        median, best = timed(lambda: check_node(probe, spec), repeat)
        print(
            f"{'check_node, 8 GPUs, NVLink groups of 8':58} {8:>4} {median * 1e6:>10.1f} {best * 1e6:>9.1f}"
        )
        median, best = timed(lambda: collect_probe(env), max(1, repeat // 10))
        print(
            f"{'collect_probe from files (8 GPUs, 13 NICs)':58} {8:>4} {median * 1e6:>10.1f} {best * 1e6:>9.1f}"
        )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bench_ray() -> None:
    """Head + 1 worker as separate processes on this machine, each `ray start` with its own ports."""
    sys.path.insert(0, str(ROOT / "tests" / "ray"))
    from launcher_cluster import FAKE_VERL, FAST_RAY_ENV, node_args

    root = Path(tempfile.mkdtemp(prefix="vlb-"))
    port = free_port()
    spec = {
        "apiVersion": "verl-operator.io/v1alpha1",
        "kind": "LaunchSpec",
        "job": {"name": "bench", "namespace": "bench"},
        "verlVersion": "0.9",
        "nnodes": 2,
        "gpusPerNode": 2,
        "head": {"host": "127.0.0.1", "port": port, "dashboardPort": free_port()},
        "entrypoint": [sys.executable, FAKE_VERL],
        "timeouts": {"clusterReadySeconds": 120, "workerJoinSeconds": 120},
    }
    (root / "launch.json").write_text(json.dumps(spec))
    ray = str(Path(sys.executable).parent / "ray")
    base = {**os.environ, **FAST_RAY_ENV, "VERL_LAUNCH_SPEC": str(root / "launch.json"), "VERL_LAUNCHER_FAKE_GPUS": "2",
            "VERL_LAUNCHER_TERMINATION_LOG": str(root / "t"), "VERL_LAUNCHER_PROGRESS_FILE": str(root / "p.json")}  # fmt: skip
    common = [sys.executable, "-m", "verl_launcher"]
    procs = []
    try:
        start = time.monotonic()
        worker = subprocess.Popen(
            [*common, "worker", f"--ray-executable={ray}", "--num-cpus=1", "--retry-seconds=1",
             "--head-gone-grace-seconds=3", *node_args(head=False)],
            env=base, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        procs.append(worker)
        head = subprocess.run(
            [*common, "head", f"--ray-executable={ray}", "--num-cpus=1", "--poll-seconds=1",
             f"--ray-start-arg=--temp-dir={root / 'r'}", *node_args(head=True)],
            env=base, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        total = time.monotonic() - start
        ready = re.search(r"cluster ready after ([\d.]+)s", head.stdout)
        worker.wait(60)
        print(f"2-node local Ray: head exit {head.returncode}, worker exit {worker.returncode}")
        print(
            f"  cluster ready after {ready.group(1) if ready else '?'} s (head start -> 2 nodes, 4 GPUs registered)"
        )
        print(f"  whole head run {total:.1f} s (Ray start, wait, probes, fake verl, Ray stop)")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--ray", action="store_true", help="also time a 2-node local Ray bootstrap")
    args = parser.parse_args()
    bench_parser(args.repeat)
    if args.ray:
        bench_ray()


if __name__ == "__main__":
    main()
