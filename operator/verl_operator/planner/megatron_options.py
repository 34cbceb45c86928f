"""The Megatron options the memory model and the rules read from a job's overrides, and the stage split.

Kept apart from ``megatron_memory.py`` so that ``inputs.py`` (the planner's problem) can hold the options
without importing the memory model, which reads the problem.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from verl_operator.api.plan import Violation
from verl_operator.api.settings_registry import SETTINGS
from verl_operator.planner.reader import Reader

#: Optimizer bytes per parameter: fp32 master + Adam m and v (``megatron_memory.py``'s notation).
OPTIMIZER_BYTES = 12

#: megatron-core's ``recompute_modules`` (0.14.0 ``transformer/transformer_config.py`` lines 869-877, 0.16.1
#: lines 1198-1206) and its default (lines 864-865 / 1193-1194; verl's config pins the same).
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
DEFAULT_MODULES = ("core_attn",)
RECOMPUTE_GRANULARITIES = ("full", "selective")
RECOMPUTE_METHODS = ("uniform", "block")
#: Megatron-Bridge's LoRA target modules that the memory model counts, verl 0.9.1's default
#: (``trainer/config/_generated_ppo_megatron_trainer.yaml`` ``model.lora.target_modules``).
LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


@dataclass(frozen=True)
class MegatronOptions:
    """The memory-relevant Megatron settings a spec pins through its overrides (defaults: verl's)."""

    grad_offload: bool = False
    #: ``optim.override_optimizer_config.optimizer_cpu_offload`` and its ``optimizer_offload_fraction``.
    optimizer_cpu_offload: bool = False
    optimizer_offload_fraction: float = 0.0
    recompute_granularity: str | None = None
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    #: ``override_transformer_config.recompute_modules`` as pinned (None: verl's and megatron-core's
    #: ``[core_attn]``); only selective recompute reads it.
    recompute_modules: tuple[str, ...] | None = None
    moe_grouped_gemm: bool | None = None
    moe_shared_expert_overlap: bool = False
    #: ``actor_rollout_ref.model.lora.rank`` (verl 0.9's Megatron LoRA, Megatron-Bridge's PEFT: the base
    #: weights frozen, the adapters of ``lora.target_modules`` trained) and those modules.
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = LORA_TARGETS
    #: verl 0.9's ``megatron.dynamic_context_parallel`` (no virtual pipeline with it).
    dynamic_cp: bool = False
    ref_param_offload: bool = False
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    account_for_embedding: bool = False
    account_for_loss: bool = False
    #: ``override_optimizer_config.use_precision_aware_optimizer``: megatron-core's ``OptimizerConfig``
    #: ``store_param_remainders`` (default True) then keeps only the 16 bits of the fp32 master weights that
    #: the bf16 weights lack.
    precision_aware_optimizer: bool = False

    @property
    def selective_modules(self) -> frozenset[str]:
        """The submodules selective recompute recomputes (empty unless ``recompute_granularity=selective``)."""
        if self.recompute_granularity != "selective":
            return frozenset()
        return frozenset(self.recompute_modules if self.recompute_modules is not None else DEFAULT_MODULES)

    @property
    def uneven(self) -> bool:
        """The job pins an uneven stage split: first / last stage layers, or the embedding or loss as a layer."""
        pins = (self.first_stage_layers, self.last_stage_layers) != (None, None)
        return pins or self.account_for_embedding or self.account_for_loss

    def split(self, layers: int, pp: int, vpp: int | None = None) -> tuple[int, ...] | None:
        """The layers of each of ``pp`` stages under these options (:func:`stage_layers`), or None."""
        return stage_layers(
            layers,
            pp,
            self.first_stage_layers,
            self.last_stage_layers,
            self.account_for_embedding,
            self.account_for_loss,
            vpp,
        )

    @property
    def optimizer_bytes(self) -> int:
        """Optimizer bytes per parameter: fp32 master (or its 2-byte remainder) + Adam m and v.

        The remainder is TransformerEngine's FusedAdam's; the hybrid CPU optimizer keeps full fp32 copies of
        the parameters it updates on the GPU whatever the precision setting (megatron-core 0.14.0
        ``optimizer/cpu_offloading/hybrid_optimizer.py`` line 277, ``param_update_in_fp32=True`` from
        ``optimizer/__init__.py`` line 334)."""
        if self.precision_aware_optimizer and not self.optimizer_cpu_offload:
            return OPTIMIZER_BYTES - 2
        return OPTIMIZER_BYTES

    @property
    def gpu_optimizer_share(self) -> float:
        """The share of the distributed optimizer's state kept on the GPU during the update."""
        return 1.0 - self.optimizer_offload_fraction if self.optimizer_cpu_offload else 1.0


#: ``MegatronOptions`` field -> the registry setting it is read from: ``megatron_`` and the field's name (a
#: field without its row fails here, at import).
OPTION_SETTINGS = {f.name: f"megatron_{f.name}" for f in fields(MegatronOptions)}
if _missing := [name for name in OPTION_SETTINGS.values() if name not in SETTINGS]:
    raise ImportError(f"MegatronOptions reads {_missing}, which api/settings_registry.py has no row for")


def options_of(r: Reader) -> MegatronOptions:
    """The Megatron memory options read from the overrides; a bad value is a violation in ``r.violations``."""
    fraction = 0.0
    pin = r.reads.get(OPTION_SETTINGS["optimizer_offload_fraction"])
    value = pin.value if pin is not None else None
    if pin is not None and value is not None:
        if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1:
            fraction = float(value)
        else:
            r.violations.append(
                Violation(
                    field=pin.source,
                    rule="override-type",
                    message=f"optimizer_offload_fraction {value!r} is not a number from 0 to 1",
                    suggestions=["write a fraction such as 0, 0.5 or 1.0"],
                )
            )
    granularity = r.get_str(OPTION_SETTINGS["recompute_granularity"], reads=True)
    method = r.get_str(OPTION_SETTINGS["recompute_method"], reads=True)
    # megatron-core reads the modules only for selective recompute
    selective = granularity == "selective"
    modules = r.get_strings(OPTION_SETTINGS["recompute_modules"], reads=True) if selective else None
    targets = r.get_strings(OPTION_SETTINGS["lora_targets"], reads=True)
    return MegatronOptions(
        grad_offload=bool(r.get_bool(OPTION_SETTINGS["grad_offload"], reads=True)),
        optimizer_cpu_offload=bool(r.get_bool(OPTION_SETTINGS["optimizer_cpu_offload"], reads=True)),
        optimizer_offload_fraction=fraction,
        recompute_granularity=None if granularity in (None, "null", "None") else granularity,
        recompute_method=None if method in (None, "null", "None") else method,
        recompute_num_layers=r.get_int(OPTION_SETTINGS["recompute_num_layers"], reads=True),
        recompute_modules=modules,
        lora_rank=r.get_int(OPTION_SETTINGS["lora_rank"], reads=True) or 0,
        dynamic_cp=bool(r.get_bool(OPTION_SETTINGS["dynamic_cp"], reads=True)),
        lora_targets=LORA_TARGETS if targets is None else targets,
        moe_grouped_gemm=r.get_bool(OPTION_SETTINGS["moe_grouped_gemm"], reads=True),
        moe_shared_expert_overlap=bool(r.get_bool(OPTION_SETTINGS["moe_shared_expert_overlap"], reads=True)),
        ref_param_offload=bool(r.get_bool(OPTION_SETTINGS["ref_param_offload"], reads=True)),
        first_stage_layers=r.get_int(OPTION_SETTINGS["first_stage_layers"], reads=True),
        last_stage_layers=r.get_int(OPTION_SETTINGS["last_stage_layers"], reads=True),
        account_for_embedding=bool(r.get_bool(OPTION_SETTINGS["account_for_embedding"], reads=True)),
        account_for_loss=bool(r.get_bool(OPTION_SETTINGS["account_for_loss"], reads=True)),
        precision_aware_optimizer=bool(r.get_bool(OPTION_SETTINGS["precision_aware_optimizer"], reads=True)),
    )


def stage_layers(
    layers: int,
    pp: int,
    first: int | None = None,
    last: int | None = None,
    embedding: bool = False,
    loss: bool = False,
    vpp: int | None = None,
) -> tuple[int, ...] | None:
    """The transformer layers of each pipeline stage as megatron-core builds them, or None if they do not split.

    Algorithm:
        Pinned first / last stage layers are taken as given and the remaining layers split evenly over the
        other stages; otherwise, with ``embedding`` / ``loss``, the embedding / the loss counts as one layer of
        the first / last stage and ``layers + extras`` split evenly. Example: Qwen3-235B-A22B, 94 layers, PP 8,
        both accounted: 96 / 8 = 12 per stage, so ``(11, 12, 12, 12, 12, 12, 12, 11)``; DeepSeek-V3, 61 layers,
        PP 12, last stage 6: ``(5 x 11, 6)``. With a virtual pipeline size ``vpp`` every pinned stage's layers
        and every middle stage's divide by it; with the embedding or loss accounted, each stage's share of
        ``layers + extras`` does (megatron-core 0.14.0 ``transformer/transformer_config.py`` lines 1004-1118,
        0.16.1 lines 1359-1480): Qwen3-235B-A22B accounted on PP 8 takes VPP 2, 3, 4, 6 or 12, not 5.
    """
    if pp <= 1:
        return (layers,) if first in (None, layers) and last in (None, layers) else None
    if first is not None or last is not None:
        inner = layers - (first or 0) - (last or 0)
        rest = pp - (first is not None) - (last is not None)
        if inner < 0 or (rest == 0 and inner) or (rest and inner % rest):
            return None
        each = inner // rest if rest else 0
        if vpp and any(n % vpp for n in (first, last, each if rest else None) if n is not None):
            return None
        return tuple(
            first if i == 0 and first is not None else last if i == pp - 1 and last is not None else each
            for i in range(pp)
        )
    total = layers + embedding + loss
    if total % pp:
        return None
    each = total // pp
    if vpp and each % vpp:
        return None
    out = [each] * pp
    out[0] -= embedding
    out[-1] -= loss
    return tuple(out) if min(out) >= 0 else None
