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

from collections.abc import Sequence

from verl_operator.api.plan import Violation
from verl_operator.planner.inputs import Problem
from verl_operator.planner.mesh import Mesh
from verl_operator.planner.overrides import Override
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
    r.get_int("multi_turn_max_user_turns", reads=True)
    r.get_int("multi_turn_max_tool_response_length", reads=True)
    r.get_str("multi_turn_interaction_config_path", reads=True)
    r.get_str("agent_default_agent_loop", reads=True)
    r.get_int("agent_num_workers", reads=True)
    r.get_str("agent_loop_config_path", reads=True)
    warnings += _multi_turn_warnings(version, name, mode, r) + _agent_loop_warnings(version, r)
    return name, out, warnings


#: The agent loops each release registers by name (``@register``: 0.6.1
#: ``experimental/agent_loop/single_turn_agent_loop.py`` line 27, ``tool_agent_loop.py`` line 80; 0.9.1 lines 28
#: and 101); others come from ``agent.agent_loop_config_path`` (0.9.1 ``agent_loop.py`` lines 534-539).
AGENT_LOOPS = frozenset({"single_turn_agent", "tool_agent"})


def _agent_loop_warnings(version: str, r: Reader) -> list[str]:
    """An ``agent.default_agent_loop`` that is no registered agent loop, with no ``agent_loop_config_path``
    that could name it: the loop's lookup (0.9.1 ``agent_loop.py`` line 682) fails for every sample without an
    ``agent_name`` of its own, once the rollout runs."""
    loop = r.get_str("agent_default_agent_loop", reads=True)
    if loop is None or loop in AGENT_LOOPS or r.get_str("agent_loop_config_path", reads=True):
        return []
    return [
        f"rollout.agent.default_agent_loop={loop} is not an agent loop verl {version} registers "
        f"({', '.join(sorted(AGENT_LOOPS))}) and no rollout.agent.agent_loop_config_path names one"
    ]


#: The tool-call formats (``multi_turn.format``) each release's tool parser registers
#: (``experimental/agent_loop/tool_parser.py`` ``@ToolParser.register``: 0.6.1 lines 75, 109; 0.9.1 lines 96,
#: 132, 189, 377, 452, 510, 563, 651, 742); ``ToolParser.get_tool_parser`` raises for any other name when the
#: tool agent loop starts.
TOOL_FORMATS: dict[str, frozenset[str]] = {
    "0.6": frozenset({"hermes", "gpt-oss"}),
    "0.9": frozenset(
        {"hermes", "gpt-oss", "qwen3_coder", "glm", "seed", "minimax", "kimi", "deepseek_v4", "gemma4"}
    ),
}


def _multi_turn_warnings(version: str, name: str, mode: str, r: Reader) -> list[str]:
    """What verl's multi-turn rollouts refuse only once they run (so a warning, not a violation):

    - a ``multi_turn.format`` that is no tool parser of the release (the agent loop's tool agent raises when
      a sample uses it; 0.6's SPMD SGLang rollout parses tool calls with SGLang's own parser instead);
    - 0.6's SPMD SGLang multi-turn rollout asserts ``raw_prompt`` in the batch (0.6.1
      ``sglang_rollout.py`` line 1432), which verl's dataset adds only with ``data.return_raw_chat=True``
      (``utils/dataset/rl_dataset.py``; 0.6.1's default is False).
    """
    out: list[str] = []
    if not r.get_bool("multi_turn_enable", reads=True):
        return out
    fmt = r.get_str("multi_turn_format", reads=True)
    spmd_sglang = name == "sglang" and mode == "sync"
    formats = TOOL_FORMATS.get(version, TOOL_FORMATS["0.9"])
    if fmt is not None and fmt not in formats and not spmd_sglang:
        out.append(
            f"rollout.multi_turn.format={fmt} is not a tool parser of verl {version} ({', '.join(sorted(formats))}): "
            "the tool agent loop raises when a sample uses it"
        )
    if spmd_sglang and r.get_bool("return_raw_chat", reads=True) is not True:
        out.append(
            "rollout.multi_turn.enable=True with verl 0.6's SPMD SGLang rollout needs data.return_raw_chat=True "
            "(the rollout asserts raw_prompt in the batch, sglang_rollout.py line 1432)"
        )
    return out


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


