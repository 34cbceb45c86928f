"""The Megatron training engine: which engine a spec selects, and the Megatron mesh arithmetic.

The engine is ``fsdp`` (verl's ``ppo_trainer`` config) unless the spec or its overrides select ``megatron``
(verl's ``ppo_megatron_trainer`` config, both release lines): ``spec.parallelism.engine``, a pasted
``actor_rollout_ref.actor.strategy=megatron`` (or ``critic.strategy``), any ``*.megatron.*`` key of the
settings registry, or the ``--config-name ppo_megatron_trainer`` of a pasted verl 0.6 script. Sources that
disagree are a violation; the selection is pinned (the plan carries it to the launcher as the config name).

The mesh: megatron-core splits the world into ``TP x PP x CP`` model-parallel ranks and ``DP = world /
(TP x PP x CP)`` data-parallel ranks (megatron-core ``parallel_state.initialize_model_parallel``, called by
verl 0.6.1 ``workers/megatron_workers.py`` lines 210-219 and verl 0.9.1 ``workers/engine/megatron/
transformer_impl.py``); verl normalises the mini-batch by that DP (0.6.1 ``megatron_workers.py`` lines
273-274). Experts are split over ``EP x ETP`` ranks inside ``TP x DP x CP``.

The search (``candidates``) yields the meshes in a fixed tie-break order (its docstring): the smallest
``TP x PP x CP`` first, TP inside one NVLink domain, EP inside a node, PP across nodes, CP only for long
contexts, VPP where PP > 1 and the layers allow. The memory of a Megatron candidate is
``megatron_memory.py``'s (per pipeline stage: the state over DP and EP, 1F1B activations, recompute, offloads);
``state_shard`` is only the mesh's single-number summary of the state's split.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from verl_operator.api.plan import Violation
from verl_operator.api.settings_registry import SETTINGS
from verl_operator.api.spec import ModelShape
from verl_operator.planner import arith
from verl_operator.planner.inputs import Fixed, Problem, Settings
from verl_operator.planner.megatron_options import MegatronOptions
from verl_operator.planner.reader import Reader

ENGINES = ("fsdp", "megatron")
#: verl's Hydra config of each engine (``--config-name``; main_ppo's default is ``ppo_trainer``).
CONFIG_NAME = {"fsdp": "ppo_trainer", "megatron": "ppo_megatron_trainer"}
#: verl's ``strategy`` values of each engine.
STRATEGIES = {"fsdp": ("fsdp", "fsdp2"), "megatron": ("megatron",)}
#: The registry's settings of the Megatron config (their keys select the engine; emitted for Megatron only).
MEGATRON_SETTINGS = SETTINGS.engine_settings("megatron")
#: Settings that exist only in the FSDP config (their keys are FSDP's; emitted for FSDP only).
FSDP_ONLY_SETTINGS = SETTINGS.engine_settings("fsdp")

_CONFIG_NAME = re.compile(r"^\s*(?:--config-name|-cn)(?:=|\s+)(?P<name>[A-Za-z0-9_.\-]+)\s*$")


@dataclass(frozen=True)
class EngineChoice:
    """The engine and where it was chosen (``source``: the field a violation names)."""

    engine: str
    source: str


def config_name_entries(overrides: Sequence[str]) -> tuple[set[int], tuple[str, str] | None, list[Violation]]:
    """The pasted ``--config-name NAME`` entries (also ``--config-name=NAME``, ``-cn NAME``) of the overrides.

    Returns:
        ``(their indices, (engine, source) of the last one or None, violations)``: a config other than
        verl's ``ppo_trainer`` / ``ppo_megatron_trainer`` is a violation.
    """
    indices: set[int] = set()
    engine: tuple[str, str] | None = None
    out: list[Violation] = []
    for index, text in enumerate(overrides):
        match = _CONFIG_NAME.match(text)
        if match is None:
            continue
        indices.add(index)
        name = match.group("name").removesuffix(".yaml")
        chosen = next((e for e, n in CONFIG_NAME.items() if n == name), None)
        if chosen is None:
            out.append(
                Violation(
                    field=f"spec.overrides[{index}]",
                    rule="config-name",
                    message=f"--config-name {name}: the planner models verl's ppo_trainer and ppo_megatron_trainer",
                    suggestions=[
                        "drop it, or use --config-name ppo_megatron_trainer for the Megatron engine"
                    ],
                )
            )
            continue
        engine = (chosen, f"spec.overrides[{index}] (--config-name)")
    return indices, engine, out


def choose_engine(
    spec_engine: tuple[str, str] | None,
    strategies: Sequence[tuple[str, str]],
    config_engine: tuple[str, str] | None,
    megatron_keys: Sequence[str],
) -> tuple[EngineChoice, list[Violation]]:
    """The engine of a job from every source that names one; two that disagree are a violation.

    Args:
        spec_engine: ``(engine, field)`` of ``spec.parallelism.engine`` when set.
        strategies: ``(strategy, source)`` of each pinned ``actor.strategy`` / ``critic.strategy``.
        config_engine: ``(engine, source)`` of a pasted ``--config-name``.
        megatron_keys: Sources of pinned ``*.megatron.*`` keys (they exist only in the Megatron config).
    """
    wanted: list[tuple[str, str]] = []
    if spec_engine is not None:
        wanted.append(spec_engine)
    if config_engine is not None:
        wanted.append(config_engine)
    for strategy, source in strategies:
        engine = next((e for e, names in STRATEGIES.items() if strategy in names), None)
        if engine is None:
            return EngineChoice("fsdp", source), [
                Violation(
                    field=source,
                    rule="strategy",
                    message=f"strategy {strategy!r} is not supported; the planner models fsdp, fsdp2 and megatron",
                    suggestions=["use strategy fsdp, fsdp2 or megatron"],
                )
            ]
        wanted.append((engine, source))
    if megatron_keys:
        wanted.append(("megatron", megatron_keys[0]))
    engines = {e for e, _ in wanted}
    if len(engines) > 1:
        first = wanted[0]
        other = next(w for w in wanted if w[0] != first[0])
        return EngineChoice(first[0], first[1]), [
            Violation(
                field=other[1],
                rule="engine-conflict",
                message=f"{first[1]} selects the {first[0]} engine but {other[1]} selects {other[0]}",
                suggestions=[f"set one engine: spec.parallelism.engine: {first[0]} or {other[0]}, not both"],
            )
        ]
    if not wanted:
        return EngineChoice("fsdp", "spec.parallelism.engine"), []
    return EngineChoice(wanted[0][0], wanted[0][1]), []


# -- the mesh ----------------------------------------------------------------------------------------------------
def model_parallel(s: Settings) -> int:
    """Model-parallel ranks of one Megatron data-parallel replica: ``TP x PP x CP``."""
    return s.megatron_tp * s.megatron_pp * s.megatron_cp


def data_parallel(s: Settings) -> int:
    """megatron-core's data-parallel size: ``world // (TP x PP x CP)`` (the rules check divisibility)."""
    return max(1, s.world // max(1, model_parallel(s)))


def state_shard(shape: ModelShape, params: float, s: Settings) -> int:
    """The memory model's shard of weights, gradients and optimizer state (see the module): the dense
    parameters split over ``TP x PP``, the routed experts' over ``EP x ETP x PP``; as one divisor of the
    whole parameter count (rounded down: the estimate stays conservative)."""
    dense_shard = s.megatron_tp * s.megatron_pp
    experts = expert_params(shape)
    if not experts or experts >= params:
        return dense_shard
    per_gpu = (params - experts) / dense_shard + experts / (s.megatron_ep * expert_tp(s) * s.megatron_pp)
    return max(1, int(params // per_gpu))


def expert_params(shape: ModelShape) -> float:
    """Parameters of the routed experts: ``layers x experts x 3 x hidden x moe_intermediate`` (gate, up, down)."""
    if not shape.num_experts or not shape.moe_intermediate_size:
        return 0.0
    return float(shape.layers * shape.num_experts * 3 * shape.hidden_size * shape.moe_intermediate_size)


def expert_tp(s: Settings) -> int:
    """The expert tensor parallel size: ETP when set, else TP (megatron-core's default)."""
    return s.megatron_etp if s.megatron_etp is not None else s.megatron_tp


def heads_allow_megatron_tp(shape: ModelShape, tp: int) -> bool:
    """Megatron TP ``tp`` splits the attention heads and the KV heads (query groups) evenly."""
    return shape.attention_heads % tp == 0 and shape.kv_heads % tp == 0


def layers_allow_pp(shape: ModelShape, pp: int, vpp: int | None = None) -> bool:
    """PP (and PP x VPP) split the layers evenly."""
    return shape.layers % (pp * (vpp or 1)) == 0


@dataclass(frozen=True)
class MegatronCandidate:
    """One Megatron mesh the search tries."""

    tp: int
    pp: int
    cp: int
    ep: int
    vpp: int | None
    etp: int | None


#: A sequence at least this long (prompt + response) makes context parallelism a search candidate: below it
#: the activations of one sequence fit one GPU's share of a TP group, and CP's KV exchange only costs.
LONG_CONTEXT_TOKENS = 32 * 1024
#: Context parallel sizes the search tries for a long context (divisors of the world, powers of two).
CP_SIZES = (1, 2, 4, 8)


def candidates(
    shape: ModelShape,
    world: int,
    gpus_per_node: int,
    nvlink_domain: int,
    fixed: Fixed,
    seq_len: int = 0,
    options: MegatronOptions | None = None,
) -> Iterator[MegatronCandidate]:
    """Megatron meshes to try, preferred first.

    Tie-break order (the search takes the first mesh whose rules hold and whose memory fits):

    1. the smallest model-parallel footprint ``TP x PP x CP`` (the largest DP);
    2. the larger TP (a TP group never crosses an NVLink domain: TP divides the domain within a node, the
       heads and the KV heads), so pipeline stages, not TP groups, span nodes;
    3. the smaller PP (CP before PP: both split activations, PP adds bubbles); CP is 1 unless pinned or the
       sequence is at least ``LONG_CONTEXT_TOKENS`` long;
    4. per mesh, one EP: for a MoE model the largest divisor of the experts that fits one node and tiles the
       ``W / PP`` ranks of a stage with ETP 1 (verl's MoE scripts' ETP; experts all-to-all inside a node);
    5. per mesh, VPP 2 when the search chose PP > 1 and the layers split into ``PP x 2`` equal stages.

    An unpinned PP divides the world and the layers (or splits them as the pinned first / last stage layers
    or the embedding and loss accounted as layers allow: ``megatron_options.stage_layers``). Pinned values are
    yielded as they are (the rules report what they break).

    Algorithm:
        Example: Qwen3-235B-A22B (64 heads, 4 KV heads, 94 layers, 128 experts) on 4 x 8 H20 with the embedding
        and loss accounted: TPs 1, 2, 4 (4 KV heads); PPs 1, 2, 4, 8 (96 / PP); meshes by footprint: (1,1),
        (2,1), (1,2), (4,1), (2,2), (1,4), (4,2), ... each with EP 8 (ETP 1) where ``32 / PP`` allows.
    """
    opts = options or MegatronOptions()
    domain = max(1, min(nvlink_domain, gpus_per_node)) if nvlink_domain else gpus_per_node
    tps = (
        [fixed.megatron_tp]
        if fixed.megatron_tp is not None
        else [t for t in arith.divisors(domain) if heads_allow_megatron_tp(shape, t)] or [1]
    )
    pps = (
        [fixed.megatron_pp]
        if fixed.megatron_pp is not None
        else [p for p in arith.divisors(world) if _stages_split(shape, p, opts)] or [1]
    )
    if fixed.megatron_cp is not None:
        cps = [fixed.megatron_cp]
    elif seq_len >= LONG_CONTEXT_TOKENS:
        cps = [c for c in CP_SIZES if world % c == 0]
    else:
        cps = [1]
    meshes = sorted(
        ((t * p * c, t, p, c) for t in tps for p in pps for c in cps), key=lambda x: (x[0], -x[1], x[2])
    )
    valid = [(tp, pp, cp) for _, tp, pp, cp in meshes if world % (tp * pp * cp) == 0]
    # None valid: the first is tried anyway, so that the rules report what the pinned values break.
    for tp, pp, cp in valid or [meshes[0][1:]]:
        etp = fixed.megatron_etp
        if etp is None and shape.num_experts and fixed.megatron_ep is None:
            etp = 1  # verl's MoE scripts: experts not tensor-split, EP inside a node instead
        yield MegatronCandidate(
            tp=tp,
            pp=pp,
            cp=cp,
            ep=fixed.megatron_ep or _default_ep(shape, world, tp if etp is None else etp, pp, gpus_per_node),
            vpp=fixed.megatron_vpp
            if fixed.megatron_vpp is not None
            else _default_vpp(shape, pp, fixed, opts),
            etp=etp,
        )


def _stages_split(shape: ModelShape, pp: int, options: MegatronOptions) -> bool:
    """PP ``pp`` splits the layers evenly, or as the job's pinned uneven split allows."""
    return layers_allow_pp(shape, pp) or (options.uneven and options.split(shape.layers, pp) is not None)


def check_engine(r: Reader, p: Problem, needs_critic: bool) -> list[Violation]:
    """What verl 0.9's Megatron engine asserts of its config when it is built, the GPUs already held: the model
    built through Megatron-Bridge (0.9.1 ``workers/engine/megatron/transformer_impl.py`` line 191, for the
    actor and the critic), and dynamic context parallelism with padding removed and no bucket padding (lines
    113-118; with no virtual pipeline, lines 123-124: the rule ``megatron-dynamic-cp``). verl 0.6 builds its
    Megatron workers otherwise (``use_mbridge`` off by default there).

    The FSDP engine's ``model.lora_rank`` is refused with Megatron unless ``model.lora.rank`` is on too
    (rule ``megatron-lora``): the Megatron engine ignores it and trains every weight, while the trainer, seeing
    a LoRA rank, builds no reference model and asks the actor for the reference log-probs, which fails once
    the first rollout is done (0.9.1 ``trainer/ppo/v1/trainer_base.py`` lines 234-237 and
    ``workers/engine/megatron/transformer_impl.py`` line 1128: no PEFT to disable). verl 0.6.1's Megatron
    model config has no ``lora_rank`` (its dataclass refuses the key).

    ``p`` holds the values already read (a bad one is already a violation); ``r`` gives the fields."""
    if p.version == "0.6":
        return []
    out = []
    if p.lora and not p.megatron_options.lora_rank:
        pin = r.reads["lora_rank"]
        out.append(
            Violation(
                field=pin.source,
                rule="megatron-lora",
                message=(
                    "model.lora_rank is the FSDP engine's LoRA: verl's Megatron engine ignores it and trains "
                    "every weight, and with a LoRA rank verl builds no reference model, so the first reference "
                    "log-prob pass fails"
                ),
                suggestions=[
                    f"use actor_rollout_ref.model.lora.rank={pin.value} (verl's Megatron LoRA) instead"
                ],
            )
        )
    mbridge = (
        ("megatron_use_mbridge", "megatron_critic_use_mbridge") if needs_critic else ("megatron_use_mbridge",)
    )
    for name in mbridge:
        if name in r.reads and r.get_bool(name, reads=True) is False:
            out.append(
                Violation(
                    field=r.reads[name].source,
                    rule="megatron-mbridge",
                    message="verl 0.9's Megatron engine builds the model through Megatron-Bridge: use_mbridge must be True",
                    suggestions=["drop the override (True is verl's default)"],
                )
            )
    if not p.megatron_options.dynamic_cp:
        return out
    for name, bad, why in (
        ("megatron_remove_padding", False, "dynamic_context_parallel requires use_remove_padding=True"),
        ("megatron_pad_to_length", True, "dynamic_context_parallel does not support pad_to_length"),
    ):
        if name in r.reads and r.get_bool(name, reads=True) is bad:
            out.append(
                Violation(
                    field=r.reads[name].source,
                    rule="megatron-dynamic-cp",
                    message=why,
                    suggestions=[
                        f"drop the override, or dynamic_context_parallel ({r.reads['megatron_dynamic_cp'].source})"
                    ],
                )
            )
    return out


def _default_vpp(shape: ModelShape, pp: int, fixed: Fixed, options: MegatronOptions) -> int | None:
    """VPP 2 for a PP the search chose (> 1) whose layers split into ``PP x 2`` equal virtual stages, else
    unset (a pinned PP keeps verl's default, no interleaving; nor is one chosen for an uneven split: a pinned
    VPP is checked against each of its stages, ``megatron_options.stage_layers``)."""
    if fixed.megatron_pp is not None or pp <= 1 or options.uneven or options.dynamic_cp:
        return None
    return 2 if shape.layers % (pp * 2) == 0 else None


def _default_ep(shape: ModelShape, world: int, etp: int, pp: int, gpus_per_node: int) -> int:
    """The largest EP that divides the experts, keeps ``EP x ETP`` inside one node and tiles the ``W / PP``
    ranks of a pipeline stage; 1 for a dense model."""
    if not shape.num_experts:
        return 1
    ranks = world // pp
    fitting = [
        e for e in arith.divisors(shape.num_experts) if e * etp <= gpus_per_node and ranks % (e * etp) == 0
    ]
    return max(fitting, default=1)


def settings_of(base: Settings, c: MegatronCandidate) -> Settings:
    """``base`` with the Megatron mesh of ``c`` (no Ulysses SP, no FSDP shard group)."""
    return replace(
        base,
        sequence_parallel_size=1,
        fsdp_size=-1,
        megatron_tp=c.tp,
        megatron_pp=c.pp,
        megatron_cp=c.cp,
        megatron_ep=c.ep,
        megatron_vpp=c.vpp,
        megatron_etp=c.etp,
    )


def keys_line(version: str, engine: str) -> str:
    """The key table of ``planner/verl_keys.py`` for a release line and engine (``0.6``, ``0.6/megatron``)."""
    return version if engine == "fsdp" else f"{version}/megatron"


def fixed_offload(fixed: Fixed, param: bool | None, optimizer: bool | None) -> Fixed:
    """The pinned offloads of a Megatron job: ``spec.offload.*`` or the ``actor.megatron.*_offload`` keys."""
    return replace(
        fixed,
        param_offload=fixed.param_offload if fixed.param_offload is not None else param,
        optimizer_offload=fixed.optimizer_offload if fixed.optimizer_offload is not None else optimizer,
    )
