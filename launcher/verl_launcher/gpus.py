"""Parse nvidia-smi's GPU listings: ``--query-gpu=index,name,memory.total --format=csv,noheader`` and ``-L``."""

from __future__ import annotations

import re
from dataclasses import dataclass

_MEMORY = re.compile(r"^(\d+)(?:\s*MiB)?$")
_LIST_LINE = re.compile(r"^GPU (\d+): (.+?)(?: \(UUID: ([^)]+)\))?\s*$")
_MIG_LINE = re.compile(r"^\s+MIG .*Device\s+\d+:")


class GpuListParseError(ValueError):
    """The GPU listing could not be read; the message names the line."""


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as nvidia-smi lists it.

    Attributes:
        index: nvidia-smi's index.
        name: The product name (``NVIDIA H100 80GB HBM3``).
        memory_mib: Total memory in MiB, or None when the listing does not show it (``-L``).
        uuid: The GPU UUID when listed.
        mig_devices: Number of MIG devices listed under the GPU (``-L`` only).
    """

    index: int
    name: str
    memory_mib: int | None = None
    uuid: str = ""
    mig_devices: int = 0


def parse_query_gpu_csv(text: str) -> tuple[Gpu, ...]:
    """Parse ``nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader[,nounits]``.

    Args:
        text: The command's stdout. A header line (``index, name, memory.total [MiB]``) is skipped.

    Returns:
        The GPUs in index order.

    Raises:
        GpuListParseError: A line does not have three fields, or the index or memory is not a number.
    """
    gpus: list[Gpu] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.strip().lower().startswith("index"):
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3:
            raise GpuListParseError(
                f"line {number}: expected 'index, name, memory.total', got {len(fields)} field(s): {line.strip()!r}"
            )
        index_text, name, memory_text = fields
        memory = _MEMORY.match(memory_text)
        if not index_text.isdigit():
            raise GpuListParseError(f"line {number}: index {index_text!r} is not a number")
        if memory is None:
            raise GpuListParseError(f"line {number}: memory.total {memory_text!r} is not '<n> MiB'")
        gpus.append(Gpu(index=int(index_text), name=name, memory_mib=int(memory.group(1))))
    return tuple(sorted(gpus, key=lambda g: g.index))


def parse_list_gpus(text: str) -> tuple[Gpu, ...]:
    """Parse ``nvidia-smi -L`` (``GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)``, MIG lines below a GPU).

    Args:
        text: The command's stdout.

    Returns:
        The GPUs in index order (memory unknown).

    Raises:
        GpuListParseError: A non-empty line is neither a GPU line nor a MIG device line.
    """
    gpus: list[Gpu] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        match = _LIST_LINE.match(line)
        if match:
            gpus.append(Gpu(index=int(match.group(1)), name=match.group(2), uuid=match.group(3) or ""))
        elif _MIG_LINE.match(line) and gpus:
            last = gpus[-1]
            gpus[-1] = Gpu(last.index, last.name, last.memory_mib, last.uuid, last.mig_devices + 1)
        else:
            raise GpuListParseError(
                f"line {number}: not a 'GPU <i>: <name> (UUID: ...)' line: {line.strip()!r}"
            )
    return tuple(sorted(gpus, key=lambda g: g.index))
