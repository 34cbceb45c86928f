"""GPU product names: the one comparison rule of the planner, placement, the manifests and the launcher's check.

Spellings differ by source: ``nvidia-smi`` prints ``NVIDIA H100 80GB HBM3``, GPU Feature Discovery labels
``NVIDIA-H100-80GB-HBM3`` (``-SHARED`` appended under time-slicing), users write either, in any case, with or
without the vendor. One physical part (model, form factor and memory) is also published under names that are not
respellings of NVML's: the PCI ID Repository (``lspci``) calls the H100 SXM ``H100 SXM5 80GB`` where NVML says
``H100 80GB HBM3``; those are :data:`PRODUCT_ALIASES`, resolved to NVML's name by :func:`product_key`.
"""

from __future__ import annotations

import functools
import re

_SEPARATORS = re.compile(r"[\s_-]+")

#: Other names of one physical GPU -> its NVML name (what ``nvidia-smi`` prints and GFD labels), both in
#: :func:`product_key` form. A name matches whatever the order of its words (``H100-80GB-SXM5`` too). Only
#: names that fix the model, the form factor and the memory are aliases: ``H100-80GB`` (SXM or PCIe) and
#: ``H100-SXM5`` (64, 80 or 94 GB) stay products of their own. Sources:
#: [nvml] the device names NVML reports (``nvidia-smi -L`` on each part; NVIDIA's data-center driver release
#: notes list them): ``NVIDIA H100 80GB HBM3``, ``NVIDIA H100 PCIe``, ``NVIDIA H100 NVL``, ``NVIDIA H200``,
#: ``NVIDIA A100-SXM4-80GB``, ``NVIDIA A100 80GB PCIe``, ``NVIDIA A100-PCIE-40GB``, ``Tesla V100-SXM2-16GB``.
#: [pci-ids] the PCI ID Repository (``lspci``, hwdata) device names: 10de:2330 ``H100 SXM5 80GB``,
#: 10de:2331 ``H100 PCIe``, 10de:2335 ``H200 SXM 141GB``, 10de:20b0 ``A100 SXM4 40GB``, 10de:20b2
#: ``A100 SXM4 80GB``, 10de:20b5 ``A100 PCIe 80GB``.
#: [catalogs] the clouds' and vendors' instance catalogs and GKE's accelerator names (``nvidia-h200-141gb``),
#: which spell the form factor ``SXM`` and add the memory.
PRODUCT_ALIASES: dict[str, tuple[str, ...]] = {
    "H100-80GB-HBM3": (
        "H100-SXM5-80GB",
        "H100-SXM-80GB",
        "H100-SXM5-80GB-HBM3",
    ),  # [nvml] [pci-ids] [catalogs]
    "H100-PCIE": ("H100-PCIE-80GB", "H100-80GB-HBM2E-PCIE"),  # [nvml] [pci-ids] [catalogs]
    "H100-NVL": ("H100-NVL-94GB",),  # [nvml] [catalogs]
    "H200": (
        "H200-SXM-141GB",
        "H200-SXM5-141GB",
        "H200-141GB",
        "H200-141GB-HBM3E",
    ),  # [nvml] [pci-ids] [catalogs]
    "A100-SXM4-80GB": ("A100-SXM-80GB",),  # [nvml] [pci-ids] [catalogs]
    "A100-SXM4-40GB": ("A100-SXM-40GB",),  # [nvml] [pci-ids] [catalogs]
    "A100-80GB-PCIE": ("A100-PCIE-80GB",),  # [nvml] [pci-ids]: the same words in another order
    "A100-PCIE-40GB": ("A100-40GB-PCIE",),  # [nvml] [catalogs]
}
#: Brand prefixes NVML and older GFD releases write or leave out (``Tesla T4``, ``NVIDIA A10G``, ``A100-SXM4-40GB``).
_BRANDS = ("NVIDIA-", "TESLA-")


def _words(key: str) -> frozenset[str]:
    return frozenset(w for w in key.split("-") if w)


_ALIAS_INDEX: dict[frozenset[str], str] = {
    _words(name): canonical for canonical, names in PRODUCT_ALIASES.items() for name in (canonical, *names)
}


@functools.lru_cache(maxsize=4096)  # called per node and job by the planner: a few spellings, many calls
def product_key(name: str) -> str:
    """The comparison key of a GPU product name: ``H100-80GB-HBM3`` for every spelling of that product.

    Upper case, ``-`` the only separator, without the brand prefix ``NVIDIA-`` or ``TESLA-`` and the sharing
    suffix ``-SHARED``; a name of :data:`PRODUCT_ALIASES` becomes its NVML name (``H100-SXM5-80GB`` ->
    ``H100-80GB-HBM3``).
    """
    key = _SEPARATORS.sub("-", name.strip()).upper().strip("-").removesuffix("-SHARED")
    for brand in _BRANDS:
        key = key.removeprefix(brand)
    return _ALIAS_INDEX.get(_words(key), key)


def product_tokens(name: str) -> tuple[str, ...]:
    """The ``-``-separated words of :func:`product_key` (``("H100", "80GB", "HBM3")``), for table look-ups."""
    return tuple(t for t in product_key(name).split("-") if t)


def same_product(a: str, b: str) -> bool:
    """Whether two GPU product spellings name the same product (their :func:`product_key` is equal)."""
    return product_key(a) == product_key(b)


def product_label(name: str) -> str:
    """The GPU Feature Discovery spelling of an nvidia-smi name: ``NVIDIA H100 80GB HBM3`` -> ``NVIDIA-H100-80GB-HBM3``.

    This is the value of the node label ``nvidia.com/gpu.product``, the spelling messages show.
    """
    return "-".join(name.split())
