"""The rollout engines: vLLM, SGLang and TensorRT-LLM, and the multi-turn agent loop that drives them.

Which engine a job rolls out with (``spec.rollout.name`` or ``actor_rollout_ref.rollout.name``), in which of
verl's rollout modes, and the rules verl's code enforces for each engine in each release line. Paths are
relative to the ``verl`` package of the release (``docs/planner.md`` lists them per engine):

- the (engine, mode) pairs verl can build: ``workers/rollout/base.py`` ``_ROLLOUT_REGISTRY`` (0.6.1 lines
  81-86: vllm and sglang, each sync and async; 0.9.1 lines 89-93: vllm, sglang and trtllm, async only;
  ``get_rollout_class`` asserts the pair, 0.6.1 line 99, 0.9.1 line 106);
- TensorRT-LLM's MoE split: ``workers/config/rollout.py`` (0.9.1) lines 294-317: ``moe_tensor_parallel_size``
  is for trtllm only, and with ``expert_parallel_size`` both set their product is the TP size (trtllm is
  exempt from the EP == TP x DP rule the others follow);
- prefill/decode disaggregation: 0.9.1 ``workers/config/rollout.py`` lines 341-344 (sglang or vllm only);
- SGLang's SPMD rollout (0.6.1 ``workers/rollout/sglang_rollout/sglang_rollout.py``): ``max_model_len`` (when
  set) at least prompt + response (lines 362-367); the model's ``max_position_embeddings`` (times a rope
  scaling factor) at least prompt + response (lines 368-395); its async server
  (``async_sglang_server.py`` line 83) sets ``max_model_len`` to prompt + response whatever was pinned;
- ``gpu_memory_utilization`` is SGLang's ``mem_fraction_static`` (0.6.1 ``sglang_rollout.py`` line 448,
  ``async_sglang_server.py`` line 137; 0.9.1 ``async_sglang_server.py`` line 317): a fraction of the GPU's
  total memory for weights and KV cache, as vLLM's; TensorRT-LLM's ``free_gpu_memory_fraction`` (0.9.1
  ``trtllm_async_server.py`` line 202), a fraction of the memory free after the weights load.
- the multi-turn loop: 0.6.1 runs it in SGLang's SPMD rollout (``sglang_rollout.py`` line 597) or in the agent
  loop of the async mode (``experimental/agent_loop/tool_agent_loop.py`` lines 92-112); 0.6.1's SPMD vLLM
  rollout has none (``multi_turn`` is never read in ``workers/rollout/vllm_rollout/``), so the setting is
  silently ignored there: a warning. 0.9.1 runs every engine through the agent loop.
"""

from __future__ import annotations

from verl_operator.api.plan import Violation
from verl_operator.planner.inputs import Problem
from verl_operator.planner.mesh import Mesh
from verl_operator.planner.reader import Reader

#: The engines the planner models.
ENGINES = ("vllm", "sglang", "trtllm")

#: Release line -> the (engine, mode) pairs verl registers (``workers/rollout/base.py`` ``_ROLLOUT_REGISTRY``).
REGISTRY: dict[str, frozenset[tuple[str, str]]] = {
    "0.6": frozenset({("vllm", "sync"), ("vllm", "async"), ("sglang", "sync"), ("sglang", "async")}),
    "0.9": frozenset({("vllm", "async"), ("sglang", "async"), ("trtllm", "async")}),
}

#: The engines' names in messages.
LABELS = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}

#: Where each release registers its engines (for messages).
_REGISTRY_AT = {"0.6": "workers/rollout/base.py:81-86", "0.9": "workers/rollout/base.py:89-93"}


