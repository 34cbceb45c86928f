"""What verl's Megatron workers check before they load the model; runs INSIDE a verl virtualenv.

``verl_runner.py`` calls ``megatron_checks`` after its other stages when the actor's strategy is ``megatron``.
The checks, in the order a Megatron worker meets them (each raises ``CheckFailed`` with its stage):

1. ``megatron_engine`` (verl 0.9 only): the asserts of the engine worker and the Megatron engine's
   constructor that read only the config: ``actor.use_dynamic_bsz == rollout.log_prob_use_dynamic_bsz``
   (0.9.1 ``workers/engine_workers.py`` line 616), ``use_mbridge must be True``
   (0.9.1 ``workers/engine/megatron/transformer_impl.py`` line 191) and dynamic context parallelism's
   (``_check_dcp_unsupported_features``, lines 111-124: padding removed, no bucket padding, no VPP).
2. ``megatron_parallel_state``: the arithmetic of megatron-core's ``parallel_state.initialize_model_parallel``,
   which both releases call with the actor's ``megatron`` sizes (0.6.1 ``workers/megatron_workers.py`` lines
   210-219; 0.9.1 ``transformer_impl.py`` lines 271-281). The function itself needs ``torch.distributed``
   initialised over the whole world, so its checks are restated here with megatron-core's messages
   (megatron-core 0.14.0 ``parallel_state.py`` lines 651-660 and 697-706, 0.16.1 lines 740-749 and 785-794):
   ``world % (TP x PP x CP)``, a virtual pipeline size needs ``PP > 1``, ``world % (ETP x EP x PP)``.
3. ``megatron_model`` (verl 0.6 without mbridge): verl's own registry has the model's architecture
   (``hf_to_mcore_config``, 0.6.1 ``models/mcore/registry.py`` lines 193-194, called from
   ``workers/megatron_workers.py`` line 173).
4. ``megatron_transformer_config``: megatron-core's own ``TransformerConfig`` (its ``__post_init__``: heads
   and query groups by TP, sequence parallelism needs TP, EP with TP needs sequence parallelism, the
   first/last pipeline-stage layer pins, VPP, MoE and recompute settings) built from the model's numbers as
   verl 0.6.1's ``models/mcore/config_converter.py`` ``_get_base_transformer_config`` (lines 56-91) does,
   with the actor's ``override_transformer_config`` on top (keys the class lacks dropped, as
   ``check_and_construct_configs``, lines 137-160, does; the kernel choices of ``KERNEL_KEYS`` left out); then megatron-core's ``get_num_layers_to_build``
   (``transformer/transformer_block.py``) for every pipeline rank and virtual stage, with
   ``parallel_state``'s sizes and ranks set through its own setters (no process group needed).
5. ``megatron_batch``: the mini-batch normalisation by Megatron's DP = ``world / (TP x PP x CP)``: 0.6.1
   ``megatron_workers.py`` lines 271-274 (actor) and 923-924 (critic) compute ``mini x n // DP``; 0.9.1
   ``engine_workers.py`` lines 267-270 assert ``(mini x n) % DP == 0``; both then iterate each rank's
   ``B x n / DP`` rows in mini-batches of that size, asserting divisibility (0.6.1 ``protocol.py`` line 823,
   0.9.1 ``utils/tensordict_utils.py`` line 588; a mini-batch of 0 rows divides by zero there).

megatron-core comes from the environment's pins (``verl_envs.py``: 0.14.0 for verl 0.6.1, the version of its
``docker/`` images; 0.16.1 for verl 0.9.1, whose ``[cpu]`` extra asks for an unpinned megatron-core); it
imports and builds these configs without a GPU.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

#: HF config attributes -> TransformerConfig fields (verl 0.6.1 ``config_converter.py`` lines 58-65).
_BASE_FIELDS = (
    ("num_hidden_layers", "num_layers"),
    ("hidden_size", "hidden_size"),
    ("num_attention_heads", "num_attention_heads"),
    ("num_key_value_heads", "num_query_groups"),
    ("intermediate_size", "ffn_hidden_size"),
    ("head_dim", "kv_channels"),
)
_EXPERTS = ("num_experts", "n_routed_experts", "num_local_experts")
#: ``override_transformer_config`` keys that choose kernels: megatron-core checks them against the installed
#: transformer-engine / apex / DeepEP kernels (verl's GPU images carry them, these environments do not), so
#: they are left out of the configuration that is checked; every other key is kept.
KERNEL_KEYS = frozenset(
    {
        "apply_rope_fusion",
        "bias_activation_fusion",
        "bias_dropout_fusion",
        "masked_softmax_fusion",
        "gradient_accumulation_fusion",
        "moe_permute_fusion",
        "moe_grouped_gemm",
        "moe_enable_deepep",
        "moe_token_dispatcher_type",
        "persist_layer_norm",
        "attention_backend",
    }
)


class MegatronCheckFailed(Exception):
    """A Megatron check failed; ``verl_runner`` reports ``stage`` and ``error``."""

    def __init__(self, stage: str, error: BaseException) -> None:
        super().__init__(stage)
        self.stage = stage
        self.error = error


def _minor(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:2])


def _sizes(megatron: Any) -> dict[str, Any]:
    tp = int(megatron.tensor_model_parallel_size)
    etp = megatron.get("expert_tensor_parallel_size")
    vpp = megatron.get("virtual_pipeline_model_parallel_size")
    return {
        "tp": tp,
        "pp": int(megatron.pipeline_model_parallel_size),
        "cp": int(megatron.get("context_parallel_size") or 1),
        "ep": int(megatron.get("expert_model_parallel_size") or 1),
        "etp": int(etp) if etp is not None else None,
        "vpp": int(vpp) if vpp is not None else None,
    }


def _engine(version: str, config: Any) -> None:
    if _minor(version) < (0, 7):
        return
    arr = config.actor_rollout_ref
    if bool(arr.actor.use_dynamic_bsz) != bool(arr.rollout.log_prob_use_dynamic_bsz):
        raise AssertionError(
            "actor.use_dynamic_bsz != rollout.log_prob_use_dynamic_bsz (engine_workers.py: "
            "assert self.config.actor.use_dynamic_bsz == self.config.rollout.log_prob_use_dynamic_bsz)"
        )
    if not arr.actor.megatron.get("use_mbridge", True):
        raise AssertionError("use_mbridge must be True")
    # _check_dcp_unsupported_features (0.9.1 transformer_impl.py lines 111-124), called by the constructor
    megatron = arr.actor.megatron
    if megatron.get("dynamic_context_parallel", False):
        if not megatron.get("use_remove_padding", True):
            raise ValueError("dynamic_context_parallel requires use_remove_padding=True")
        if megatron.get("pad_to_length", False):
            raise NotImplementedError("dynamic_context_parallel does not support pad_to_length")
        if megatron.get("virtual_pipeline_model_parallel_size") not in (None, 1):
            raise NotImplementedError("Dynamic CP does not support virtual pipeline parallelism")


def _parallel_state(world: int, s: dict[str, Any]) -> int:
    """megatron-core ``initialize_model_parallel``'s arithmetic; returns the data-parallel size."""
    model_size = s["tp"] * s["pp"] * s["cp"]
    if world % model_size != 0:
        raise RuntimeError(f"world_size ({world}) is not divisible by {model_size}")
    if s["vpp"] is not None and not s["pp"] > 1:
        raise RuntimeError("pipeline-model-parallel size should be greater than 1 with interleaved schedule")
    etp = s["etp"] if s["etp"] is not None else s["tp"]
    expert = etp * s["ep"] * s["pp"]
    if world % expert != 0:
        raise RuntimeError(
            f"world_size ({world}) is not divisible by expert_tensor_model_pipeline_parallel size ({expert})"
        )
    return world // model_size


