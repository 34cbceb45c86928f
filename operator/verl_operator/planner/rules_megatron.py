"""The rules of verl's Megatron engine and megatron-core (``docs/planner.md`` lists them with their code).

Each rule is ``(problem, mesh) -> list[Violation]`` and holds trivially for an FSDP job. The mesh's
``data_parallel_size`` is megatron-core's ``world / (TP x PP x CP)`` for a Megatron job (``planner/mesh.py``),
so the batch rules of ``planner/rules.py`` (mini-batch per GPU, micro-batch divides the mini-batch, the
token budgets) apply to it unchanged: verl's Megatron workers normalise the same numbers by that DP
(0.6.1 ``workers/megatron_workers.py`` lines 273-279 for the actor, 285-291 for the ref, 923-927 for the
critic). Messages show the arithmetic and the nearest valid values.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from verl_operator.api.plan import Violation
from verl_operator.planner import arith, megatron_memory, megatron_options
from verl_operator.planner.arith import or_text as _or
from verl_operator.planner.inputs import SPEC_PATHS, Problem
from verl_operator.planner.megatron import expert_tp, model_parallel
from verl_operator.planner.mesh import Mesh, fits_nvlink_domain

Rule = Callable[[Problem, Mesh], list[Violation]]


def _field(p: Problem, name: str) -> str:
    return p.source(name, SPEC_PATHS.get(name, name))


def _on(p: Problem, mesh: Mesh) -> bool:
    return p.training_engine == "megatron"


def world_divisible(p: Problem, mesh: Mesh) -> list[Violation]:
    """The world divides by ``TP x PP x CP`` (0.6.1 ``utils/config.py`` ``validate_config`` lines 95-100, 0.9.1
    lines 109-114: ``n_gpus must be divisible by model_parallel_size times context_parallel_size``; megatron-core
    ``parallel_state.initialize_model_parallel`` raises the same)."""
    if not _on(p, mesh):
        return []
    s = mesh.settings
    mp = model_parallel(s)
    if s.world % mp == 0:
        return []
    sizes = {"megatron_tp": s.megatron_tp, "megatron_pp": s.megatron_pp, "megatron_cp": s.megatron_cp}
    suggestions = []
    for name, current in sizes.items():
        others = mp // current
        ok = [v for v in arith.divisors(s.world) if s.world % (v * others) == 0]
        near = sorted(
            {max((v for v in ok if v < current), default=0), *[v for v in ok if v > current][:1]} - {0}
        )
        if near:
            suggestions.append(f"use {name.removeprefix('megatron_').upper()} {_or(near)}")
    named = next((n for n in sizes if p.pinned(n) and sizes[n] > 1), "megatron_tp")
    return [
        Violation(
            field=_field(p, named),
            rule="megatron-world-divisible",
            message=(
                f"{s.world} GPUs do not divide into TP {s.megatron_tp} x PP {s.megatron_pp} x CP {s.megatron_cp} "
                f"= {mp} model-parallel ranks ({s.world} % {mp} = {s.world % mp})"
            ),
            suggestions=[" or ".join(suggestions)] if suggestions else [],
        )
    ]


def heads_divisible(p: Problem, mesh: Mesh) -> list[Violation]:
    """TP splits the attention heads and a dense MLP evenly, and the KV heads (query groups) are a multiple of TP; with verl 0.9's
    megatron-core (0.16.1) the KV heads may also divide TP (each is then replicated). megatron-core
    ``TransformerConfig.__post_init__``: 0.14.0 ``transformer/transformer_config.py`` lines 680-700, 0.16.1
    lines 923-946 (``num_query_groups ... must be a multiple or divisor of tensor_model_parallel_size``)."""
    if not _on(p, mesh):
        return []
    tp = mesh.settings.megatron_tp
    heads, kv = p.shape.attention_heads, p.shape.kv_heads

    # A dense MLP's fc2 is a RowParallelLinear over ffn_hidden_size: megatron-core's ``divide()`` asserts
    # ``ffn_hidden_size % TP == 0`` (``tensor_parallel/layers.py``); a MoE model's only where it has leading
    # dense layers.
    ffn = p.shape.intermediate_size
    dense = p.shape.num_experts is None or (p.shape.first_k_dense_replace or 0) > 0

    def kv_ok(t: int) -> bool:
        return kv % t == 0 or (p.version != "0.6" and t % kv == 0)

    def ffn_ok(t: int) -> bool:
        return not dense or ffn % t == 0

    bad = [
        f"the model's {heads} attention heads do not divide by TP {tp} ({heads} % {tp} = {heads % tp})"
    ] * (heads % tp != 0)
    if not kv_ok(tp):
        either = "" if p.version == "0.6" else f" and do not divide TP {tp}"
        bad.append(f"the model's {kv} KV heads do not divide by TP {tp} ({kv} % {tp} = {kv % tp}){either}")
    if not ffn_ok(tp):
        bad.append(
            f"the model's intermediateSize {ffn} does not divide by TP {tp} ({ffn} % {tp} = {ffn % tp})"
        )
    if not bad:
        return []
    ok = [d for d in arith.divisors(heads) if kv_ok(d) and ffn_ok(d)]
    near = [max((d for d in ok if d < tp), default=1), *[d for d in ok if d > tp][:1]]
    return [
        Violation(
            field=_field(p, "megatron_tp"),
            rule="megatron-tp-heads",
            message="; ".join(bad),
            suggestions=[f"use TP {_or(sorted(set(near)))}"],
        )
    ]


def layers_divisible(p: Problem, mesh: Mesh) -> list[Violation]:
    """PP (with VPP: PP x VPP) splits the layers evenly (megatron-core ``transformer/transformer_block.py``
    ``get_num_layers_to_build``: ``num_layers // pipeline_model_parallel_size``, and with an interleaved
    schedule ``num_layers_per_pipeline_rank // virtual_pipeline_model_parallel_size``; verl's scripts that
    pin uneven first/last stages set ``override_transformer_config.num_layers_in_first_pipeline_stage``,
    or the embedding and loss as layers, ``account_for_*_in_pipeline_split``: an uneven split that
    ``megatron_options.stage_layers`` builds is accepted, with VPP when each stage's layers divide by it)."""
    if not _on(p, mesh):
        return []
    s = mesh.settings
    stages = s.megatron_pp * (s.megatron_vpp or 1)
    layers = p.shape.layers
    options = p.megatron_options
    if options.uneven:  # the pinned split decides, even where PP divides the layers
        if megatron_memory.uneven_split(p, s.megatron_pp, s.megatron_vpp):
            return []
        return [_uneven_violation(p, s.megatron_pp, s.megatron_vpp)]
    if layers % stages == 0:
        return []
    vpp = s.megatron_vpp is not None and s.megatron_vpp > 1 and layers % s.megatron_pp == 0
    name = "megatron_vpp" if vpp else "megatron_pp"
    current = s.megatron_vpp if vpp else s.megatron_pp
    base = s.megatron_pp if vpp else (s.megatron_vpp or 1)
    ok = [d // base for d in arith.divisors(layers) if d % base == 0]
    near = sorted(
        v
        for v in {
            max((v for v in ok if v < (current or 1)), default=1),
            *[v for v in ok if v > (current or 1)][:1],
        }
    )
    what = f"PP {s.megatron_pp} x VPP {s.megatron_vpp}" if s.megatron_vpp else f"PP {s.megatron_pp}"
    return [
        Violation(
            field=_field(p, name),
            rule="megatron-layers-divisible",
            message=f"the model's {layers} layers do not divide into {what} = {stages} stages ({layers} % {stages} = {layers % stages})",
            suggestions=[f"use {name.removeprefix('megatron_').upper()} {_or(near)}"],
        )
    ]


def _uneven_violation(p: Problem, pp: int, vpp: int | None) -> Violation:
    """The pinned first / last stage layers (or the embedding / loss accounted as layers) leave a remainder
    that the other stages cannot share evenly (megatron-core ``TransformerConfig.__post_init__``: the
    layers left after the pinned stages must divide by the stages left), or, with a virtual pipeline size,
    a stage's layers that do not divide by it (``megatron_options.stage_layers``)."""
    o, layers = p.megatron_options, p.shape.layers
    split = o.split(layers, pp)
    if vpp and split is not None:
        ok = [v for v in range(2, max(split) + 1) if o.split(layers, pp, v) is not None]
        near = sorted({max((v for v in ok if v < vpp), default=0), *[v for v in ok if v > vpp][:1]} - {0})
        first, last = o.first_stage_layers, o.last_stage_layers
        if first is not None or last is not None:
            counts = [f"{k} stage {n}" for k, n in (("first", first), ("last", last)) if n is not None]
            if pp - (first is not None) - (last is not None):  # middle stages, all of one size
                counts.append(f"middle stages {split[1 if first is not None else 0]} each")
            arithmetic = f"the stages' layers ({', '.join(counts)}) must each divide by VPP {vpp}"
        else:
            share = (layers + o.account_for_embedding + o.account_for_loss) // pp
            arithmetic = (
                f"each stage's share of the layers with the embedding / loss counted, {share}, must divide by "
                f"VPP {vpp} ({share} % {vpp} = {share % vpp})"
            )
        return Violation(
            field=_field(p, "megatron_vpp"),
            rule="megatron-layers-divisible",
            message=f"the pinned pipeline split on PP {pp}: {arithmetic}",
            suggestions=[f"use VPP {_or(near)}"] if near else ["unset the virtual pipeline size"],
        )
    if o.first_stage_layers is not None or o.last_stage_layers is not None:
        inner = layers - (o.first_stage_layers or 0) - (o.last_stage_layers or 0)
        rest = pp - (o.first_stage_layers is not None) - (o.last_stage_layers is not None)
        pinned = "".join(
            f" - {n} on the {name} stage"
            for n, name in ((o.first_stage_layers, "first"), (o.last_stage_layers, "last"))
            if n is not None
        )
        arithmetic = (
            f"{layers} layers{pinned} = {inner} left for {rest} stages ({inner} % {max(rest, 1)} = "
            f"{inner % max(rest, 1)})"
        )
        ok = [
            q
            for q in range(2, 65)
            if megatron_options.stage_layers(layers, q, o.first_stage_layers, o.last_stage_layers) is not None
        ]
        stage_fixes = _pinned_stage_fixes(layers, pp, o.first_stage_layers, o.last_stage_layers)
    else:
        total = layers + o.account_for_embedding + o.account_for_loss
        arithmetic = (
            f"{layers} layers + the accounted embedding/loss = {total}, {total} % {pp} = {total % pp}"
        )
        ok = [q for q in range(2, 65) if total % q == 0]
        stage_fixes = []
    near = sorted({max((q for q in ok if q < pp), default=0), *[q for q in ok if q > pp][:1]} - {0})
    suggestions = [f"use PP {_or(near)}"] if near else []
    suggestions += stage_fixes or ([] if near else ["change the first/last pipeline stage layers"])
    return Violation(
        field=_field(p, "megatron_pp"),
        rule="megatron-layers-divisible",
        message=f"the pinned pipeline split does not build on PP {pp}: {arithmetic}",
        suggestions=suggestions,
    )


def _pinned_stage_fixes(layers: int, pp: int, first: int | None, last: int | None) -> list[str]:
    """On the same PP, the pinned stage's nearest layer counts that split (one pinned stage at a time)."""
    out = []
    for name, value in (("first", first), ("last", last)):
        if value is None:
            continue

        def splits(n: int, name: str = name) -> bool:
            pinned = (n, last) if name == "first" else (first, n)
            return n < layers and megatron_options.stage_layers(layers, pp, *pinned) is not None

        near = arith.nearest(value, splits, limit=layers)
        if near:
            key = f"num_layers_in_{name}_pipeline_stage"
            out.append(f"on PP {pp}, set override_transformer_config.{key} to {_or(near)}")
    return out


def vpp_needs_pp(p: Problem, mesh: Mesh) -> list[Violation]:
    """A virtual pipeline size (any, 1 included) needs PP > 1 (megatron-core 0.14.0 ``parallel_state.py``
    ``initialize_model_parallel`` lines 656-660, 0.16.1 lines 745-749: ``if virtual_pipeline_model_parallel_size
    is not None: if not pipeline_model_parallel_size > 1: raise``)."""
    if not _on(p, mesh):
        return []
    s = mesh.settings
    if s.megatron_vpp is None or s.megatron_pp > 1:
        return []
    return [
        Violation(
            field=_field(p, "megatron_vpp"),
            rule="megatron-vpp-needs-pp",
            message=(
                f"virtual pipeline size {s.megatron_vpp} with PP {s.megatron_pp}: megatron-core's interleaved "
                "schedule needs PP > 1 (it refuses any virtual pipeline size with PP 1)"
            ),
            suggestions=["drop virtualPipelineParallelSize (null), or set pipelineParallelSize to 2 or more"],
        )
    ]


def expert_tp_sequence_parallel(p: Problem, mesh: Mesh) -> list[Violation]:
    """EP > 1 with TP > 1 needs sequence parallelism (megatron-core 0.14.0 ``model_parallel_config.py``
    ``ModelParallelConfig.__post_init__`` lines 387-392: ``When using expert parallelism and tensor
    parallelism, sequence parallelism must be used``); verl passes ``megatron.sequence_parallel`` (default
    True) to the transformer config."""
    if not _on(p, mesh):
        return []
    s = mesh.settings
    if p.megatron_sequence_parallel is not False or s.megatron_ep <= 1 or s.megatron_tp <= 1:
        return []
    return [
        Violation(
            field=_field(p, "megatron_sequence_parallel"),
            rule="megatron-ep-tp-sequence-parallel",
            message=(
                f"EP {s.megatron_ep} with TP {s.megatron_tp} and megatron.sequence_parallel=False: megatron-core "
                "needs sequence parallelism when both expert and tensor parallelism are used"
            ),
            suggestions=["set megatron.sequence_parallel=True", "or use TP 1, or EP 1"],
        )
    ]


def experts_divisible(p: Problem, mesh: Mesh) -> list[Violation]:
    """EP splits the routed experts evenly (megatron-core ``transformer/moe/moe_layer.py``:
    ``num_moe_experts % expert_model_parallel_size == 0``); EP > 1 needs a mixture-of-experts model; and
    ``EP x ETP`` tiles the ``TP x DP x CP`` ranks of a pipeline stage (``parallel_state``:
    ``world_size / PP`` divisible by ``expert_tensor_parallel_size x expert_model_parallel_size``)."""
    if not _on(p, mesh):
        return []
    s = mesh.settings
    ep, etp = s.megatron_ep, expert_tp(s)
    experts = p.shape.num_experts
    out: list[Violation] = []
    if ep > 1 and not experts:
        out.append(
            Violation(
                field=_field(p, "megatron_ep"),
                rule="megatron-ep-needs-moe",
                message=f"expert parallel size {ep} needs a mixture-of-experts model (spec.model.shape.numExperts)",
                suggestions=["use EP 1, or give the model's numExperts"],
            )
        )
        return out
    if experts and experts % ep:
        near = arith.nearest_divisor(ep, experts)
        out.append(
            Violation(
                field=_field(p, "megatron_ep"),
                rule="megatron-experts-divisible",
                message=f"the model's {experts} experts do not divide by EP {ep} ({experts} % {ep} = {experts % ep})",
                suggestions=[f"use EP {_or(near)}"],
            )
        )
    ranks = s.world // max(1, s.megatron_pp)
    if ranks % (ep * etp):
        out.append(_expert_mesh_violation(p, mesh, ranks, ep, etp))
    return out


def _expert_mesh_violation(p: Problem, mesh: Mesh, ranks: int, ep: int, etp: int) -> Violation:
    """EP x ETP does not tile a stage's ranks: the field of the factor to change (ETP when it is pinned and
    no other EP tiles with it), and the nearest other values of each factor that do; never the value set."""
    s, experts = mesh.settings, p.shape.num_experts
    eps = [e for e in arith.divisors(ranks) if ranks % (e * etp) == 0 and (not experts or experts % e == 0)]
    etps = [t for t in arith.divisors(ranks) if ranks % (ep * t) == 0]
    near_ep, near_etp = _nearest_other(ep, eps), _nearest_other(etp, etps)
    blame_etp = s.megatron_etp is not None and p.pinned("megatron_etp") and (not near_ep or ranks % etp != 0)
    suggestions = [f"use EP {_or(near_ep)}"] if near_ep and not blame_etp else []
    if near_etp:
        suggestions.append(f"use ETP {_or(near_etp)}")
    return Violation(
        field=_field(p, "megatron_etp") if blame_etp else _field(p, "megatron_ep"),
        rule="megatron-expert-mesh",
        message=(
            f"EP {ep} x ETP {etp} = {ep * etp} does not tile the {ranks} TP x DP x CP ranks of a pipeline "
            f"stage ({s.world} GPUs / PP {s.megatron_pp}; {ranks} % {ep * etp} = {ranks % (ep * etp)})"
        ),
        suggestions=suggestions,
    )


def _nearest_other(value: int, ok: list[int]) -> list[int]:
    """The valid values nearest below and above ``value``, ``value`` itself left out."""
    below = [v for v in ok if v < value]
    above = [v for v in ok if v > value]
    return sorted({*below[-1:], *above[:1]})


def ep_nvlink(p: Problem, mesh: Mesh) -> list[Violation]:
    """With ``placement.nvlink: required``, an expert-parallel group (EP x ETP ranks: the tokens' all-to-all
    of every MoE layer) sits inside one NVLink domain, as the TP group does (:func:`tp_nvlink`)."""
    if not _on(p, mesh) or not p.nvlink_required:
        return []
    s = mesh.settings
    etp = expert_tp(s)
    group, dom = s.megatron_ep * etp, p.nvlink_domain
    if group <= 1 or fits_nvlink_domain(group, dom):
        return []
    experts = p.shape.num_experts
    ok = [
        e
        for e in arith.divisors(dom)
        if fits_nvlink_domain(e * etp, dom) and (not experts or experts % e == 0)
    ]
    near = _nearest_other(s.megatron_ep, ok)
    where = (
        f"spans {-(-group // dom)} NVLink domains of {dom} GPUs"
        if group > dom
        else f"does not tile the NVLink domains of {dom} GPUs ({dom} % {group} = {dom % group})"
    )
    return [
        Violation(
            field=_field(p, "megatron_ep"),
            rule="megatron-ep-nvlink",
            message=(
                f"the expert-parallel group of EP {s.megatron_ep} x ETP {etp} = {group} GPUs {where}, and "
                "spec.placement.nvlink is required (the all-to-all of every MoE layer stays inside a domain)"
            ),
            suggestions=[
                *([f"use EP {_or(near)}"] if near else []),
                "or set spec.placement.nvlink: preferred",
            ],
        )
    ]


def tp_nvlink(p: Problem, mesh: Mesh) -> list[Violation]:
    """With ``placement.nvlink: required``, the Megatron TP group sits inside one NVLink domain (TP's
    all-reduces run every layer; across nodes they are the slowest link)."""
    if not _on(p, mesh) or not p.nvlink_required:
        return []
    tp, dom = mesh.settings.megatron_tp, p.nvlink_domain
    if fits_nvlink_domain(tp, dom):
        return []
    return [
        Violation(
            field=_field(p, "megatron_tp"),
            rule="megatron-tp-nvlink",
            message=f"Megatron TP {tp} does not fit the NVLink domain of {dom} GPUs (placement.nvlink: required)",
            suggestions=[
                f"use TP {max(d for d in arith.divisors(dom) if d <= tp)}",
                "or set spec.placement.nvlink: preferred",
            ],
        )
    ]


def minimal_batch(p: Problem, mesh: Mesh) -> list[Violation]:
    """Without dynamic batch size, ``train_batch_size x n`` divides by Megatron's DP x the actor's micro-batch
    (0.6.1 ``utils/config.py`` ``validate_config`` lines 89-113, 0.9.1 lines 103-127: ``real_train_batch_size
    must be divisible by minimal possible batch size``, ``minimal_bsz = megatron_dp x
    ppo_micro_batch_size_per_gpu``)."""
    s = mesh.settings
    if not _on(p, mesh) or s.dynamic_batch_size or not s.ppo_micro_batch_size_per_gpu:
        return []
    unit = mesh.data_parallel_size * s.ppo_micro_batch_size_per_gpu
    if mesh.trajectories % unit == 0:
        return []
    near = arith.nearest_multiple(s.train_batch_size, mesh.batch_step(unit))
    return [
        Violation(
            field=_field(p, "train_batch_size"),
            rule="megatron-minimal-batch",
            message=(
                f"{s.train_batch_size} x {s.rollout_n} = {mesh.trajectories} trajectories per step do not divide by "
                f"Megatron DP {mesh.data_parallel_size} x micro-batch {s.ppo_micro_batch_size_per_gpu} = {unit} "
                f"({mesh.trajectories} % {unit} = {mesh.trajectories % unit})"
            ),
            suggestions=[f"use trainBatchSize {_or(near)}"] if near else [],
        )
    ]


def megatron_dtype(p: Problem, mesh: Mesh) -> list[Violation]:
    """``spec.model.dtype: float16`` is not planned with Megatron: verl's Megatron workers need mbridge for it
    (0.6.1 ``workers/megatron_workers.py`` line 162: ``fp16 mode requires use_mbridge to be True``), and the
    planner's float16 keys are FSDP's (``planner/dialect.py`` ``dtype_keys``)."""
    if not _on(p, mesh) or p.dtype != "float16":
        return []
    return [
        Violation(
            field="spec.model.dtype",
            rule="megatron-dtype",
            message="dtype float16 with the megatron engine is not planned (verl's Megatron fp16 path needs mbridge)",
            suggestions=["use dtype bfloat16 on GPUs that support it, or the fsdp engine"],
        )
    ]


def dynamic_cp_vpp(p: Problem, mesh: Mesh) -> list[Violation]:
    """verl 0.9's dynamic context parallelism takes no virtual pipeline (0.9.1
    ``workers/engine/megatron/transformer_impl.py`` lines 123-124, when the engine is built)."""
    vpp = mesh.settings.megatron_vpp
    if not _on(p, mesh) or not p.megatron_options.dynamic_cp or vpp in (None, 1):
        return []
    return [
        Violation(
            field=_field(p, "megatron_vpp"),
            rule="megatron-dynamic-cp",
            message=f"dynamic_context_parallel does not support a virtual pipeline (VPP {vpp})",
            suggestions=["unset the virtual pipeline size, or dynamic_context_parallel"],
        )
    ]


#: Where a uniform recompute's chunk is pinned (an override of the actor's transformer config).
RECOMPUTE_LAYERS_FIELD = (
    "spec.overrides (actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers)"
)


def uniform_recompute_chunks(p: Problem, mesh: Mesh) -> list[Violation]:
    """Uniform full recompute checkpoints chunks of ``recompute_num_layers`` layers from each (virtual) pipeline
    stage's first layer, and the last chunk must end at the stage's last layer: megatron-core 0.14.0
    ``transformer/transformer_block.py`` lines 431-441 call ``custom(layer_idx, layer_idx +
    recompute_num_layers)`` while ``layer_idx < num_layers_per_pipeline_rank``, and ``custom`` indexes
    ``self.layers[index]`` (lines 364-365, 380-385): a chunk that does not divide a stage's layers runs past the
    stage (IndexError at the first step). Example: 28 layers on PP 4 are 7 per stage; chunks of 2 end at
    layer 8: use recompute_num_layers 1 or 7, or PP 2 (14 per stage) or 7 (4)."""
    o = p.megatron_options
    if not _on(p, mesh) or o.recompute_granularity != "full" or o.recompute_method != "uniform":
        return []
    chunk = o.recompute_num_layers
    if chunk is None or chunk < 1:
        return []  # megatron_memory.check_recompute reports a missing one
    s = mesh.settings
    pp, vpp = s.megatron_pp, s.megatron_vpp or 1
    split = o.split(p.shape.layers, pp, s.megatron_vpp) if o.uneven else None
    stages = split if split is not None else (p.shape.layers // pp,) * pp
    per_chunk = sorted({n // vpp for n in stages if n})
    bad = [n for n in per_chunk if n % chunk]
    if not bad:
        return []
    n = bad[0]
    where = f"PP {pp} x VPP {vpp}" if vpp > 1 else f"PP {pp}"
    fits = arith.divisors(math.gcd(*per_chunk))
    near = sorted(set(arith.nearest(chunk, lambda c: c in fits, limit=max(per_chunk) + 1)))
    others = [
        q
        for q in arith.divisors(p.shape.layers)
        if q != pp and q <= 64 and (p.shape.layers // q) % (chunk * vpp) == 0
    ][:3]
    suggestions = [f"use recompute_num_layers {_or(near)}"] if near else []
    if others and not o.uneven:
        suggestions.append(f"or PP {_or(others)}")
    return [
        Violation(
            field=RECOMPUTE_LAYERS_FIELD,
            rule="megatron-recompute-chunks",
            message=(
                f"uniform recompute in chunks of recompute_num_layers {chunk} runs past a stage of {n} layers "
                f"({where}; {n} % {chunk} = {n % chunk}): megatron-core's last chunk takes layers "
                f"{n // chunk * chunk} to {n // chunk * chunk + chunk - 1} of a stage of layers 0 to {n - 1} "
                "(IndexError at the first step)"
            ),
            suggestions=suggestions,
        )
    ]


#: The Megatron rules, in the order their violations are reported.
RULES: tuple[Rule, ...] = (
    world_divisible,
    heads_divisible,
    layers_divisible,
    uniform_recompute_chunks,
    vpp_needs_pp,
    experts_divisible,
    expert_tp_sequence_parallel,
    tp_nvlink,
    ep_nvlink,
    minimal_batch,
    megatron_dtype,
    dynamic_cp_vpp,
)


def warnings(p: Problem, mesh: Mesh) -> list[str]:
    """What verl changes silently: ``sequence_parallel`` pinned on with TP 1 is turned off (0.6.1 and 0.9.1
    ``workers/config/engine.py`` ``McoreEngineConfig.__post_init__``, 0.6.1 lines 81-83)."""
    if not _on(p, mesh) or p.megatron_sequence_parallel is not True or mesh.settings.megatron_tp > 1:
        return []
    return [
        "megatron.sequence_parallel=True with TP 1: verl turns sequence parallelism off (it needs TP > 1)"
    ]
