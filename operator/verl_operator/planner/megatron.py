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

The search (``candidates``) is a simple deterministic one: the smallest ``TP x PP`` first (the largest DP),
then the larger TP (a TP group stays inside one NVLink domain; PP adds pipeline bubbles), TP inside one NVLink domain and
dividing the heads and KV heads, PP dividing the layers. The memory model is the FSDP one with the weights,
gradients and optimizer state divided by ``TP x PP`` instead of the FSDP shard group (an approximation: it
ignores the distributed optimizer's further split over DP, which only makes the estimate conservative, and
the uneven first and last stages).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from verl_operator.api.plan import Violation
from verl_operator.api.spec import ModelShape
from verl_operator.planner import arith
from verl_operator.planner.inputs import Fixed, Settings

ENGINES = ("fsdp", "megatron")
#: verl's Hydra config of each engine (``--config-name``; main_ppo's default is ``ppo_trainer``).
CONFIG_NAME = {"fsdp": "ppo_trainer", "megatron": "ppo_megatron_trainer"}
#: verl's ``strategy`` values of each engine.
STRATEGIES = {"fsdp": ("fsdp", "fsdp2"), "megatron": ("megatron",)}
#: The registry's Megatron settings (their keys select the engine).
MEGATRON_SETTINGS = (
    "megatron_tp",
    "megatron_pp",
    "megatron_vpp",
    "megatron_cp",
    "megatron_ep",
    "megatron_etp",
    "megatron_sequence_parallel",
    "megatron_param_offload",
    "megatron_optimizer_offload",
)
#: Settings that exist only in the FSDP config (their keys are FSDP's; emitted for FSDP only).
FSDP_ONLY_SETTINGS = ("sequence_parallel_size", "fsdp_size", "param_offload", "optimizer_offload")

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


def candidates(
    shape: ModelShape, world: int, gpus_per_node: int, nvlink_domain: int, fixed: Fixed
) -> Iterator[MegatronCandidate]:
    """Megatron meshes to try, preferred first: the smallest ``TP x PP`` (largest DP), then the larger TP.

    An unpinned TP divides the heads, the KV heads and the GPUs of one NVLink domain (never crossing it); an
    unpinned PP divides the layers and the world; CP is 1 unless pinned; an unpinned EP is the largest
    divisor of the experts that fits one node and tiles ``TP x DP x CP``; VPP and ETP stay unset unless
    pinned. Pinned values are yielded as they are (the rules report them).
    """
    domain = max(1, min(nvlink_domain, gpus_per_node)) if nvlink_domain else gpus_per_node
    tps = (
        [fixed.megatron_tp]
        if fixed.megatron_tp is not None
        else [t for t in arith.divisors(domain) if heads_allow_megatron_tp(shape, t)] or [1]
    )
    pps = (
        [fixed.megatron_pp]
        if fixed.megatron_pp is not None
        else [p for p in arith.divisors(world) if layers_allow_pp(shape, p)] or [1]
    )
    cp = fixed.megatron_cp or 1
    meshes = sorted(((t * p, t, p) for t in tps for p in pps), key=lambda x: (x[0], -x[1]))
    valid = [(tp, pp) for _, tp, pp in meshes if world % (tp * pp * cp) == 0]
    # None valid: the first is tried anyway, so that the rules report what the pinned values break.
    for tp, pp in valid or [(meshes[0][1], meshes[0][2])]:
        yield MegatronCandidate(
            tp=tp,
            pp=pp,
            cp=cp,
            ep=fixed.megatron_ep or _default_ep(shape, world, tp, pp, cp, gpus_per_node),
            vpp=fixed.megatron_vpp,
            etp=fixed.megatron_etp,
        )


def _default_ep(shape: ModelShape, world: int, tp: int, pp: int, cp: int, gpus_per_node: int) -> int:
    """The largest EP that divides the experts, fits one node and with ETP = TP tiles ``TP x DP x CP``
    (``world / PP``); 1 for a dense model."""
    if not shape.num_experts:
        return 1
    ranks = world // pp
    fitting = [e for e in arith.divisors(shape.num_experts) if e <= gpus_per_node and ranks % (e * tp) == 0]
    return max(fitting, default=1)


def settings_of(base: Settings, c: MegatronCandidate) -> Settings:
    """``base`` with the Megatron mesh of ``c`` (no Ulysses SP, no FSDP shard group)."""
    return replace(
        base,
        training_engine="megatron",
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
