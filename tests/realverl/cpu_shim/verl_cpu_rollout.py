"""The ``("hf", "sync")`` rollout the CPU shim registers in verl 0.6.1 (patch 10 of ``verl_cpu_shim``).

verl 0.6.1 ships ``HFRollout`` (``verl/workers/rollout/hf_rollout.py``) but cannot build it through its
rollout registry: the registry has no ``hf`` entry and ``HFRollout.__init__(module, config)`` calls
``BaseRollout.__init__()`` without the config, model config and device mesh it requires. This class takes
the registry's arguments, builds the job's HF model on CPU once, and takes the trainer's current weights
through the hybrid engine's ``update_weights`` before each generation (``fsdp_workers.py`` 651-732, the path
the vLLM sync rollout takes); generation is the shipped ``HFRollout``'s own methods.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from transformers import AutoModelForCausalLM
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.hf_rollout import HFRollout


class CpuHFRollout(BaseRollout):
    """verl's HF rollout behind the registry's interface (weights from the trainer, HF ``generate``)."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any) -> None:
        super().__init__(config, model_config, device_mesh)
        path = self.model_config.local_path or self.model_config.path
        self.module = AutoModelForCausalLM.from_pretrained(
            path, torch_dtype=torch.float32, attn_implementation="sdpa"
        )
        self.module.eval()

    async def resume(self, tags: list[str]) -> None:
        """Nothing to bring back: the model stays in host memory."""

    async def release(self) -> None:
        """Nothing to free: the model stays in host memory."""

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], **kwargs: Any) -> None:
        """Copy the trainer's full weights (HF names, after ``convert_weight_keys``) into the model."""
        params = dict(self.module.named_parameters())
        params.update(dict(self.module.named_buffers()))
        with torch.no_grad():
            for name, tensor in weights:
                target = params.get(name)
                if target is not None:
                    target.copy_(tensor.detach().to(target.dtype))

    # verl's own HF generation (it reads only ``self.config`` and ``self.module``), on the current weights.
    generate_sequences = HFRollout.generate_sequences
    _generate_minibatch = HFRollout._generate_minibatch
