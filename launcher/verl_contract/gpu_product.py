"""GPU product names: the one comparison rule of the planner, placement, the manifests and the launcher's check.

Spellings differ by source: ``nvidia-smi`` prints ``NVIDIA H100 80GB HBM3``, GPU Feature Discovery labels
``NVIDIA-H100-80GB-HBM3`` (``-SHARED`` appended under time-slicing), users write either, in any case, with or
without the vendor.
"""

from __future__ import annotations

import functools
import re

_SEPARATORS = re.compile(r"[\s_-]+")


@functools.lru_cache(maxsize=4096)  # called per node and job by the planner: a few spellings, many calls
def product_key(name: str) -> str:
    """The comparison key of a GPU product name: ``H100-80GB-HBM3`` for every spelling of that product.

    Upper case, ``-`` the only separator, without the vendor prefix ``NVIDIA-`` and the sharing suffix
    ``-SHARED``.
    """
    key = _SEPARATORS.sub("-", name.strip()).upper().strip("-")
    return key.removesuffix("-SHARED").removeprefix("NVIDIA-")


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
