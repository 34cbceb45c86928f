"""The advisor: from a run's measured phases and the job's plan, the next single changes to try (pure).

Each rule looks at the phases (``advisor.phases``) and, where it needs them, the plan's numbers (micro-batch
sizes, KV cache, memory), proposes one change with the reason in numbers and the expected effect where a
model gives one, and every change is re-planned by the planner on the job's nodes before it is kept: a change
the planner refuses is never shown as advice (it is listed under ``refused`` with the planner's reason).
Without the job and its nodes nothing can be re-planned; the advice is then marked ``checked: false``.
The sources of every rule's numbers are in docs/advisor.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from verl_operator.advisor.phases import GENERATION_TARGET, RunPhases, first
from verl_operator.advisor.replan import Change, Nodes, replan
from verl_operator.api.plan import Plan, PlanResult
from verl_operator.api.spec import VerlJobSpec

#: A phase group must take at least this share of the step before a rule spends advice on it.
MIN_SHARE = 0.10
#: Responses clipped at maxResponseLength above this share are worth a longer limit (or a shorter task).
CLIP_RATIO = 0.05
#: Padding above this share of the tokens a micro-batch holds is worth packing by tokens instead.
PADDING_WASTE = 0.30
#: gpu_memory_utilization values tried, highest first (vLLM's own default is 0.9).
GPU_MEMORY_UTILIZATION_STEPS = (0.9, 0.85, 0.8, 0.75, 0.7)
#: The weight-sync bucket's default per release line: verl 0.6.1 rollout.yaml:247 (512 MB); verl 0.9's
#: rollout.checkpoint_engine (workers/config/rollout.py, 2048 MB).
BUCKET_KEYS = {
    "0.6": ("actor_rollout_ref.rollout.update_weights_bucket_megabytes", 512),
    "0.9": ("actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes", 2048),
}
#: verl's measured asynchronous-trainer speed-ups (docs/advance/fully_async.md; one_step_off.md).
ASYNC_MEASURED = (
    "verl measured 1.72x to 2.67x per 100 steps with its fully asynchronous trainer for Qwen2.5-7B on 32 to "
    "128 H20 (16:16 to 64:64, docs/advance/fully_async.md) and 1.23x to 1.40x with one-step-off "
    "(docs/advance/one_step_off.md)"
)


@dataclass(frozen=True)
class AsyncSplit:
    """GPUs of the rollout side and of the trainer side of an asynchronous trainer."""

    rollout_gpus: int
    trainer_gpus: int


@dataclass(frozen=True)
class Advice:
    """One change: the setting (a spec path or a verl override key), its value, why and what it should do."""

    rule: str
    setting: str
    value: Any
    reason: str
    effect: str
    #: Median seconds of the phases the change acts on (the order of the advice).
    at_stake: float
    checked: bool = False
    async_split: AsyncSplit | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rule": self.rule,
            "setting": self.setting,
            "value": self.value,
            "reason": self.reason,
            "effect": self.effect,
            "checked": self.checked,
        }
        if self.async_split is not None:
            out["asyncSplit"] = {
                "rolloutGpus": self.async_split.rollout_gpus,
                "trainerGpus": self.async_split.trainer_gpus,
            }
        return out


@dataclass(frozen=True)
class Refused:
    """A change a rule proposed and the planner refused, with the planner's first reason."""

    rule: str
    setting: str
    value: Any
    reason: str


