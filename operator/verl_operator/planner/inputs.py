"""The planner's resolved inputs: pinned values from the structured spec and the overrides, merged."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from verl_operator.api.plan import Violation
from verl_operator.api.settings_registry import SETTINGS
from verl_operator.api.spec import ModelShape, VerlJobSpec
from verl_operator.planner._settings_generated import Chosen, Held
from verl_operator.planner._settings_generated import Fixed as Fixed
from verl_operator.planner.megatron_options import MegatronOptions
from verl_operator.planner.overrides import Pinned, Value


@dataclass(frozen=True, kw_only=True)
class Settings(Chosen):
    """One complete candidate layout (what the search decides and the rules check): the settings the search
    chooses (``Chosen``, one field per registry row with ``search="choose"``) on one layout of the nodes."""

    world: int
    nnodes: int
    gpus_per_node: int

    @property
    def trajectories(self) -> int:
        """``train_batch_size x rollout.n``: sequences per step."""
        return self.train_batch_size * self.rollout_n


@dataclass(frozen=True, kw_only=True)
class Problem(Held):
    """Facts that stay fixed while the search varies ``Settings``: the job's settings (``Held``, one field per
    registry row with ``held``; the emitter reads them) and the facts that are no setting."""

    version: str
    shape: ModelShape
    params: float
    needs_critic: bool
    uses_ref: bool
    lora: bool
    #: ``critic.model.fsdp_config``'s parameter and optimizer offloads both on.
    critic_offload: bool
    nvlink_required: bool
    gpu_memory_bytes: int
    nvlink_domain: int
    pins: Mapping[str, Pinned] = field(default_factory=dict)
    critic_params: float | None = None
    #: The data's mean prompt and response lengths (``spec.data.mean*Length``), for the memory estimate only.
    mean_prompt_length: int | None = None
    mean_response_length: int | None = None
    #: ``spec.model.dtype``: training's and the rollout's compute dtype.
    dtype: str = "bfloat16"
    #: The actor's update computes the entropy of its logits (``actor.entropy_coeff`` not 0).
    entropy: bool = False
    #: Of the layout's candidate nodes: those whose NVLink domains are partial (fewer GPUs than the node), and
    #: how many of those have exactly the layout's GPUs per node (placement gives such a node's pod the whole
    #: node, the only way to be sure it holds whole domains).
    partial_domain_nodes: int = 0
    whole_node_fits: int = 0
    #: Where ``rollout_dp`` (``rollout.data_parallel_size``, data parallel ranks inside one rollout replica;
    #: None: 1) was set.
    rollout_dp_source: str = "spec.overrides (actor_rollout_ref.rollout.data_parallel_size)"
    #: The Megatron memory model's offload, recompute and stage-layer options (``megatron_memory.py``).
    megatron_options: MegatronOptions = field(default_factory=MegatronOptions)
    #: The trainer pool of fully_async / one_step_off: no rollout replica on its GPUs, so the rollout phase's
    #: memory and KV cache are not the trainer's (planner/job_pools.py; the rollout pool's are checked there).
    standalone_rollout: bool = False

    @property
    def mode(self) -> str:
        """verl's ``rollout.mode``: ``sync`` (SPMD, verl 0.6 only) or ``async`` (vLLM servers)."""
        return self.rollout_mode or ("sync" if self.version == "0.6" else "async")

    @property
    def spmd_rollout(self) -> bool:
        """vLLM runs SPMD inside the training workers (verl 0.6 ``rollout.mode=sync``)."""
        return self.mode == "sync"

    @property
    def model_len(self) -> int:
        """The rollout's ``max_model_len``: pinned, else prompt + response (what the planner emits). verl 0.6's
        SGLang async server sets prompt + response whatever is pinned (``async_sglang_server.py`` line 83)."""
        if self.rollout_name == "sglang" and self.version == "0.6" and not self.spmd_rollout:
            return self.seq_len
        return self.max_model_len if self.max_model_len is not None else self.seq_len

    @property
    def max_positions(self) -> int:
        """The model's longest sequence, after an ``override_config.max_position_embeddings`` override."""
        return self.max_position_embeddings or self.shape.max_position_embeddings

    @property
    def seq_len(self) -> int:
        """``max_prompt_length + max_response_length``: the longest sequence."""
        return self.max_prompt_length + self.max_response_length

    def removes_padding(self, sequence_parallel_size: int) -> bool:
        """Micro-batches hold only real tokens: ``use_remove_padding`` pinned, else on with Ulysses SP (the
        planner sets it) and by default from verl 0.7 on (0.6's default is off). verl 0.6's Megatron actor and
        critic pack every micro-batch whatever the key says: they never read it, and the model forward packs
        the sequences (0.6.1 ``models/mcore/model_forward.py`` line 56, ``preprocess_packed_seqs``)."""
        if self.training_engine == "megatron" and self.version == "0.6":
            return True
        if self.use_remove_padding is not None:
            return self.use_remove_padding
        return sequence_parallel_size > 1 or self.version != "0.6"

    def tokens_per_sequence(self, sequence_parallel_size: int) -> int:
        """Tokens one sequence brings to a micro-batch: padded, ``max_prompt_length + max_response_length``;
        with padding removed, the data's mean lengths where the spec gives them (each capped at its maximum)."""
        if not self.removes_padding(sequence_parallel_size):
            return self.seq_len
        prompt = min(self.mean_prompt_length or self.max_prompt_length, self.max_prompt_length)
        response = min(self.mean_response_length or self.max_response_length, self.max_response_length)
        return prompt + response

    def source(self, name: str, default: str) -> str:
        """The field a violation about input ``name`` names: where the user pinned it, else ``default``."""
        pin = self.pins.get(name)
        return pin.source if pin is not None else default

    def pinned(self, name: str) -> bool:
        """The user fixed input ``name``."""
        return name in self.pins