def _model(version: str, megatron: Any, model_dir: Path) -> None:
    """verl 0.6.1's own registry lookup of the model's architecture, as ``hf_to_mcore_config`` makes it
    (``models/mcore/registry.py`` lines 193-194) for a worker without mbridge; mbridge (0.6 with
    ``use_mbridge``) and Megatron-Bridge (0.9) are not installed in these environments."""
    if _minor(version) >= (0, 7) or megatron.get("use_mbridge", False):
        return
    from transformers import AutoConfig
    from verl.models.mcore.registry import MODEL_CONFIG_CONVERTER_REGISTRY, get_supported_model

    hf = AutoConfig.from_pretrained(model_dir)
    assert len(hf.architectures) == 1, "Only one architecture is supported for now"
    _ = MODEL_CONFIG_CONVERTER_REGISTRY[get_supported_model(hf.architectures[0])]  # verl's KeyError too


def _transformer_config(s: dict[str, Any], sequence_parallel: bool, megatron: Any, model_dir: Path) -> None:
    import torch
    from megatron.core import parallel_state as mpu
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig
    from omegaconf import OmegaConf
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(model_dir)
    args: dict[str, Any] = {
        field: getattr(hf, attribute) for attribute, field in _BASE_FIELDS if getattr(hf, attribute, None)
    }
    experts = next((getattr(hf, name) for name in _EXPERTS if getattr(hf, name, None)), None)
    if experts:
        args["num_moe_experts"] = int(experts)
        args["moe_router_topk"] = int(getattr(hf, "num_experts_per_tok", 1) or 1)
        args["moe_ffn_hidden_size"] = getattr(hf, "moe_intermediate_size", None) or args.get(
            "ffn_hidden_size"
        )
    args.update(
        pipeline_dtype=torch.bfloat16,
        params_dtype=torch.bfloat16,
        bf16=True,
        tensor_model_parallel_size=s["tp"],
        pipeline_model_parallel_size=s["pp"],
        expert_model_parallel_size=s["ep"],
        expert_tensor_parallel_size=s["etp"] if s["etp"] is not None else s["tp"],
        virtual_pipeline_model_parallel_size=s["vpp"],
        context_parallel_size=s["cp"],
        overlap_p2p_comm=s["vpp"] is not None and s["vpp"] > 1,
        batch_p2p_comm=False,
        sequence_parallel=sequence_parallel,
        variable_seq_lengths=True,
        moe_token_dispatcher_type="alltoall",
        add_bias_linear=False,  # every architecture's converter sets it (config_converter.py)
    )
    overrides = OmegaConf.to_container(megatron.get("override_transformer_config") or {}, resolve=True)
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    args.update(
        {k: v for k, v in dict(overrides).items() if k in fields and k not in KERNEL_KEYS}  # type: ignore[arg-type]
    )
    tf_config = TransformerConfig(**args)
    # get_num_layers_to_build reads the pipeline sizes and this rank's place from parallel_state.
    mpu.set_pipeline_model_parallel_world_size(s["pp"])
    mpu.set_virtual_pipeline_model_parallel_world_size(s["vpp"])
    try:
        for rank in range(s["pp"]):
            mpu.set_pipeline_model_parallel_rank(rank)
            for stage in range(s["vpp"] or 1) if s["vpp"] else [None]:
                get_num_layers_to_build(tf_config, vp_stage=stage)
    finally:
        mpu.set_pipeline_model_parallel_world_size(None)
        mpu.set_virtual_pipeline_model_parallel_world_size(None)
        mpu.set_pipeline_model_parallel_rank(None)