@dataclass(frozen=True)
class Report:
    """The advisor's answer for one run."""

    run: RunPhases
    advice: tuple[Advice, ...]
    refused: tuple[Refused, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def async_split(self) -> AsyncSplit | None:
        return next((a.async_split for a in self.advice if a.async_split is not None), None)

    def to_json(self) -> dict[str, Any]:
        """The JSON of ``verl-operator advise -o json``."""
        run = self.run
        out: dict[str, Any] = {
            "steps": len(run.steps),
            "warmupSteps": run.warmup,
            "stepSeconds": round(run.step_seconds, 3),
            "phases": {
                name: {"seconds": round(p.seconds, 3), "share": round(p.share, 4)}
                for name, p in run.phases.items()
            },
            "perStep": [
                {
                    "step": s.step,
                    "seconds": round(s.seconds, 3),
                    "phases": {n: round(v, 3) for n, v in s.phases.items()},
                }
                for s in run.steps
            ],
            "bottleneck": run.bottleneck,
            "generationShare": round(run.generation_share, 4),
            "generationTarget": GENERATION_TARGET,
            "advice": [a.to_json() for a in self.advice],
            "refused": [
                {"rule": r.rule, "setting": r.setting, "value": r.value, "reason": r.reason}
                for r in self.refused
            ],
            "notes": list(self.notes),
        }
        split = self.async_split
        if split is not None:
            out["asyncSplit"] = {"rolloutGpus": split.rollout_gpus, "trainerGpus": split.trainer_gpus}
        return out


@dataclass(frozen=True)
class Context:
    """What the rules read: the run, and the job's spec, plan and nodes when given."""

    run: RunPhases
    spec: VerlJobSpec | None = None
    plan: Plan | None = None
    nodes: Nodes | None = None
    gpus: int | None = None


@dataclass(frozen=True)
class Candidate:
    """A rule's proposal: the change(s) to try in order (the first the planner accepts is kept)."""

    rule: str
    changes: tuple[Change, ...]
    reason: str
    effect: Callable[[Change], str]
    at_stake: float
    async_split: Callable[[Change], AsyncSplit] | None = None
    #: A check of the re-planned plan beyond fitting (a reason to refuse it, or None).
    check: Callable[[Plan], str | None] | None = None
    #: The setting and value shown for a kept change, when they are not the change's own.
    shown: Callable[[Change], tuple[str, Any]] | None = None


def _pct(share: float) -> str:
    return f"{share * 100:.0f}%"


def _s(seconds: float) -> str:
    return f"{seconds:.1f} s"


def _gpus(ctx: Context) -> int | None:
    """The job's GPUs: the plan's world size, else perf/throughput's divisor (tokens / (time x GPUs))."""
    if ctx.plan is not None:
        return ctx.plan.world_size
    if ctx.gpus is not None:
        return ctx.gpus
    tokens = ctx.run.metric("perf/total_num_tokens")
    per_gpu = ctx.run.metric("perf/throughput")
    seconds = ctx.run.metric("perf/time_per_step")
    if tokens and per_gpu and seconds:
        return max(1, round(tokens / (seconds * per_gpu)))
    return None


# -- rules, in the order they are listed when two put the same seconds at stake -----------------------------


def rule_async(ctx: Context) -> Iterator[Candidate]:
    """A colocated, generation-bound run: verl's asynchronous trainer, split by the measured phases.

    Algorithm:
        With the rollout on its own GPUs, generation and training overlap, so a step costs about the slower
        side. The rollout side's work is generation's throughput part: the mean sample's generation time
        (``agent_loop/generate_sequences/mean``; ``gen`` itself when the run does not log it), because the
        streaming trainer no longer waits for the slowest sample; the trainer's is the rest of the step
        (``T``). Each side is taken to scale linearly with its GPUs, so the rollout gets the share
        ``G / (G + T)`` of the GPUs, rounded to whole nodes (at least one each; one node: GPUs in multiples
        of the rollout TP). Example: verl's Qwen2.5-7B on 32 H20 (``gen`` 357 s, step 790 s, 4 nodes):
        357 / 790 = 0.45 of 4 nodes -> 2 : 2 nodes, 16 : 16 GPUs, as verl's fully_async.md ran it.
    """
    run = ctx.run
    if run.asynchronous or run.generation_share <= GENERATION_TARGET or "gen" not in run.phases:
        return
    gpus = _gpus(ctx)
    if gpus is None or gpus < 2:
        return
    per_node = ctx.plan.gpus_per_node if ctx.plan is not None else min(gpus, 8)
    nnodes = max(1, gpus // per_node)
    gen = run.seconds("gen")
    mean = run.metric("timing_s/agent_loop/generate_sequences/mean")
    g_work = min(gen, mean) if mean else gen
    train = max(run.step_seconds - gen, 1e-9)
    share = g_work / (g_work + train)
    tp = ctx.plan.rollout.tensor_parallel_size if ctx.plan is not None else 1
    if nnodes >= 2:
        unit, units = per_node, nnodes
    else:
        unit, units = tp, gpus // tp
    if units < 2:
        return
    order = sorted(range(1, units), key=lambda r: (abs(r / units - share), r))
    # The trainer side is re-planned on its own GPUs (one node: the node's GPUs are split).
    changes = tuple(
        Change("spec.resources", {"gpus": t} if nnodes >= 2 else {"gpus": t, "gpusPerNode": t})
        for t in (gpus - r * unit for r in order[:3])
    )

    def split(change: Change) -> AsyncSplit:
        trainer = int(change.value["gpus"])
        return AsyncSplit(rollout_gpus=gpus - trainer, trainer_gpus=trainer)

    def effect(change: Change) -> str:
        s = split(change)
        roll = g_work * gpus / s.rollout_gpus
        trn = train * gpus / s.trainer_gpus
        return (
            f"generation on {s.rollout_gpus} GPUs about {_s(roll)} per batch, training on {s.trainer_gpus} about "
            f"{_s(trn)}, overlapped: about {_s(max(roll, trn))} per step against {_s(run.step_seconds)} "
            f"now if each side scales linearly; {ASYNC_MEASURED}"
        )

    def shown(change: Change) -> tuple[str, Any]:
        s = split(change)
        if nnodes >= 2:
            return "rollout.nnodes", s.rollout_gpus // per_node
        return "rollout.n_gpus_per_node", s.rollout_gpus

    tail = f", the mean sample {_s(mean)}" if mean else ""
    yield Candidate(
        rule="async-trainer",
        changes=changes,
        reason=(
            f"generation takes {_s(gen)} of the {_s(run.step_seconds)} step ({_pct(run.generation_share)}, over "
            f"the {_pct(GENERATION_TARGET)} target) on colocated GPUs{tail}; the rest of the step {_s(train)}: "
            f"the rollout's share of the GPUs is {g_work:.0f} / ({g_work:.0f} + {train:.0f}) = {share:.2f}"
        ),
        effect=effect,
        at_stake=gen,
        async_split=split,
        shown=shown,
    )


def rule_log_prob_micro_batch(ctx: Context) -> Iterator[Candidate]:
    """old_log_prob + ref over 10% of the step in several passes: a larger log-prob micro-batch.

    Tried from the largest (one pass per GPU) down to twice the current; the first the planner fits in memory
    is kept (the planner's log-prob peak grows with the micro-batch).
    """
    run, plan = ctx.run, ctx.plan
    if plan is None or plan.batching.dynamic_batch_size:
        return
    seconds = run.seconds("old_log_prob", "ref", "values")
    micro = plan.batching.log_prob_micro_batch_size_per_gpu
    passes = plan.batching.log_prob_passes_per_gpu
    if micro is None or not passes or passes <= 1 or seconds / run.step_seconds < MIN_SHARE:
        return
    sequences = micro * passes
    sizes: list[int] = []
    size = micro * 2
    while size < sequences:
        sizes.append(size)
        size *= 2
    sizes.append(sequences)
    changes = tuple(Change("log_prob_micro_batch_size_per_gpu", s) for s in reversed(sorted(set(sizes))))
    yield Candidate(
        rule="log-prob-micro-batch",
        changes=changes,
        reason=(
            f"old_log_prob + ref take {_s(seconds)} ({_pct(seconds / run.step_seconds)} of the step) in {passes} "
            f"forward passes of {micro} sequences per GPU; the plan's log-prob peak is "
            f"{plan.memory.log_prob_peak_gib:.1f} of {plan.memory.gpu_memory_gib:.1f} GiB"
        ),
        effect=lambda c: (
            f"{passes} -> {-(-sequences // int(c.value))} forward passes per GPU per log-prob phase"
        ),
        at_stake=seconds,
    )


def _kv_ratio(plan: Plan, length: float) -> float:
    """A replica's KV cache over what its sequences need at ``length`` tokens each (below 1: vLLM runs waves)."""
    demand = plan.rollout.sequences_per_replica * length
    return plan.rollout.kv_cache_tokens_per_replica / demand if demand else 1.0


def rule_rollout_tp(ctx: Context) -> Iterator[Candidate]:
    """Generation over the target: a smaller rollout TP for more replicas, or a larger one for more KV cache.

    Algorithm:
        A replica's KV cache is compared with what its sequences need (sequences per replica x the run's mean
        prompt + response length). Halving TP doubles the replicas (less all-reduce per token, more decoding
        in parallel); it is kept when the re-planned KV cache ratio stays at least 0.8 of the current one
        (capped at 1). Doubling TP is proposed only when the cache is short (ratio below 1, or vLLM preempted
        sequences) and the re-plan raises the ratio by at least 1.25x (doubling TP also doubles each
        replica's sequences, so only the weights' share of the GPU is won back).
    """
    run, plan = ctx.run, ctx.plan
    if plan is None or run.generation_share <= GENERATION_TARGET:
        return
    tp = plan.rollout.tensor_parallel_size
    length = (first(run.medians, "prompt_length/mean") or 0) + (
        first(run.medians, "response_length/mean") or 0
    )
    length = length or float(plan.rollout.max_model_len)
    ratio = _kv_ratio(plan, length)
    preempted = first(run.medians, "timing_s/agent_loop/num_preempted/max")
    gen = run.seconds("gen")
    now = (
        f"generation takes {_s(gen)} ({_pct(run.generation_share)} of the step) on rollout TP {tp}, "
        f"{plan.rollout.replicas} replicas; a replica's KV cache holds {plan.rollout.kv_cache_tokens_per_replica:,} "
        f"tokens for {plan.rollout.sequences_per_replica:g} sequences of about {length:,.0f} tokens "
        f"({ratio:.2f}x what they need)"
        + (f"; vLLM preempted up to {preempted:.0f} sequences" if preempted and preempted > 0 else "")
    )
    if tp > 1:
        floor = 0.8 * min(1.0, ratio)

        def lower(p: Plan) -> str | None:
            got = _kv_ratio(p, length)
            return (
                None
                if got >= floor
                else f"TP {tp // 2} leaves the KV cache at {got:.2f}x (under {floor:.2f}x)"
            )

        yield Candidate(
            rule="rollout-tp",
            changes=(Change("rollout_tp", tp // 2),),
            reason=now,
            effect=lambda c: (
                f"TP {tp} -> {tp // 2}: {plan.rollout.replicas} -> {plan.rollout.replicas * 2} replicas decoding in "
                "parallel, half the all-reduce per token"
            ),
            at_stake=gen,
            check=lower,
        )
    if ratio < 1 or (preempted is not None and preempted > 0):

        def raise_(p: Plan) -> str | None:
            got = _kv_ratio(p, length)
            return None if got >= 1.25 * ratio else f"TP {tp * 2} only takes the KV cache to {got:.2f}x"

        yield Candidate(
            rule="rollout-tp",
            changes=(Change("rollout_tp", tp * 2),),
            reason=now,
            effect=lambda c: f"TP {tp} -> {tp * 2}: more KV cache per sequence, fewer waves and preemptions",
            at_stake=gen * 0.9,
            check=raise_,
        )


def rule_dynamic_batch(ctx: Context) -> Iterator[Candidate]:
    """Micro-batches of fixed sequence counts padded to the longest: pack by tokens (use_dynamic_bsz)."""
    run, plan = ctx.run, ctx.plan
    if plan is None or plan.batching.dynamic_batch_size:
        return
    prompt, response = run.metric("prompt_length/mean"), run.metric("response_length/mean")
    if prompt is None or response is None:
        return
    capacity = plan.memory.tokens_per_sequence
    waste = 1 - (prompt + response) / capacity if capacity else 0.0
    seconds = run.seconds("old_log_prob", "ref", "values", "update_actor", "update_critic")
    if waste < PADDING_WASTE or seconds / run.step_seconds < MIN_SHARE:
        return
    yield Candidate(
        rule="dynamic-batch-size",
        changes=(Change("dynamic_batch_size", True),),
        reason=(
            f"sequences average {prompt + response:,.0f} tokens ({prompt:,.0f} prompt + {response:,.0f} response) of "
            f"the {capacity:,} a micro-batch slot is sized for: {_pct(waste)} of each slot is padding, in phases "
            f"that take {_s(seconds)} ({_pct(seconds / run.step_seconds)} of the step)"
        ),
        effect=lambda c: "micro-batches packed to the token budget: fewer forward/backward passes per step",
        at_stake=seconds * waste,
    )


def rule_gpu_memory_utilization(ctx: Context) -> Iterator[Candidate]:
    """Generation over the target with vLLM's memory fraction below 0.9: the highest fraction that fits."""
    run, plan = ctx.run, ctx.plan
    if plan is None or run.generation_share <= GENERATION_TARGET or plan.rollout.name == "trtllm":
        return
    current = plan.rollout.gpu_memory_utilization
    values = [v for v in GPU_MEMORY_UTILIZATION_STEPS if v > current + 1e-9]
    if not values:
        return
    gen = run.seconds("gen")
    yield Candidate(
        rule="gpu-memory-utilization",
        changes=tuple(Change("gpu_memory_utilization", v) for v in values),
        reason=(
            f"generation takes {_s(gen)} ({_pct(run.generation_share)} of the step) with gpu_memory_utilization "
            f"{current:g}: a replica's KV cache holds {plan.rollout.kv_cache_tokens_per_replica:,} tokens"
        ),
        effect=lambda c: (
            f"a larger KV cache ({current:g} -> {c.value:g} of the GPU), more sequences decoded at once"
        ),
        at_stake=gen * 0.5,
    )


def rule_response_length(ctx: Context) -> Iterator[Candidate]:
    """Responses clipped at maxResponseLength: a longer limit that still fits (re-planned)."""
    run = ctx.run
    clip = first(run.medians, "response_length/clip_ratio", "response_length_non_aborted/clip_ratio")
    if clip is None or clip < CLIP_RATIO:
        return
    spec = ctx.spec
    limit = spec.data.max_response_length if spec is not None else None
    longest = run.metric("response_length/max")
    limit = limit or (int(longest) if longest else None)
    if limit is None:
        return
    gen = run.seconds("gen")
    yield Candidate(
        rule="response-length",
        changes=(Change("max_response_length", limit * 2),),
        reason=(
            f"{_pct(clip)} of responses stop at the {limit:,}-token limit (response_length/clip_ratio {clip:.3f}): "
            "they are truncated answers, scored as such, and set generation's tail"
        ),
        effect=lambda c: (
            f"limit {limit:,} -> {c.value:,}: fewer truncated answers; generation of the clipped "
            f"{_pct(clip)} grows up to 2x"
        ),
        at_stake=gen * clip,
    )


def rule_weight_sync(ctx: Context) -> Iterator[Candidate]:
    """Weight sync over 5% of the step: a larger sync bucket (fewer, larger transfers)."""
    run = ctx.run
    name = "update_weights" if "update_weights" in run.phases else "reshard"
    seconds = run.seconds(name) or (run.metric("timing_s/reshard") or 0.0)
    if seconds / run.step_seconds < 0.05:
        return
    line = ctx.plan.verl_version if ctx.plan is not None else ("0.9" if name == "update_weights" else "0.6")
    key, default = BUCKET_KEYS["0.9" if line.startswith("0.9") else "0.6"]
    current = default
    if ctx.spec is not None:
        for raw in ctx.spec.overrides:
            k, _, v = raw.lstrip("+").partition("=")
            if k == key and v.strip().isdigit():
                current = int(v)
    yield Candidate(
        rule="weight-sync",
        changes=(Change(key, current * 2),),
        reason=(
            f"the trainer-to-rollout weight sync (timing_s/{name}) takes {_s(seconds)} "
            f"({_pct(seconds / run.step_seconds)} of the step) with {current} MB buckets"
        ),
        effect=lambda c: f"buckets {current} -> {c.value} MB: half the transfers, each one larger",
        at_stake=seconds,
    )


RULES: tuple[Callable[[Context], Iterator[Candidate]], ...] = (
    rule_async,
    rule_log_prob_micro_batch,
    rule_rollout_tp,
    rule_dynamic_batch,
    rule_gpu_memory_utilization,
    rule_response_length,
    rule_weight_sync,
)


def _refusal(result: PlanResult) -> str | None:
    """Why the planner's result for a change is not kept: a violation, or a phase's memory estimate over the
    GPU (the planner warns, and accepts, a pinned value it estimates over); None when it is kept."""
    if not result.feasible or result.plan is None:
        return result.violations[0].one_line() if result.violations else "the planner found no plan"
    memory = result.plan.memory
    for phase, peak in (
        ("rollout", memory.rollout_peak_gib),
        ("train", memory.train_peak_gib),
        ("log-prob", memory.log_prob_peak_gib),
    ):
        if peak > memory.gpu_memory_gib:
            return f"the {phase} peak is estimated at {peak:.1f} GiB of {memory.gpu_memory_gib:.1f} GiB"
    return None


def advise(
    run: RunPhases,
    spec: VerlJobSpec | None = None,
    plan: Plan | None = None,
    nodes: Nodes | None = None,
    gpus: int | None = None,
) -> Report:
    """The advice for a run, each item re-planned when the spec and nodes are given.

    Ordered by the median seconds each change acts on, largest first (ties: the order of :data:`RULES`).
    A rule whose every change the planner refuses gives no advice and one ``refused`` entry.
    """
    ctx = Context(run=run, spec=spec, plan=plan, nodes=nodes, gpus=gpus)
    advice: list[tuple[float, int, Advice]] = []
    refused: list[Refused] = []
    notes: list[str] = []
    can_plan = spec is not None and nodes is not None
    if not can_plan:
        notes.append("advice not re-planned: give the job (-f) and its nodes (--nodes) to check it")
    for index, rule in enumerate(RULES):
        for cand in rule(ctx):
            if any(a.rule == cand.rule for _, _, a in advice):
                continue
            kept: Change | None = None
            reason = ""
            if can_plan and spec is not None and nodes is not None:
                for change in cand.changes:
                    try:
                        result = replan(spec, nodes, change)
                    except ValueError as exc:  # pydantic's ValidationError: out of the field's bounds
                        reason = str(exc).splitlines()[0]
                        continue
                    refusal = _refusal(result)
                    if refusal is None and cand.check is not None and result.plan is not None:
                        refusal = cand.check(result.plan)
                    if refusal is None:
                        kept = change
                        break
                    reason = refusal
            else:
                kept = cand.changes[0]
            if kept is None:
                last = cand.changes[-1]
                refused.append(Refused(cand.rule, last.shown, last.value, reason))
                continue
            split = cand.async_split(kept) if cand.async_split is not None else None
            setting, value = cand.shown(kept) if cand.shown is not None else (kept.shown, kept.value)
            item = Advice(
                rule=cand.rule,
                setting=setting,
                value=value,
                reason=cand.reason,
                effect=cand.effect(kept),
                at_stake=cand.at_stake,
                checked=can_plan,
                async_split=split,
            )
            advice.append((-cand.at_stake, index, item))
    advice.sort(key=lambda t: (t[0], t[1]))
    return Report(run=run, advice=tuple(a for _, _, a in advice), refused=tuple(refused), notes=tuple(notes))