#: Config sections verl builds a dataclass from before any engine starts (``omega_conf_to_dataclass`` of the
#: rollout and the model: 0.6.1 ``workers/fsdp_workers.py`` lines 583-584, 0.9.1 ``workers/engine_workers.py``
#: line 651, ``workers/rollout/replica.py`` line 104), with the fields each dataclass declares beyond the
#: keys of the release's YAML config (``dataclasses.fields`` of ``RolloutConfig`` and ``HFModelConfig`` in
#: ``workers/config/rollout.py`` and ``workers/config/model.py``, read from verl 0.6.1 and 0.9.1).
DATACLASS_EXTRA_FIELDS: dict[str, dict[str, frozenset[str]]] = {
    "0.6": {
        "actor_rollout_ref.rollout": frozenset(
            {"layer_name_map", "limit_images", "server", "sglang_engine_mode"}
        ),
        "actor_rollout_ref.model": frozenset(
            {"architectures", "generation_config", "hf_config", "load_tokenizer", "local_hf_config_path"}
            | {"local_path", "local_tokenizer_path", "processor", "tokenizer"}
        ),
    },
    "0.9": {
        "actor_rollout_ref.rollout": frozenset(
            {"checkpoint_manager_class", "custom", "enable_sleep_mode", "layer_name_map", "limit_images"}
            | {"moe_tensor_parallel_size", "repetition_penalty", "server", "sglang_engine_mode"}
            | {"standalone_gpu_memory_utilization"}
        ),
        "actor_rollout_ref.model": frozenset(
            {"architectures", "generation_config", "hf_config", "load_tokenizer", "local_hf_config_path"}
            | {
                "local_path",
                "local_tokenizer_path",
                "model_type",
                "processor",
                "target_parameters",
                "tokenizer",
            }
        ),
    },
}


def added_dataclass_fields(
    overrides: Sequence[Override], version: str, keys: frozenset[str], release: str
) -> list[Violation]:
    """``+``/``++`` overrides that add a key straight inside the rollout or model section: Hydra adds it,
    then verl builds the section's dataclass (``RolloutConfig``, ``HFModelConfig``), whose constructor refuses
    a field it does not declare (``unexpected keyword argument``), as both releases refuse the
    ``sglang_rollout_mode`` of SGLang's multi-turn server example. Deeper keys are left to Hydra.

    Args:
        overrides: The parsed overrides.
        version: The VerlJob release line (``0.6``, ``0.9``).
        keys: The keys of the release's config (``verl_keys.known_keys``).
        release: The release the keys were read from (for messages).
    """
    extra = DATACLASS_EXTRA_FIELDS.get(version, DATACLASS_EXTRA_FIELDS["0.9"])
    out: list[Violation] = []
    for ov in overrides:
        if ov.prefix not in ("+", "++") or ov.key in keys:
            continue
        section, _, rest = ov.key.rpartition(".")
        name = rest
        for candidate in extra:
            if ov.key.startswith(candidate + "."):
                section, name = candidate, ov.key[len(candidate) + 1 :].split(".")[0]
                break
        else:
            continue
        if f"{section}.{name}" in keys or name in extra[section]:
            continue
        cls = "RolloutConfig" if section.endswith("rollout") else "HFModelConfig"
        out.append(
            Violation(
                field=ov.source,
                rule="override-dataclass-field",
                message=(
                    f"{ov.prefix}{ov.key} adds {name!r} to {section}, which verl {release} builds as its {cls} "
                    f"dataclass; {cls} has no field {name!r} (its constructor refuses it)"
                ),
                suggestions=[f"drop the {ov.key} override"],
            )
        )
    return out


