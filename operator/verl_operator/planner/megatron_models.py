"""The models verl's Megatron paths can build, by HF ``model_type`` (rule ``megatron-model``).

verl builds a Megatron model (its ``TransformerConfig``, layers and weight converters) through one of three
paths, each with its own list of models, and meets a model outside the list only in the workers' init, with
every GPU of the job held:

- verl 0.6 without mbridge (its default, ``actor_rollout_ref.actor.megatron.use_mbridge=False``): verl's own
  registry, keyed by ``config.json``'s ``architectures[0]`` (0.6.1 ``models/mcore/registry.py`` lines 57-86:
  ``SupportedModel`` and ``MODEL_CONFIG_CONVERTER_REGISTRY``; ``hf_to_mcore_config``, lines 193-194, raises
  ``NotImplementedError`` for an architecture outside the enum and ``KeyError`` for ``Glm4MoeForCausalLM``,
  in the enum without a converter; called from ``workers/megatron_workers.py`` line 173).
- mbridge (verl 0.6 with ``megatron.use_mbridge=True``, ``workers/megatron_workers.py`` lines 163-166; verl 0.9
  with ``megatron.vanilla_mbridge=True``, ``workers/engine/megatron/transformer_impl.py`` lines 328-331):
  mbridge's registry by ``model_type`` (mbridge 0.15.1 ``core/auto_bridge.py`` lines 46-52 raise
  ``ValueError: Unregistered model type``; the names are the ``register_model`` calls of ``models/``).
- Megatron-Bridge (verl 0.9's default; ``megatron-bridge==0.5.2`` in verl 0.9.1's ``megatron`` extra): its
  ``AutoBridge`` refuses an architecture without a registered bridge (``models/conversion/auto_bridge.py``
  ``_validate_config``), but it also resolves aliases and remote-code (``auto_map``) class names, which a
  list of model types does not capture, so only the model types of ``MEGATRON_BRIDGE_ABSENT`` (commonly
  trained ones, standard ``transformers`` architectures, no bridge) are refused; every model type of the
  built-in catalog has a bridge there (``MEGATRON_BRIDGE``).

A shape without ``modelType`` is not checked (the planner cannot tell its architecture).
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_operator.api.plan import Violation

#: The model types whose HF architecture (``transformers``' causal-LM mapping, or the architecture their
#: published ``config.json`` names) verl 0.6.1's registry converts.
VERL_REGISTRY: frozenset[str] = frozenset(
    {"llama", "qwen2", "qwen2_moe", "deepseek_v3", "mixtral", "qwen2_5_vl", "llama4", "qwen3", "qwen3_moe"}
)
#: The model types mbridge 0.15.1 registers.
MBRIDGE: frozenset[str] = frozenset(
    {
        "deepseek_v3",
        "gemma3",
        "glm4_moe",
        "glm4v",
        "glm4v_moe",
        "internvl_chat",
        "llama",
        "mimo",
        "mixtral",
        "qwen2",
        "qwen2_5_vl",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
    }
)
#: Model types whose architecture Megatron-Bridge 0.5.2 registers a bridge for (``register_bridge(source=...)``
#: under ``src/megatron/bridge/models/``): used for suggestions.
MEGATRON_BRIDGE: frozenset[str] = frozenset(
    {
        "deepseek_v2",
        "deepseek_v3",
        "gemma",
        "gemma2",
        "gemma3",
        "glm4_moe",
        "gpt_oss",
        "llama",
        "mistral",
        "nemotron",
        "olmoe",
        "qwen2",
        "qwen2_5_vl",
        "qwen3",
        "qwen3_moe",
        "qwen3_next",
    }
)


#: Model types whose ``transformers`` architecture (``MixtralForCausalLM``, ``Qwen2MoeForCausalLM``,
#: ``PhiForCausalLM``, ``Phi3ForCausalLM``, ``Starcoder2ForCausalLM``, ``GraniteForCausalLM``,
#: ``CohereForCausalLM``, ``Olmo2ForCausalLM``, ``FalconForCausalLM``) Megatron-Bridge 0.5.2 registers no
#: bridge for.
MEGATRON_BRIDGE_ABSENT: frozenset[str] = frozenset(
    {"mixtral", "qwen2_moe", "phi", "phi3", "starcoder2", "granite", "cohere", "olmo2", "falcon"}
)


@dataclass(frozen=True)
class ModelPath:
    """The path one Megatron model is built through: its name in messages and the model types it builds."""

    name: str
    builds: frozenset[str]
    #: The override that moves to the other path, with the model types that path builds.
    switch: tuple[str, frozenset[str]]
    #: Where ``builds`` is not the whole list: the model types known to fail (the others are not checked).
    absent: frozenset[str] | None = None

    def refuses(self, model_type: str) -> bool:
        """The path is known not to build ``model_type``."""
        if self.absent is not None:
            return model_type in self.absent
        return model_type not in self.builds


def model_path(version: str, mbridge: bool | None, vanilla: bool | None) -> ModelPath:
    """The path a Megatron model is built through on the verl line ``version``.

    ``mbridge`` / ``vanilla`` are the job's ``megatron.use_mbridge`` / ``megatron.vanilla_mbridge`` (None:
    verl's default)."""
    if version == "0.6":
        if mbridge:
            return ModelPath("mbridge (use_mbridge=True)", MBRIDGE, ("use_mbridge=False", VERL_REGISTRY))
        return ModelPath("verl 0.6's own Megatron registry", VERL_REGISTRY, ("use_mbridge=True", MBRIDGE))
    if vanilla:
        return ModelPath(
            "mbridge (vanilla_mbridge=True)", MBRIDGE, ("vanilla_mbridge=False", MEGATRON_BRIDGE)
        )
    return ModelPath(
        "Megatron-Bridge 0.5.2 (verl 0.9's default)",
        MEGATRON_BRIDGE,
        ("vanilla_mbridge=True", MBRIDGE),
        absent=MEGATRON_BRIDGE_ABSENT,
    )


def check_model(
    model_type: str | None, field: str, path: ModelPath, megatron_section: str
) -> Violation | None:
    """A violation when ``path`` cannot build ``model_type`` (``field`` names it in the spec).

    ``megatron_section`` is the Hydra section of the model's ``megatron`` settings (the actor's or the
    critic's), where the suggested switch goes."""
    if model_type is None or not path.refuses(model_type):
        return None
    suggestions = []
    if model_type in path.switch[1]:
        suggestions.append(
            f"set {megatron_section}.megatron.{path.switch[0]} (that path builds {model_type})"
        )
    suggestions.append("use the FSDP engine (spec.parallelism.engine: fsdp)")
    return Violation(
        field=field,
        rule="megatron-model",
        message=(
            f"model_type {model_type} is not among the models {path.name} builds ({', '.join(sorted(path.builds))}"
            f"{', ...' if path.absent is not None else ''}): verl would fail in the Megatron workers' init, with "
            "every GPU of the job held"
        ),
        suggestions=suggestions,
    )
