"""Run-time patches that let verl 0.6.1's unmodified trainer run on CPU (the real-verl tier only).

Nothing here is part of the product or its image: the operator launches verl unmodified. The tests switch
the shim on with ``VERL_CPU_SHIM=1`` and this folder on ``PYTHONPATH`` (``sitecustomize.py``). Each patch is
applied right after the module it changes is first imported (a post-import hook), so names that other verl
modules import from it (``from verl.utils.device import get_nccl_backend``) see the patched function.

The patches (numbers as in docs/realverl.md; file and line of verl 0.6.1):

4. ``verl/utils/device.py`` 76-86: ``get_nccl_backend()`` returns ``"nccl"`` on a machine without a GPU;
   torch has no NCCL there. Here it returns ``"gloo"``.
5. ``verl/workers/fsdp_workers.py`` 150: the backend string ``cpu:gloo,{device}:{nccl backend}`` becomes
   ``cpu:gloo,cpu:gloo``, which ``torch.distributed.init_process_group`` refuses (a device type twice). Here
   the duplicate is dropped.
6. ``verl/utils/device.py`` 55-65: ``get_torch_device()`` is ``torch.cpu``, which lacks the memory and RNG
   calls verl makes (``memory_allocated``, ``max_memory_allocated``, ``memory_reserved``,
   ``max_memory_reserved``, ``get_rng_state``, ``set_rng_state``, ``manual_seed``, ``empty_cache``; first at
   ``fsdp_workers.py`` 884 and 612). Here ``torch.cpu`` gets them (memory figures 0, the RNG calls torch's).
7. ``verl/workers/fsdp_workers.py`` 518, 1399, 1704: the reference model's (and an offloaded critic's)
   ``CPUOffloadPolicy(pin_memory=True)`` needs an accelerator to pin memory for. Here it does not pin.
8. ``verl/utils/model.py`` 627 and 649 (the critic's value-head model) ask for ``flash_attention_2`` whatever
   ``override_config.attn_implementation`` says; flash-attn needs CUDA. Here a ``from_pretrained`` asking
   for ``flash_attention_2`` without flash-attn installed gets ``sdpa``.
10. ``verl/workers/rollout/base.py`` 81-86: the rollout registry holds vLLM's and SGLang's engines, both
    CUDA-only, and no ``("hf", "sync")`` entry (a lookup fails at 99); the shipped ``HFRollout``
    (``hf_rollout.py`` 41) cannot be built through it (its ``__init__`` calls ``BaseRollout.__init__``
    without its arguments). Here ``("vllm", "sync")``, the rollout the planner plans for verl 0.6, and
    ``("hf", "sync")`` resolve to :class:`verl_cpu_rollout.CpuHFRollout`: it builds the HF model from the
    job's model path and takes the trainer's weights through the hybrid engine's ``update_weights`` each
    step, as the vLLM sync rollout does; generation is the shipped ``HFRollout``'s own. The job's rollout
    settings (``rollout.n``, lengths, sampling) are verl's as planned; vLLM's own (memory share, batched
    tokens) have nothing to act on.
11. ``verl/utils/profiler/performance.py`` 232-234: a 0-d tensor is all-gathered into shape-(1,) tensors;
    NCCL accepts that, gloo refuses. Here the same function gathers a shape-(1,) tensor.

Item 9 of the reference (0.5.0's HF rollout repeating prompts n^2 times) does not concern 0.6.1; items 1-3
are configuration (fake GPUs in Ray, ``fsdp2``, ``sdpa``, no torch.compile), set by the tests.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

_PATCHES: dict[str, Callable[[ModuleType], None]] = {}


def _after_import(name: str) -> Callable[[Callable[[ModuleType], None]], Callable[[ModuleType], None]]:
    def register(patch: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
        _PATCHES[name] = patch
        return patch

    return register


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, patch: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._patch(module)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds the listed modules with the other finders and patches each once it has run."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


# 4 and 5 ------------------------------------------------------------------------------------------------
@_after_import("verl.utils.device")
def _device(module: ModuleType) -> None:
    import torch
    import torch.distributed

    if torch.cuda.is_available():
        return
    module.get_nccl_backend = lambda: "gloo"
    _torch_cpu_calls(torch)
    original = torch.distributed.init_process_group
    if getattr(original, "_verl_cpu_shim", False):
        return

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        backend = kwargs.get("backend")
        if isinstance(backend, str) and "," in backend:
            kwargs["backend"] = ",".join(dict.fromkeys(backend.split(",")))
        return original(*args, **kwargs)

    init_process_group._verl_cpu_shim = True  # type: ignore[attr-defined]
    torch.distributed.init_process_group = init_process_group


# 6 ------------------------------------------------------------------------------------------------------
def _torch_cpu_calls(torch: Any) -> None:
    zero = lambda *args, **kwargs: 0  # noqa: E731
    calls = {
        "memory_allocated": zero,
        "max_memory_allocated": zero,
        "memory_reserved": zero,
        "max_memory_reserved": zero,
        "reset_peak_memory_stats": lambda *args, **kwargs: None,
        "empty_cache": lambda: None,
        "get_rng_state": lambda *args, **kwargs: torch.get_rng_state(),
        "set_rng_state": lambda state, *args, **kwargs: torch.set_rng_state(state),
        "manual_seed": lambda seed: torch.manual_seed(seed),
        "manual_seed_all": lambda seed: torch.manual_seed(seed),
    }
    for name, call in calls.items():
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, call)


# 7 ------------------------------------------------------------------------------------------------------
@_after_import("verl.workers.fsdp_workers")
def _fsdp_workers(module: ModuleType) -> None:
    original = module.CPUOffloadPolicy
    if original is None:
        return

    def unpinned_offload_policy(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **{**kwargs, "pin_memory": False})

    module.CPUOffloadPolicy = unpinned_offload_policy


# 8 ------------------------------------------------------------------------------------------------------
@_after_import("transformers.models.auto.auto_factory")
def _auto_factory(module: ModuleType) -> None:
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        return
    base = module._BaseAutoModelClass
    original = base.from_pretrained.__func__

    def from_pretrained(cls: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("attn_implementation") == "flash_attention_2":
            kwargs["attn_implementation"] = "sdpa"
        return original(cls, *args, **kwargs)

    base.from_pretrained = classmethod(from_pretrained)


# 10 -----------------------------------------------------------------------------------------------------
@_after_import("verl.workers.rollout.base")
def _rollout_registry(module: ModuleType) -> None:
    for engine in ("vllm", "hf"):
        module._ROLLOUT_REGISTRY[(engine, "sync")] = "verl_cpu_rollout.CpuHFRollout"


# 11 -----------------------------------------------------------------------------------------------------
@_after_import("verl.utils.profiler.performance")
def _performance(module: ModuleType) -> None:
    import torch
    import torch.distributed as dist

    def topk_reduce_ratio_min_max(timing: float, k: int = 10) -> tuple[float, float, float]:
        if not dist.is_initialized():
            return -1.0, -1.0, -1.0
        device = module.get_device_id()
        timing_tensor = torch.tensor([timing], dtype=torch.float32, device=device)  # shape (1,), not 0-d
        tensor_list = [
            torch.zeros(1, dtype=torch.float32, device=device) for _ in range(dist.get_world_size())
        ]
        dist.all_gather(tensor_list, timing_tensor)
        stack = torch.stack(tensor_list)
        top_k_percentile = torch.quantile(stack, 1 - k / 100)
        tail_ratio = torch.mean((stack > top_k_percentile).float()).item()
        return tail_ratio, stack.min().item(), stack.max().item()

    module.topk_reduce_ratio_min_max = topk_reduce_ratio_min_max


def install() -> None:
    """Put the post-import hook first on ``sys.meta_path`` (once); patch modules already imported."""
    if any(isinstance(finder, _PostImportFinder) for finder in sys.meta_path):
        return
    sys.meta_path.insert(0, _PostImportFinder())
    for name, patch in _PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
