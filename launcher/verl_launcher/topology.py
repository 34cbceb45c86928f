"""Parse ``nvidia-smi topo -m`` into a small model: GPU links, NVLink domains, NICs, CPU/NUMA affinity.

The GPU x GPU block is the part that matters (it decides NVLink domains) and is parsed strictly: it must be
square, have ``X`` on the diagonal, hold only known link codes and be symmetric. The NIC columns and the
affinity columns are informational and parsed on a best-effort basis: when they do not line up (a paste
that lost a tab, for example) they are dropped and a warning says why, instead of failing the probe.

Tolerated: junk lines above the header (a shell prompt), a header without its leading tab, tabs or spaces,
empty CPU-affinity cells, NIC columns named ``NIC#`` or directly ``mlx5_#``, a missing or truncated legend.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: Link codes nvidia-smi prints between two devices (``SOC`` is the pre-2017 name of ``SYS``).
PCIE_CODES = frozenset({"PIX", "PXB", "PHB", "NODE", "SYS", "SOC", "PSB"})
_NV = re.compile(r"^NV(\d+)$")
_GPU = re.compile(r"^GPU(\d+)$")
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")


class TopologyParseError(ValueError):
    """The text is not a usable ``nvidia-smi topo -m`` matrix; the message says where and why."""


@dataclass(frozen=True)
class GpuAffinity:
    """The affinity columns of one GPU row (empty string when nvidia-smi printed nothing or ``N/A``)."""

    cpu_affinity: str = ""
    numa_affinity: str = ""
    gpu_numa_id: str = ""


@dataclass(frozen=True)
class NvlinkDomain:
    """A connected component of the NVLink graph (GPUs joined by ``NV#`` cells, directly or not).

    Attributes:
        gpus: GPU indices in the domain, ascending.
        all_to_all: True when every pair in the domain has a direct ``NV#`` link (NVSwitch, bridge pair).
        min_links: The smallest ``#`` of a direct link inside the domain (0 for a single GPU).
    """

    gpus: tuple[int, ...]
    all_to_all: bool
    min_links: int

    @property
    def size(self) -> int:
        """Number of GPUs in the domain."""
        return len(self.gpus)


@dataclass(frozen=True)
class Topology:
    """The parsed matrix.

    Attributes:
        gpu_count: GPUs in the matrix.
        links: ``links[i][j]`` is the cell text between GPU i and GPU j (``X`` on the diagonal).
        nics: NIC column names, with the legend's device names resolved (``mlx5_0``) when present.
        nic_links: ``nic_links[i][k]`` is the cell between GPU i and NIC k; empty when unparsable.
        affinity: The affinity columns per GPU; empty when unparsable.
        warnings: What was tolerated or dropped while parsing.
    """

    gpu_count: int
    links: tuple[tuple[str, ...], ...]
    nics: tuple[str, ...] = ()
    nic_links: tuple[tuple[str, ...], ...] = ()
    affinity: tuple[GpuAffinity, ...] = ()
    warnings: tuple[str, ...] = field(default=())

    def nvlink_width(self, a: int, b: int) -> int:
        """Bonded NVLinks between GPUs ``a`` and ``b`` (0 when the path is PCIe)."""
        match = _NV.match(self.links[a][b])
        return int(match.group(1)) if match else 0

    def nvlinked(self, gpus: tuple[int, ...] | list[int]) -> bool:
        """True when every pair of ``gpus`` has a direct NVLink (a group tensor parallelism can use)."""
        return all(self.nvlink_width(a, b) > 0 for i, a in enumerate(gpus) for b in gpus[i + 1 :])

    @property
    def nvlink_domains(self) -> tuple[NvlinkDomain, ...]:
        """Connected components of the NVLink graph, singletons included, ordered by first GPU."""
        parent = list(range(self.gpu_count))

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for a in range(self.gpu_count):
            for b in range(a + 1, self.gpu_count):
                if self.nvlink_width(a, b) > 0:
                    parent[root(a)] = root(b)
        groups: dict[int, list[int]] = {}
        for gpu in range(self.gpu_count):
            groups.setdefault(root(gpu), []).append(gpu)
        domains = []
        for members in sorted(groups.values()):
            widths = [self.nvlink_width(a, b) for i, a in enumerate(members) for b in members[i + 1 :]]
            domains.append(
                NvlinkDomain(
                    gpus=tuple(members),
                    all_to_all=all(w > 0 for w in widths),
                    min_links=min((w for w in widths if w > 0), default=0),
                )
            )
        return tuple(domains)

    @property
    def nvlink_domain_size(self) -> int:
        """The smallest NVLink domain any GPU belongs to (1 = some GPU has no NVLink; 0 = no GPUs)."""
        return min((d.size for d in self.nvlink_domains), default=0)


def _is_cell(token: str) -> bool:
    return token == "X" or token in PCIE_CODES or bool(_NV.match(token))


def _find_header(lines: list[str]) -> int:
    for number, line in enumerate(lines):
        tokens = line.split()
        if tokens and tokens[0] == "GPU0" and (len(tokens) == 1 or tokens[1] != "X"):
            return number
    raise TopologyParseError(
        "no header line found: expected a line listing GPU0 GPU1 ... as `nvidia-smi topo -m` prints it"
    )


def _split_header(line: str) -> tuple[int, list[str], list[str]]:
    """Return (GPU count, NIC column names, trailing column names) of the header line."""
    tokens = line.split()
    gpus = 0
    while gpus < len(tokens) and tokens[gpus] == f"GPU{gpus}":
        gpus += 1
    rest = tokens[gpus:]
    try:
        tail_start = rest.index("CPU")
    except ValueError:
        tail_start = len(rest)
    nics = rest[:tail_start]
    if any(_GPU.match(t) for t in nics):
        raise TopologyParseError(f"header lists GPU columns out of order: {' '.join(tokens[: gpus + 3])} ...")
    # Columns after the NICs: "CPU Affinity", "NUMA Affinity", "GPU NUMA ID" (names hold spaces).
    tail_text = " ".join(rest[tail_start:])
    tail = [name for name in ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID") if name in tail_text]
    return gpus, nics, tail


def _parse_nic_legend(lines: list[str]) -> dict[str, str]:
    legend: dict[str, str] = {}
    in_legend = False
    for line in lines:
        if line.strip() == "NIC Legend:":
            in_legend = True
            continue
        if in_legend:
            match = _NIC_LEGEND.match(line)
            if match:
                legend[match.group(1)] = match.group(2)
    return legend


def _affinity(row: str, consumed: int, tail: list[str]) -> GpuAffinity | None:
    """Read the trailing columns; ``consumed`` is the number of leading fields already used.

    With tabs, empty cells survive (``split("\\t")``), and nvidia-smi puts one extra tab before
    ``GPU NUMA ID``: CPU and NUMA affinity are the first two fields, the GPU NUMA ID the last non-empty one.
    With spaces, the tokens are taken in order; more tokens than columns means the row does not line up.
    """
    if "\t" in row:
        rest = [f.strip() for f in row.rstrip("\n").split("\t")][consumed:]
    else:
        rest = row.split()[consumed:]
        if len(rest) > len(tail):
            return None
    values = dict(zip(tail, rest, strict=False))
    if "GPU NUMA ID" in tail and "\t" in row:
        values["GPU NUMA ID"] = next((v for v in reversed(rest[len(tail) - 1 :]) if v), "")

    def clean(name: str) -> str:
        value = values.get(name, "")
        return "" if value == "N/A" else value

    return GpuAffinity(
        cpu_affinity=clean("CPU Affinity"),
        numa_affinity=clean("NUMA Affinity"),
        gpu_numa_id=clean("GPU NUMA ID"),
    )


def parse_topo_matrix(text: str) -> Topology:
    """Parse the output of ``nvidia-smi topo -m``.

    Algorithm:
        Find the header (the first line whose first token is ``GPU0`` and whose second is not ``X``), count
        its ``GPU<i>`` columns (n), take every following line labelled ``GPU<i>`` as a row and read its first
        n whitespace-separated tokens as the GPU x GPU block. Validate the block, then read NIC and affinity
        columns if they line up. Domains are connected components of the ``NV#`` cells. Example: a row
        ``GPU0  X  NV12 SYS SYS`` / ``GPU1 NV12 X SYS SYS`` / ... with GPU2-GPU3 also ``NV12`` gives the
        domains {0,1} and {2,3}, so ``nvlink_domain_size`` is 2.

    Args:
        text: The command's output (stdout), as printed.

    Returns:
        The parsed topology.

    Raises:
        TopologyParseError: The header is missing, a GPU row is missing or out of order, a cell is not a
            link code, the diagonal is not ``X`` or the block is not symmetric.
    """
    lines = text.splitlines()
    start = _find_header(lines)
    gpu_count, nic_names, tail = _split_header(lines[start])
    warnings: list[str] = []
    if gpu_count == 0:
        raise TopologyParseError(f"line {start + 1}: the header names no GPU columns")
    if start > 0:
        warnings.append(f"skipped {start} line(s) above the header")
    rows = _gpu_rows(lines, start, gpu_count)
    links = _gpu_block(rows, gpu_count)
    nics = _nic_columns([row for _, row in rows], gpu_count, nic_names, tail)
    if nics is None:
        warnings.append(
            "the NIC and affinity columns do not line up with the header "
            f"({' '.join(nic_names) or 'no NICs'}); they were ignored, the GPU x GPU block is intact"
        )
        return Topology(gpu_count=gpu_count, links=links, warnings=tuple(warnings))
    nic_links, affinity = nics
    legend = _parse_nic_legend(lines[start:])
    return Topology(
        gpu_count=gpu_count,
        links=links,
        nics=tuple(legend.get(name, name) for name in nic_names),
        nic_links=nic_links,
        affinity=affinity,
        warnings=tuple(warnings),
    )


def _gpu_rows(lines: list[str], start: int, gpu_count: int) -> list[tuple[int, str]]:
    """The ``GPU<i>`` lines after the header (up to the first blank line after them), with their numbers.

    Raises:
        TopologyParseError: Their count is not the header's.
    """
    rows: list[tuple[int, str]] = []
    for number in range(start + 1, len(lines)):
        tokens = lines[number].split()
        if not tokens:
            if rows:
                break
            continue
        if _GPU.match(tokens[0]):
            rows.append((number, lines[number]))
    if len(rows) != gpu_count:
        raise TopologyParseError(
            f"the header names {gpu_count} GPUs but {len(rows)} GPU rows follow (truncated output?)"
        )
    return rows


def _gpu_block(rows: list[tuple[int, str]], gpu_count: int) -> tuple[tuple[str, ...], ...]:
    """The GPU x GPU link codes, checked: rows in order, link codes only, ``X`` on the diagonal, symmetric.

    Raises:
        TopologyParseError: A check failed (the message names the line and the cell).
    """
    links: list[tuple[str, ...]] = []
    for index, (number, row) in enumerate(rows):
        tokens = row.split()
        if tokens[0] != f"GPU{index}":
            raise TopologyParseError(f"line {number + 1}: expected row GPU{index}, found {tokens[0]}")
        cells = tokens[1 : 1 + gpu_count]
        if len(cells) < gpu_count:
            raise TopologyParseError(
                f"line {number + 1}: GPU{index} has {len(cells)} cells, expected {gpu_count}"
            )
        for column, cell in enumerate(cells):
            if not _is_cell(cell):
                raise TopologyParseError(
                    f"line {number + 1}: GPU{index} x GPU{column} is {cell!r}, not a link code "
                    "(X, NV#, PIX, PXB, PHB, NODE, SYS)"
                )
            if (column == index) != (cell == "X"):
                raise TopologyParseError(f"line {number + 1}: GPU{index} x GPU{column} is {cell!r}")
        links.append(tuple(cells))
    for a in range(gpu_count):
        for b in range(a + 1, gpu_count):
            if links[a][b] != links[b][a]:
                raise TopologyParseError(
                    f"the matrix is not symmetric: GPU{a} x GPU{b} is {links[a][b]} but GPU{b} x GPU{a} is "
                    f"{links[b][a]}"
                )
    return tuple(links)


def _nic_columns(
    rows: list[str], gpu_count: int, nic_names: list[str], tail: list[str]
) -> tuple[tuple[tuple[str, ...], ...], tuple[GpuAffinity, ...]] | None:
    """Each GPU row's NIC link codes and affinity columns, or None when they do not line up with the header."""
    # A NIC column name with a digit followed by a capital (``NIC7NIC8``) is two names that lost their tab.
    if not all(re.match(r"^[A-Za-z][\w.\-]*$", n) and not re.search(r"\d[A-Z]", n) for n in nic_names):
        return None
    nic_links: list[tuple[str, ...]] = []
    affinity: list[GpuAffinity] = []
    for row in rows:
        cells = row.split()[1 + gpu_count : 1 + gpu_count + len(nic_names)]
        if len(cells) != len(nic_names) or not all(_is_cell(c) for c in cells):
            return None
        parsed = _affinity(row, 1 + gpu_count + len(nic_names), tail)
        if parsed is None:
            return None
        nic_links.append(tuple(cells))
        affinity.append(parsed)
    return tuple(nic_links), tuple(affinity)
