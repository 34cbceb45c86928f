"""verl's config keys per release line: which override keys the planner reads, and the override list it emits.

Both spellings of a setting are accepted as input for every version (users paste scripts from several verl
releases); the output uses the target version's spelling:

- 0.6 (SPMD rollout): ``actor_rollout_ref.rollout.mode=sync``; Ulysses SP in
  ``actor_rollout_ref.actor.ulysses_sequence_parallel_size`` (the worker reads it there).
- 0.9 (server rollout): ``rollout.mode=async`` (``sync`` raises), ``rollout.name=vllm`` (no default), SP in
  ``actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size`` (and the ref's ``fsdp_config``), the
  ``_per_gpu`` micro-batch forms only (global forms are no longer converted).
Both: ``use_remove_padding=True`` when SP > 1, log-prob dynamic batch size equal to the actor's,
``rollout.max_model_len`` = prompt + response unless pinned (0.9 would otherwise use the model's full
``max_position_embeddings``, whose KV cache may not fit), and ``rollout.max_num_batched_tokens`` at least
``max_model_len`` in 0.6 (its SPMD rollout rejects less with chunked prefill on).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from verl_operator.api.settings_registry import ARR, MEGATRON_SIZES, SETTINGS, Registry
from verl_operator.planner.inputs import Settings
from verl_operator.planner.overrides import Override, Value, format_value

#: Override key -> logical planner input (the owned keys of ``api.settings_registry``). Keys mapped to one
#: input must agree.
INPUT_KEYS: dict[str, str] = SETTINGS.input_keys()

#: Keys the planner reads (memory model, strategy checks) but passes through unchanged.
READ_KEYS: dict[str, str] = SETTINGS.read_keys()


def rollout_mode_value(version: str) -> str:
    """verl's ``rollout.mode`` for a release line: ``sync`` (SPMD, 0.6) or ``async`` (server, 0.9)."""
    return "sync" if version == "0.6" else "async"


def sp_keys(version: str) -> tuple[str, ...]:
    """The keys that carry the Ulysses SP size for actor and ref in this release line."""
    return SETTINGS["sequence_parallel_size"].emitted(version)


@dataclass(frozen=True)
class Emitted:
    """The planned values that become overrides: the chosen settings plus the job's fixed facts."""

    settings: Settings
    version: str
    model_path: str
    adv_estimator: str
    train_files: Value | None
    val_files: Value | None
    max_prompt_length: int
    max_response_length: int
    max_model_len: int
    max_num_batched_tokens: int
    critic: bool
    rollout_mode: str = ""
    critic_model_path: str | None = None
    dtype: str = "bfloat16"
    #: The rollout engine: vllm, sglang or trtllm.
    rollout_name: str = "vllm"
    #: The training engine: fsdp or megatron (the rows of the other engine's config are not emitted).
    training_engine: str = "fsdp"


def emit(planned: Emitted, passthrough: Sequence[Override], registry: Registry = SETTINGS) -> list[str]:
    """The full override list for the target version: the planner's keys once each, then the user's others.

    The keys are the registry's emitted keys, in row order, of every row that applies to the job (its
    ``engine``, ``batching`` and ``critic_only``), each with its setting's value (:func:`values`; an
    ``optional`` row without a value is left out); the ``float16`` keys follow (:func:`dtype_keys`).

    Args:
        planned: The planned values.
        passthrough: User overrides the planner does not own, kept verbatim and in order.
        registry: The settings (the product's own unless a test passes another).

    Raises:
        LookupError: A row that applies has no planned value (a setting would be taken out of the user's
            overrides and never written: its value belongs in ``Settings`` or ``Emitted``).
    """
    known = values(planned)
    st = planned.settings
    out: list[tuple[str, Any]] = []
    for row in registry:
        keys = row.emitted(planned.version)
        if not keys or not row.applies(
            engine=planned.training_engine, dynamic=st.dynamic_batch_size, critic=planned.critic
        ):
            continue
        if row.name not in known:
            raise LookupError(
                f"setting {row.name!r} owns {', '.join(keys)} but the plan has no value for it: "
                "a field of its name belongs in Settings or Emitted"
            )
        if known[row.name] is None and row.optional:
            continue
        out += [(key, known[row.name]) for key in keys]
    out += dtype_keys(planned)
    rendered = [f"{k}={format_value(val)}" for k, val in out]
    return rendered + [ov.raw.strip() for ov in passthrough]


def values(planned: Emitted) -> dict[str, Any]:
    """Setting -> the value the planner emits for it (None: an optional row is left out).

    A setting's value is the chosen ``Settings`` field of its name, else the ``Emitted`` field of its name.
    The special cases below are where the emitted value is not that field; which rows apply to the job is
    the rows' own (``SettingRow.applies``).
    """
    st = planned.settings
    out: dict[str, Any] = {f.name: getattr(planned, f.name) for f in fields(planned)}
    out.update({f.name: getattr(st, f.name) for f in fields(st)})
    # Special cases:
    out["n_gpus_per_node"] = st.gpus_per_node  # the chosen layout's name for it
    out["rollout_mode"] = planned.rollout_mode or rollout_mode_value(planned.version)
    out["critic_dynamic_batch_size"] = st.dynamic_batch_size  # verl needs the critic's equal to the actor's
    # verl's default names ~/models/deepseek-llm-7b-chat: a critic without a path fails to build.
    out["critic_model_path"] = planned.critic_model_path or planned.model_path
    out["use_remove_padding"] = True if st.sequence_parallel_size > 1 else None  # Ulysses SP needs it
    # The Megatron engine: the offloads are the job's, the critic's sizes the actor's.
    out["megatron_param_offload"] = st.param_offload
    out["megatron_optimizer_offload"] = st.optimizer_offload
    for name, _, _ in MEGATRON_SIZES:
        out[f"critic_{name}"] = out[name]
    return out


def dtype_keys(planned: Emitted) -> list[tuple[str, Any]]:
    """``spec.model.dtype: float16``: vLLM's dtype and FSDP's mixed-precision parameter dtype (verl's defaults
    are bfloat16, which GPUs below compute capability 8.0 cannot run). The FSDP workers of both releases take
    the parameter dtype from ``fsdp_config.dtype`` when no ``mixed_precision`` block is given
    (0.6.1 ``workers/fsdp_workers.py`` ``_build_model_optimizer``; 0.9.1 ``workers/config/engine.py``
    ``FSDPEngineConfig.dtype``); the 0.9 critic's engine config is ``critic.fsdp``."""
    if planned.dtype != "float16":
        return []
    out: list[tuple[str, Any]] = [
        (f"{ARR}.rollout.dtype", "float16"),
        (f"{ARR}.actor.fsdp_config.dtype", "float16"),
        (f"{ARR}.ref.fsdp_config.dtype", "float16"),
    ]
    if planned.critic:  # 0.9 only: the planner refuses float16 with a 0.6 critic (planner/job.py)
        out.append(("critic.fsdp.dtype", "float16"))
    return out