def _batch(version: str, name: str, train_batch: int, mini: int, n: int, dp: int) -> None:
    if _minor(version) >= (0, 7):
        if (mini * n) % dp:
            raise AssertionError(f"[{name}] Got mini_batch_size={mini * n} and get_data_parallel_size()={dp}")
        per_rank = mini * n // dp
    else:
        per_rank = mini * n // dp  # ppo_mini_batch_size *= rollout.n; //= data parallel size
    rows = train_batch * n
    if rows % dp:
        return  # the trainer's split over the DP ranks, not a worker check
    if per_rank == 0:
        raise ZeroDivisionError(
            f"[{name}] ppo_mini_batch_size {mini} x n {n} // DP {dp} = 0 rows per mini-batch on a rank"
        )
    if (rows // dp) % per_rank:
        raise AssertionError(f"[{name}] {rows // dp} % {per_rank} != 0")


def megatron_checks(version: str, config: Any, use_critic: bool, model_dir: Path) -> None:
    """Run the Megatron workers' pre-load checks on a composed config (see the module); no-op for FSDP."""
    arr = config.actor_rollout_ref
    if arr.actor.strategy != "megatron":
        return
    stage = "megatron_engine"
    try:
        _engine(version, config)
        stage = "megatron_parallel_state"
        world = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
        sizes = _sizes(arr.actor.megatron)
        dp = _parallel_state(world, sizes)
        stage = "megatron_model"
        _model(version, arr.actor.megatron, model_dir)
        stage = "megatron_transformer_config"
        # McoreEngineConfig.__post_init__ turns sequence parallelism off with TP 1 (workers/config/engine.py).
        sequence_parallel = bool(arr.actor.megatron.get("sequence_parallel", True)) and sizes["tp"] > 1
        if _minor(version) < (0, 7):
            sequence_parallel = sizes["tp"] > 1  # 0.6.1 config_converter.py line 85: from the TP group size
        _transformer_config(sizes, sequence_parallel, arr.actor.megatron, model_dir)
        stage = "megatron_batch"
        train_batch, n = int(config.data.train_batch_size), int(arr.rollout.n)
        _batch(version, "actor", train_batch, int(arr.actor.ppo_mini_batch_size), n, dp)
        if use_critic:
            _batch(version, "critic", train_batch, int(config.critic.ppo_mini_batch_size), n, dp)
    except MegatronCheckFailed:
        raise
    except Exception as exc:
        raise MegatronCheckFailed(stage, exc) from exc