#: Where each (engine, mode) gives a rollout replica ``data_parallel_size`` ranks, and why the others do not.
_DP_SUPPORT = {
    (
        "sglang",
        "async",
    ): None,  # 0.6.1 async_sglang_server.py:142-143 (dp_size); 0.9.1 :313-323 (tp x dp, dp_size)
    ("vllm", "async"): None,  # 0.6.1 vllm_async_server.py:249-264; 0.9.1 :384-399 (vLLM's data_parallel_size)
    (
        "trtllm",
        "async",
    ): "TensorRT-LLM's server takes tensor_parallel_size alone (0.9.1 trtllm_async_server.py:235)",
    (
        "sglang",
        "sync",
    ): "verl 0.6's SPMD SGLang engine takes tensor_model_parallel_size alone (sglang_rollout.py:335)",
    (
        "vllm",
        "sync",
    ): "verl 0.6's SPMD vLLM engine takes tensor_model_parallel_size alone (vllm_rollout_spmd.py:156)",
}


def rollout_data_parallel(p: Problem, mesh: Mesh) -> list[Violation]:
    """``rollout.data_parallel_size`` > 1: data parallel ranks inside one replica of ``TP x DP`` GPUs.

    verl's server rollouts of SGLang (its DP attention: ``dp_size``) and vLLM take it; TensorRT-LLM's server and
    0.6's SPMD engines do not (``_DP_SUPPORT``). Where it is taken: the world divides by ``TP x DP`` (0.6.1
    ``workers/fsdp_workers.py`` lines 588-594, 0.9.1 ``workers/engine_workers.py`` lines 655-660), the replica
    spans whole nodes or tiles one (``workers/rollout/replica.py``, 0.6.1 line 97, 0.9.1 line 114), and vLLM's
    data-parallel server needs the node's GPUs divisible by TP and a replica of at least a node (its workers
    per node are ``gpus_per_node // TP x TP``: 0.6.1 ``vllm_async_server.py`` lines 250-257, 0.9.1 lines 385-392).
    """
    dp = p.rollout_dp
    field = p.rollout_dp_source
    if dp is not None and dp < 1:
        return [
            Violation(
                field=field,
                rule="rollout-data-parallel",
                message=(
                    f"rollout data_parallel_size {dp}: a replica has at least one data parallel rank (verl divides "
                    f"the world by tensorParallelSize x data_parallel_size = {mesh.rollout_tp} x {dp} = "
                    f"{mesh.rollout_tp * dp}: ZeroDivisionError at start)"
                ),
                suggestions=["use data_parallel_size=1 (verl's default) or drop the override"],
            )
        ]
    if dp is None or dp <= 1:
        return []
    why = _DP_SUPPORT.get((p.rollout_name, p.mode))
    if why is not None:
        return [
            Violation(
                field=field,
                rule="rollout-data-parallel",
                message=f"rollout data_parallel_size {dp} is not taken by this rollout: {why}",
                suggestions=["drop the data_parallel_size override"]
                + (["or use rollout.mode=async (the server rollout)"] if p.mode == "sync" else []),
            )
        ]
    tp, gpn, world = mesh.rollout_tp, mesh.gpus_per_node, mesh.world
    size = tp * dp
    problems: list[str] = []
    if world % size:
        problems.append(
            f"{world} GPUs are not divisible by the replica's tensorParallelSize {tp} x {dp} = {size}"
        )
    if not (size % gpn == 0 if size > gpn else gpn % size == 0):
        problems.append(f"a replica of {tp} x {dp} = {size} GPUs would straddle nodes of {gpn} GPUs")
    if p.rollout_name == "vllm" and (gpn % tp or size < gpn):
        problems.append(
            f"vLLM's data-parallel server needs the {gpn} GPUs per node divisible by tensorParallelSize {tp} and "
            f"a replica of at least a node ({tp} x {dp} = {size})"
        )
    if not problems:
        return []
    fits = [d for d in range(1, world // tp + 1) if _dp_fits(p.rollout_name, tp, d, gpn, world)]
    near = sorted(fits, key=lambda d: (abs(d - dp), d))[:2]
    return [
        Violation(
            field=field,
            rule="rollout-data-parallel",
            message="; ".join(problems),
            suggestions=[f"use data_parallel_size {' or '.join(map(str, sorted(near)))}"] if near else [],
        )
    ]


def _dp_fits(engine: str, tp: int, dp: int, gpn: int, world: int) -> bool:
    size = tp * dp
    whole = size % gpn == 0 if size > gpn else gpn % size == 0
    return world % size == 0 and whole and not (engine == "vllm" and (gpn % tp or size < gpn))