def resolve_engine(version: str, mode: str, r: Reader) -> tuple[str, list[Violation], list[str]]:
    """The job's rollout engine, the violations of the engine rules that need no layout, and warnings.

    Args:
        version: The verl release line.
        mode: verl's ``rollout.mode`` (``sync`` or ``async``), as resolved.
        r: The pinned and read settings.
    """
    pin = r.pins.get("rollout_name")
    name = r.get_str("rollout_name") or "vllm"
    source = pin.source if pin is not None else "spec.rollout.name"
    if name not in ENGINES:
        return (
            name,
            [
                Violation(
                    field=source,
                    rule="rollout-name",
                    message=f"rollout engine {name!r} is not one the planner models ({', '.join(ENGINES)})",
                    suggestions=[f"use rollout name {_or_names(ENGINES)}"],
                )
            ],
            [],
        )
    out: list[Violation] = []
    pairs = REGISTRY.get(version, REGISTRY["0.9"])
    if mode in {m for _, m in pairs} and (name, mode) not in pairs:  # a mode the line lacks: rollout-mode
        engines = sorted({e for e, _ in pairs})
        modes = sorted(m for e, m in pairs if e == name)
        if not modes:
            message = (
                f"verl {version} has no {LABELS[name]} rollout: its registry ({_REGISTRY_AT.get(version, '')}) "
                f"holds {', '.join(engines)}"
            )
            suggestions = [f"use rollout name {_or_names(engines)}", "or set spec.verl.version: '0.9'"]
        else:
            message = f"verl {version}'s {LABELS[name]} rollout has no rollout.mode={mode}"
            suggestions = [f"use rollout.mode={' or '.join(modes)}"]
        out.append(
            Violation(field=source, rule="rollout-engine-mode", message=message, suggestions=suggestions)
        )
    moe_tp = r.get_int("rollout_moe_tp", reads=True)
    if moe_tp is not None and moe_tp > 1 and name != "trtllm":
        out.append(
            Violation(
                field=r.reads["rollout_moe_tp"].source,
                rule="rollout-moe-tp",
                message=f"moe_tensor_parallel_size {moe_tp} is only supported for trtllm (rollout name is {name})",
                suggestions=["drop moe_tensor_parallel_size", "or use rollout name trtllm (verl 0.9)"],
            )
        )
    if r.get_bool("rollout_disaggregation", reads=True) and name not in ("sglang", "vllm"):
        out.append(
            Violation(
                field=r.reads["rollout_disaggregation"].source,
                rule="rollout-disaggregation",
                message=f"rollout.disaggregation.enabled=True needs rollout name sglang or vllm, not {name}",
                suggestions=["drop the disaggregation override", "or use rollout name sglang or vllm"],
            )
        )
    warnings: list[str] = []
    if r.get_bool("multi_turn_enable", reads=True) and name == "vllm" and mode == "sync":
        warnings.append(
            "rollout.multi_turn.enable=True with verl 0.6's SPMD vLLM rollout (rollout.mode=sync) is ignored: "
            "that rollout has no multi-turn loop; use rollout name sglang, or rollout.mode=async (the agent loop)"
        )
    r.get_str("multi_turn_tool_config_path", reads=True)  # a list or dict is a type violation
    r.get_int("multi_turn_max_assistant_turns", reads=True)
    r.get_int("multi_turn_max_tool_response_length", reads=True)
    r.get_str("agent_default_agent_loop", reads=True)
    return name, out, warnings


def _or_names(names: tuple[str, ...] | list[str]) -> str:
    return " or ".join(names)


def trtllm_moe_split(p: Problem, mesh: Mesh) -> list[Violation]:
    """TensorRT-LLM (0.9.1 ``workers/config/rollout.py`` lines 302-317): with ``moe_tensor_parallel_size`` and
    ``expert_parallel_size`` both above 1, their product is the rollout TP size."""
    ep, moe_tp, tp = p.rollout_ep, p.rollout_moe_tp, mesh.rollout_tp
    if p.rollout_name != "trtllm" or ep is None or moe_tp is None or ep <= 1 or moe_tp <= 1:
        return []
    if ep * moe_tp == tp:
        return []
    return [
        Violation(
            field="spec.overrides (actor_rollout_ref.rollout.moe_tensor_parallel_size)",
            rule="rollout-moe-tp",
            message=(
                f"moe_tensor_parallel_size {moe_tp} x expert_parallel_size {ep} = {moe_tp * ep} != rollout "
                f"tensorParallelSize {tp}"
            ),
            suggestions=[f"use tensorParallelSize {moe_tp * ep}"]
            + ([f"or moe_tensor_parallel_size {tp // ep}"] if tp % ep == 0 else []),
        )
    ]


def sglang_spmd_model_len(p: Problem, mesh: Mesh) -> list[Violation]:
    """SGLang's SPMD rollout (verl 0.6.1 ``sglang_rollout.py`` lines 362-367): a pinned ``max_model_len`` is
    at least prompt + response."""
    if p.rollout_name != "sglang" or not p.spmd_rollout or p.max_model_len is None:
        return []
    if p.max_model_len >= p.seq_len:
        return []
    return [
        Violation(
            field=p.source("max_model_len", "spec.overrides (actor_rollout_ref.rollout.max_model_len)"),
            rule="max-model-len",
            message=(
                f"SGLang's SPMD rollout needs max_model_len {p.max_model_len} >= prompt {p.max_prompt_length} + "
                f"response {p.max_response_length} = {p.seq_len}"
            ),
            suggestions=[f"use max_model_len {p.seq_len} or more, or drop the override"],
        )
    ]
