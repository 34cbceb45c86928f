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
from dataclasses import fields
from typing import Any

from verl_operator.api.settings_registry import ARR, LINES, MEGATRON_SIZES, SETTINGS, Registry
from verl_operator.planner._settings_generated import Held
from verl_operator.planner.inputs import Problem, Settings
from verl_operator.planner.overrides import Override, format_value

#: Override key -> logical planner input (the owned keys of ``api.settings_registry``). Keys mapped to one
#: input must agree.
INPUT_KEYS: dict[str, str] = SETTINGS.input_keys()

#: Keys the planner reads (memory model, strategy checks) but passes through unchanged.
READ_KEYS: dict[str, str] = SETTINGS.read_keys()


#: The emitted settings whose value is neither a candidate's nor the job's field of the same name: each is
#: a special case of :func:`values`.
SPECIAL: frozenset[str] = frozenset(
    {
        "n_gpus_per_node",
        "critic_dynamic_batch_size",
        "use_remove_padding",
        "megatron_param_offload",
        "megatron_optimizer_offload",
        *(f"critic_{name}" for name, _, _ in MEGATRON_SIZES),
    }
)


def unreachable(registry: Registry = SETTINGS) -> list[str]:
    """The rows that emit keys for some release line but that no planned value reaches: neither a field of
    the candidate (``Settings``: ``search`` rows and the layout) nor of the job (``Held``: ``held`` rows),
    nor a special case. Such a row's keys would be taken out of the user's overrides and never written."""
    reached = {f.name for f in fields(Settings)} | {f.name for f in fields(Held)} | SPECIAL
    return [
        row.name for row in registry if row.name not in reached and any(row.emitted(line) for line in LINES)
    ]


if _missing := unreachable():  # a row added without search= or held= fails at import, not on a job
    raise ImportError(
        f"settings {_missing} emit keys that no planned value reaches: give each search= or held= and run `make settings`"
    )


def rollout_mode_value(version: str) -> str:
    """verl's ``rollout.mode`` for a release line: ``sync`` (SPMD, 0.6) or ``async`` (server, 0.9)."""
    return "sync" if version == "0.6" else "async"


def sp_keys(version: str) -> tuple[str, ...]:
    """The keys that carry the Ulysses SP size for actor and ref in this release line."""
    return SETTINGS["sequence_parallel_size"].emitted(version)


def emit(
    st: Settings, p: Problem, passthrough: Sequence[Override], registry: Registry = SETTINGS
) -> list[str]:
    """The full override list for the target version: the planner's keys once each, then the user's others.

    The keys are the registry's emitted keys, in row order, of every row that applies to the job (its
    ``engine``, ``batching`` and ``critic_only``), each with its setting's value (:func:`values`; an
    ``optional`` row without a value is left out); the ``float16`` keys follow (:func:`dtype_keys`).

    Args:
        st: The chosen candidate.
        p: The job's facts, its held settings among them.
        passthrough: User overrides the planner does not own, kept verbatim and in order.
        registry: The settings (the product's own unless a test passes another).

    Raises:
        LookupError: A row that applies has no planned value (a setting would be taken out of the user's
            overrides and never written: its row needs ``search`` or ``held``).
    """
    known = values(st, p, registry)
    out: list[tuple[str, Any]] = []
    for row in registry:
        keys = row.emitted(p.version)
        if not keys or not row.applies(
            engine=p.training_engine, dynamic=st.dynamic_batch_size, critic=p.needs_critic
        ):
            continue
        if row.name not in known:
            raise LookupError(
                f"setting {row.name!r} owns {', '.join(keys)} but the plan has no value for it: "
                "its row needs search= (a candidate's setting) or held= (the job's)"
            )
        if known[row.name] is None and row.optional:
            continue
        out += [(key, known[row.name]) for key in keys]
    out += dtype_keys(p)
    rendered = [f"{k}={format_value(val)}" for k, val in out]
    return rendered + [ov.raw.strip() for ov in passthrough]


def values(st: Settings, p: Problem, registry: Registry = SETTINGS) -> dict[str, Any]:
    """Setting -> the value the planner emits for it (None: an optional row is left out).

    A setting's value is the candidate's ``Settings`` field of its name (``search`` rows, and the layout's
    ``nnodes``), else the job's ``Held`` field of its name (``held`` rows). The special cases below
    (:data:`SPECIAL`) are where the emitted value is neither; which rows apply to the job is the rows' own
    (``SettingRow.applies``).
    """
    out: dict[str, Any] = {row.name: getattr(p, row.name) for row in registry if row.held is not None}
    out.update({f.name: getattr(st, f.name) for f in fields(st)})
    # Special cases (SPECIAL):
    out["max_model_len"] = p.model_len  # pinned, else prompt + response
    out["rollout_mode"] = p.mode  # pinned, else the release line's
    out["n_gpus_per_node"] = st.gpus_per_node  # the chosen layout's name for it
    out["critic_dynamic_batch_size"] = st.dynamic_batch_size  # verl needs the critic's equal to the actor's
    # verl's default names ~/models/deepseek-llm-7b-chat: a critic without a path fails to build.
    out["critic_model_path"] = p.critic_model_path or p.model_path
    out["use_remove_padding"] = True if st.sequence_parallel_size > 1 else None  # Ulysses SP needs it
    # The Megatron engine: the offloads are the job's, the critic's sizes the actor's.
    out["megatron_param_offload"] = st.param_offload
    out["megatron_optimizer_offload"] = st.optimizer_offload
    for name, _, _ in MEGATRON_SIZES:
        out[f"critic_{name}"] = out[name]
    return out


def dtype_keys(p: Problem) -> list[tuple[str, Any]]:
    """``spec.model.dtype: float16``: vLLM's dtype and FSDP's mixed-precision parameter dtype (verl's defaults
    are bfloat16, which GPUs below compute capability 8.0 cannot run). The FSDP workers of both releases take
    the parameter dtype from ``fsdp_config.dtype`` when no ``mixed_precision`` block is given
    (0.6.1 ``workers/fsdp_workers.py`` ``_build_model_optimizer``; 0.9.1 ``workers/config/engine.py``
    ``FSDPEngineConfig.dtype``); the 0.9 critic's engine config is ``critic.fsdp``."""
    if p.dtype != "float16":
        return []
    out: list[tuple[str, Any]] = [
        (f"{ARR}.rollout.dtype", "float16"),
        (f"{ARR}.actor.fsdp_config.dtype", "float16"),
        (f"{ARR}.ref.fsdp_config.dtype", "float16"),
    ]
    if p.needs_critic:  # 0.9 only: the planner refuses float16 with a 0.6 critic (planner/job.py)
        out.append(("critic.fsdp.dtype", "float16"))
    return out
