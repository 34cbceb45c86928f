"""Collect one node's GPU facts (nvidia-smi listing + topology matrix) into a :class:`NodeProbe`.

Sources, in order (each can be injected for tests and for nodes without a driver in the container):

- ``VERL_LAUNCHER_GPU_QUERY_FILE``: a file holding ``--query-gpu`` CSV or ``-L`` output;
- ``VERL_LAUNCHER_TOPO_FILE``: a file holding ``nvidia-smi topo -m`` output;
- otherwise the executable ``$VERL_LAUNCHER_NVIDIA_SMI`` (default ``nvidia-smi``) is run with argv lists;
- ``VERL_LAUNCHER_FAKE_GPUS=<n>`` without a listing file stands for n unnamed GPUs of unknown memory
  (CPU-only test clusters).
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_contract.gpu_product import product_label
from verl_launcher.gpus import Gpu, GpuListParseError, parse_list_gpus, parse_query_gpu_csv
from verl_launcher.topology import Topology, TopologyParseError, parse_topo_matrix

NVIDIA_SMI_ENV = "VERL_LAUNCHER_NVIDIA_SMI"
TOPO_FILE_ENV = "VERL_LAUNCHER_TOPO_FILE"
GPU_QUERY_FILE_ENV = "VERL_LAUNCHER_GPU_QUERY_FILE"
FAKE_GPUS_ENV = "VERL_LAUNCHER_FAKE_GPUS"
NODE_NAME_ENV = "VERL_LAUNCHER_NODE_NAME"

#: nvidia-smi answers in well under a second; a hung driver must not hang the launcher.
NVIDIA_SMI_TIMEOUT_S = 60.0
QUERY_ARGS = ("--query-gpu=index,name,memory.total", "--format=csv,noheader")


@dataclass(frozen=True)
class NodeProbe:
    """What one node has.

    Attributes:
        node: The node's name for messages (``$VERL_LAUNCHER_NODE_NAME``, ``$POD_NAME`` or the hostname).
        ip: The node's IP (``$POD_IP``) when known.
        gpus: The GPUs listed by nvidia-smi (or fake ones).
        topology: The parsed ``topo -m`` matrix, None when unavailable.
        source: ``nvidia-smi``, ``file`` or ``fake``.
        errors: Why a part could not be collected (the check reports them).
    """

    node: str
    ip: str = ""
    gpus: tuple[Gpu, ...] = ()
    topology: Topology | None = None
    source: str = "nvidia-smi"
    errors: tuple[str, ...] = field(default=())

    @property
    def nvlink_domain_size(self) -> int:
        """Smallest NVLink domain of the node's GPUs (1 when there is no NVLink or no matrix)."""
        if self.topology is None:
            return 1
        return max(1, self.topology.nvlink_domain_size)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (the ``probe --format json`` output)."""
        topo = self.topology
        return {
            "node": self.node,
            "ip": self.ip,
            "source": self.source,
            "gpuCount": len(self.gpus),
            "gpus": [
                {
                    "index": g.index,
                    "name": g.name,
                    "product": product_label(g.name),
                    "memoryMiB": g.memory_mib,
                }
                for g in self.gpus
            ],
            "nvlinkDomainSize": self.nvlink_domain_size,
            "nvlinkDomains": (
                [
                    {"gpus": list(d.gpus), "allToAll": d.all_to_all, "minLinks": d.min_links}
                    for d in topo.nvlink_domains
                ]
                if topo
                else None
            ),
            "nics": list(topo.nics) if topo else [],
            "numaAffinity": [a.numa_affinity for a in topo.affinity] if topo else [],
            "warnings": list(topo.warnings) if topo else [],
            "errors": list(self.errors),
        }


def node_name(env: Mapping[str, str]) -> str:
    """The name used for this node in messages."""
    return env.get(NODE_NAME_ENV) or env.get("POD_NAME") or socket.gethostname()


def _run(argv: list[str]) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise OSError(
            f"`{' '.join(argv)}` exited {result.returncode}: {detail[-1] if detail else 'no output'}"
        )
    return result.stdout


def parse_gpu_listing(text: str) -> tuple[Gpu, ...]:
    """Parse either nvidia-smi listing (``--query-gpu`` CSV or ``-L``), choosing by the first line."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    if first.startswith("GPU "):
        return parse_list_gpus(text)
    return parse_query_gpu_csv(text)


def collect_probe(env: Mapping[str, str] | None = None) -> NodeProbe:
    """Collect this node's probe. Never raises: problems are recorded in ``errors``.

    Args:
        env: The environment to read the injection variables from (default ``os.environ``).

    Returns:
        The probe.
    """
    env = os.environ if env is None else env
    smi = env.get(NVIDIA_SMI_ENV, "nvidia-smi")
    errors: list[str] = []
    gpus: tuple[Gpu, ...] = ()
    topology: Topology | None = None
    source = "nvidia-smi"

    query_file = env.get(GPU_QUERY_FILE_ENV)
    fake = env.get(FAKE_GPUS_ENV)
    try:
        if query_file:
            source = "file"
            gpus = parse_gpu_listing(Path(query_file).read_text(encoding="utf-8"))
        elif fake is not None:
            source = "fake"
            count = int(fake)
            gpus = tuple(Gpu(index=i, name="fake") for i in range(count))
        else:
            gpus = parse_query_gpu_csv(_run([smi, *QUERY_ARGS]))
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        errors.append(f"GPU listing: {exc}")

    topo_file = env.get(TOPO_FILE_ENV)
    try:
        if topo_file:
            topology = parse_topo_matrix(Path(topo_file).read_text(encoding="utf-8"))
        elif source == "nvidia-smi" and gpus:
            topology = parse_topo_matrix(_run([smi, "topo", "-m"]))
    except (OSError, TopologyParseError, subprocess.SubprocessError) as exc:
        errors.append(f"topology: {exc}")

    if topology is not None and gpus and topology.gpu_count != len(gpus):
        errors.append(f"topology shows {topology.gpu_count} GPUs but the listing shows {len(gpus)}")
    return NodeProbe(
        node=node_name(env),
        ip=env.get("POD_IP", ""),
        gpus=gpus,
        topology=topology,
        source=source,
        errors=tuple(errors),
    )


__all__ = ["GpuListParseError", "NodeProbe", "collect_probe", "node_name", "parse_gpu_listing"]