def _explicit(model: BaseModel, attr: str) -> bool:
    return attr in model.model_fields_set


def spec_value(spec: BaseModel, path: str) -> Any:
    """The value of the camelCase field ``path`` under ``spec`` when the user set it, else None: a field left
    at its default, under an absent section, or an empty list pins nothing."""
    node: Any = spec
    for part in path.split("."):
        if node is None:
            return None
        attr = _attribute(type(node), part)
        if not _explicit(node, attr) and type(node).model_fields[attr].default is not None:
            return None  # a default is not a pin (``maxPromptLength: 512`` unless written)
        node = getattr(node, attr)
    if isinstance(node, list):
        return list(node) or None
    return node


def _attribute(model: type[BaseModel], wire: str) -> str:
    """The Python attribute of the field spelt ``wire`` on the wire."""
    for name, info in model.model_fields.items():
        if wire in (info.alias, name):
            return name
    raise KeyError(f"{model.__name__} has no field {wire!r}")


#: Settings whose spec value is not the planner's input as it is: ``algorithm: ppo`` is verl's
#: ``adv_estimator=gae`` (the other algorithms are named as verl names them).
_SPEC_VALUE: dict[str, Callable[[Any], Any]] = {
    "adv_estimator": lambda alg: "gae" if alg.value == "ppo" else alg.value,
}


def spec_pin(spec: VerlJobSpec, name: str) -> Any:
    """The value the spec field of setting ``name`` pins (see :func:`spec_value`), as the planner's input."""
    value = spec_value(spec, str(SETTINGS[name].spec))
    convert = _SPEC_VALUE.get(name)
    return convert(value) if convert is not None and value is not None else value


#: The structured field that corresponds to an input (for messages even when only an override set it).
SPEC_PATHS: dict[str, str] = SETTINGS.spec_paths()


def merge_pins(
    spec: VerlJobSpec, from_overrides: Mapping[str, Pinned]
) -> tuple[dict[str, Pinned], list[Violation]]:
    """Merge the structured fields and the overrides into one set of pinned inputs.

    The structured fields are the registry's rows with a spec path, in row order. A value set in both places
    must be equal; otherwise the result is a violation naming both.

    Returns:
        ``(pins, violations)``.
    """
    pins: dict[str, Pinned] = dict(from_overrides)
    violations: list[Violation] = []
    for name, path in SPEC_PATHS.items():
        value = spec_pin(spec, name)
        if value is None:
            continue
        other = from_overrides.get(name)
        if other is not None and not _same(other.value, value):
            violations.append(
                Violation(
                    field=path,
                    rule="override-conflict",
                    message=f"{path} = {value!r} but {other.source} = {other.value!r}",
                    suggestions=[f"drop {other.source}, or set {path} to {other.value!r}"],
                )
            )
            continue
        pins[name] = Pinned(value, path)
    return pins, violations


def _same(a: Value, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b) and type(a) is type(b)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b  # exact, and no overflow for an integer too large for a float
    if isinstance(a, list) and isinstance(b, list):
        return [str(x) for x in a] == [str(x) for x in b]
    if isinstance(a, str) and isinstance(b, list) and len(b) == 1:
        return a == str(b[0])
    return str(a) == str(b)
