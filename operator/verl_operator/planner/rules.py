"""The rules a verl FSDP + vLLM launch must satisfy (``docs/planner.md`` lists them with verl's code references).

Each rule is a function ``(problem, settings) -> list[Violation]``; an empty list means it holds. Messages show
every factor of the arithmetic and, where they exist, the nearest valid values.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable

from verl_operator.planner.inputs import SPEC_PATHS, Problem, Settings
from verl_operator.planner.result import Violation

Rule = Callable[[Problem, Settings], list[Violation]]


def nearest(value: int, ok: Callable[[int], bool], limit: int = 4096) -> list[int]:
    """The nearest integers below and above ``value`` (>= 1) that satisfy ``ok``, below first.

    A linear scan, so only for small domains (parallel sizes); batch sizes use :func:`nearest_multiple` and
    :func:`nearest_divisor`, whose cost does not grow with the value.

    Args:
        value: The rejected value.
        ok: The predicate a valid value satisfies.
        limit: How far to look each way.
    """
    found: list[int] = []
    for v in range(value - 1, max(0, value - limit), -1):
        if ok(v):
            found.append(v)
            break
    for v in range(value + 1, value + limit):
        if ok(v):
            found.append(v)
            break
    return found


def nearest_multiple(value: int, unit: int, high: int | None = None) -> list[int]:
    """The multiples of ``unit`` nearest below and above ``value`` (>= ``unit``, <= ``high``), below first."""
    unit = max(1, unit)
    found = []
    below = (value - 1) // unit * unit
    if below >= unit:
        found.append(below)
    above = (value // unit + 1) * unit
    if high is None or above <= high:
        found.append(above)
    return found


def nearest_divisor(value: int, n: int) -> list[int]:
    """The divisors of ``n`` nearest below and above ``value``, below first."""
    divs = divisors(n)
    i = bisect.bisect_left(divs, value)
    found = [divs[i - 1]] if i > 0 else []
    j = bisect.bisect_right(divs, value)
    if j < len(divs):
        found.append(divs[j])
    return found


#: Small primes divided out by trial division before Pollard's rho takes over.
_SMALL_PRIMES = tuple(p for p in range(2, 1000) if all(p % q for q in range(2, math.isqrt(p) + 1)))
#: Witnesses that make Miller-Rabin exact below 3.3e24 (Sorenson and Webster), far above any bounded input.
_WITNESSES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    for p in _SMALL_PRIMES:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in _WITNESSES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _rho(n: int) -> int:
    """A non-trivial factor of the odd composite ``n`` (Pollard's rho with Floyd's cycle finding; deterministic seeds)."""
    for c in range(1, n):
        x = y = 2
        d = 1
        while d == 1:
            x = (x * x + c) % n
            y = (y * y + c) % n
            y = (y * y + c) % n
            d = math.gcd(abs(x - y), n)
        if d != n:
            return d
    raise ArithmeticError(f"no factor found for {n}")  # pragma: no cover - unreachable for composites


def prime_factors(n: int) -> dict[int, int]:
    """The prime factorisation of ``n >= 1`` as ``{prime: exponent}``.

    Algorithm:
        Trial division by the primes below 1000, then Pollard's rho on what remains; the cost grows with the
        fourth root of the largest prime factor, not with ``n``, so a large prime costs milliseconds, not the
        ``sqrt(n)`` steps of trial division. Example: ``prime_factors(360) == {2: 3, 3: 2, 5: 1}``.
    """
    out: dict[int, int] = {}
    for p in _SMALL_PRIMES:
        if p * p > n:
            break
        while n % p == 0:
            out[p] = out.get(p, 0) + 1
            n //= p
    stack = [n] if n > 1 else []
    while stack:
        m = stack.pop()
        if _is_prime(m):
            out[m] = out.get(m, 0) + 1
        else:
            d = _rho(m)
            stack += [d, m // d]
    return dict(sorted(out.items()))


def divisors(n: int) -> list[int]:
    """All positive divisors of ``n``, ascending (none for ``n < 1``); built from :func:`prime_factors`."""
    if n < 1:
        return []
    divs = [1]
    for p, e in prime_factors(n).items():
        divs = [d * p**k for d in divs for k in range(e + 1)]
    return sorted(divs)


def _or(values: Iterable[int]) -> str:
    return " or ".join(str(v) for v in values)


def _field(p: Problem, name: str) -> str:
    return p.source(name, SPEC_PATHS.get(name, name))


def padded_trajectories(s: Settings, critic: bool) -> int:
    """Trajectories per step after verl >= 0.7 pads to a multiple of ``lcm(DP, mini x n[, critic mini x n])``."""
    unit = math.lcm(s.data_parallel_size, s.ppo_mini_batch_size * s.rollout_n)
    if critic:
        unit = math.lcm(unit, s.ppo_mini_batch_size * s.rollout_n)
    return -(-s.trajectories // unit) * unit


def batch_divisible_by_world(p: Problem, s: Settings) -> list[Violation]:
    """Rule 1: without dynamic batch size, ``train_batch_size x n`` must divide evenly over the GPUs.

    With dynamic batch size, verl 0.6 still chunks the batch evenly over the training and rollout data-parallel
    ranks (``DataProto.chunk`` without padding); verl >= 0.7 pads instead.
    """
    if s.dynamic_batch_size:
        # verl 0.6 splits the batch evenly over the actor's DP ranks and the rollout's (world / TP) ranks.
        unit = math.lcm(s.data_parallel_size, max(1, s.world // s.rollout_tp))
        if p.version == "0.6" and s.trajectories % unit:
            return [
                Violation(
                    field=_field(p, "train_batch_size"),
                    rule="batch-divisible-by-dp",
                    message=(
                        f"{s.train_batch_size} x {s.rollout_n} = {s.trajectories} trajectories per step is not "
                        f"divisible by {unit} (verl 0.6 splits the batch evenly over {s.data_parallel_size} "
                        f"training and {s.world // s.rollout_tp} rollout data-parallel ranks)"
                    ),
                    suggestions=[
                        f"use trainBatchSize {_or(nearest_multiple(s.train_batch_size, unit // math.gcd(unit, s.rollout_n)))}"
                    ],
                )
            ]
        return []
    if s.trajectories % s.world == 0:
        return []
    # t x n divides by the world exactly when t is a multiple of world / gcd(world, n).
    near = nearest_multiple(s.train_batch_size, s.world // math.gcd(s.world, s.rollout_n))
    return [
        Violation(
            field=_field(p, "train_batch_size"),
            rule="batch-divisible-by-world",
            message=(
                f"{s.train_batch_size} x {s.rollout_n} = {s.trajectories} trajectories per step is not divisible "
                f"by {s.world} GPUs"
            ),
            suggestions=[f"use trainBatchSize {_or(near)}"] if near else [],
        )
    ]


def mini_batch_le_train_batch(p: Problem, s: Settings) -> list[Violation]:
    """Rule 3: ``train_batch_size >= ppo_mini_batch_size`` without dynamic batch size (verl skips the check with
    it: one padded mini-batch per step, reported as a warning)."""
    if s.dynamic_batch_size or s.train_batch_size >= s.ppo_mini_batch_size:
        return []
    return [
        Violation(
            field=_field(p, "ppo_mini_batch_size"),
            rule="mini-batch-le-train-batch",
            message=f"ppoMiniBatchSize {s.ppo_mini_batch_size} is larger than trainBatchSize {s.train_batch_size}",
            suggestions=[f"use ppoMiniBatchSize {s.train_batch_size} or less"],
        )
    ]


def sp_divides_world(p: Problem, s: Settings) -> list[Violation]:
    """Rule 11 (verl never checks): the world size must be a multiple of the Ulysses SP size."""
    if s.world % s.sequence_parallel_size == 0:
        return []
    return [
        Violation(
            field=_field(p, "sequence_parallel_size"),
            rule="sp-divides-world",
            message=(
                f"{s.world} GPUs are not divisible by sequenceParallelSize {s.sequence_parallel_size}: ranks fall "
                f"outside the ({s.world // s.sequence_parallel_size}, {s.sequence_parallel_size}) mesh"
            ),
            suggestions=[
                f"use sequenceParallelSize {_or(nearest_divisor(s.sequence_parallel_size, s.world))}"
            ],
        )
    ]


def sp_heads(p: Problem, s: Settings) -> list[Violation]:
    """Rule 10: attention heads divisible by SP; KV heads divisible by SP or SP divisible by KV heads."""
    sp = s.sequence_parallel_size
    heads, kv = p.shape.attention_heads, p.shape.kv_heads
    if sp == 1 or (heads % sp == 0 and (kv % sp == 0 or sp % kv == 0)):
        return []

    def ok(v: int) -> bool:
        return heads % v == 0 and (kv % v == 0 or v % kv == 0) and s.world % v == 0

    return [
        Violation(
            field=_field(p, "sequence_parallel_size"),
            rule="sp-heads",
            message=(
                f"sequenceParallelSize {sp} does not fit the model's {heads} attention heads and {kv} KV heads "
                f"(needs heads % SP == 0 and KV heads % SP == 0 or SP % KV heads == 0)"
            ),
            suggestions=[f"use sequenceParallelSize {_or(nearest(sp, ok, 1024))}"],
        )
    ]


def fsdp_size_valid(p: Problem, s: Settings) -> list[Violation]:
    """Rule 12 (verl never checks): ``fsdp_size`` is -1, at least the world size, or divides it."""
    f = s.fsdp_size
    if f == -1 or f >= s.world or (f > 0 and s.world % f == 0):
        return []
    return [
        Violation(
            field=_field(p, "fsdp_size"),
            rule="fsdp-size",
            message=f"fsdpSize {f} is neither -1 nor a divisor of the {s.world} GPUs",
            suggestions=[f"use fsdpSize -1 or {_or(nearest_divisor(max(f, 1), s.world))}"],
        )
    ]


def rollout_tp_divides_world(p: Problem, s: Settings) -> list[Violation]:
    """Rule 16: the world size is a multiple of the rollout TP size."""
    if s.world % s.rollout_tp == 0:
        return []
    return [
        Violation(
            field=_field(p, "rollout_tp"),
            rule="rollout-tp-divides-world",
            message=f"{s.world} GPUs are not divisible by rollout tensorParallelSize {s.rollout_tp}",
            suggestions=[f"use tensorParallelSize {_or(nearest_divisor(s.rollout_tp, s.world))}"],
        )
    ]


def rollout_tp_heads(p: Problem, s: Settings) -> list[Violation]:
    """vLLM: attention heads divisible by the rollout TP size."""
    heads = p.shape.attention_heads
    if heads % s.rollout_tp == 0:
        return []
    return [
        Violation(
            field=_field(p, "rollout_tp"),
            rule="rollout-tp-heads",
            message=f"the model's {heads} attention heads are not divisible by tensorParallelSize {s.rollout_tp}",
            suggestions=[
                f"use tensorParallelSize {_or(nearest_divisor(s.rollout_tp, math.gcd(heads, s.world)))}"
            ],
        )
    ]


def rollout_replica_node(p: Problem, s: Settings) -> list[Violation]:
    """Rules 17-18: a replica larger than a node spans whole nodes; a smaller one must not straddle two."""
    tp, gpn = s.rollout_tp, s.gpus_per_node
    if (tp > gpn and tp % gpn == 0) or (tp <= gpn and gpn % tp == 0):
        return []
    kind = "a multiple of" if tp > gpn else "a divisor of"
    return [
        Violation(
            field=_field(p, "rollout_tp"),
            rule="rollout-replica-node",
            message=(
                f"rollout tensorParallelSize {tp} is not {kind} the {gpn} GPUs per node: a vLLM replica would "
                f"straddle nodes"
            ),
            suggestions=[
                f"use tensorParallelSize {_or(nearest(tp, lambda v: (v > gpn and v % gpn == 0) or (v <= gpn and gpn % v == 0)))}"
            ],
        )
    ]


def nvlink_groups(p: Problem, s: Settings) -> list[Violation]:
    """With ``placement.nvlink: required``, rollout TP and SP groups sit inside one NVLink domain; on nodes
    whose domains are partial (bridged pairs), a pod must take the whole node (as placement requires)."""
    if not p.nvlink_required:
        return []
    out: list[Violation] = _partial_domains(p, s)
    dom = p.nvlink_domain
    for name, size, label in (
        ("rollout_tp", s.rollout_tp, "rollout tensorParallelSize"),
        ("sequence_parallel_size", s.sequence_parallel_size, "sequenceParallelSize"),
    ):
        if size <= dom and dom % size == 0:
            continue
        out.append(
            Violation(
                field=_field(p, name),
                rule="nvlink-domain",
                message=(
                    f"{label} {size} does not fit the NVLink domain of {dom} GPUs (placement.nvlink: required "
                    f"needs groups inside one domain)"
                ),
                suggestions=[
                    f"use {label} {max(d for d in divisors(dom) if d <= size)}",
                    "or set spec.placement.nvlink: preferred",
                ],
            )
        )
    return out


def _partial_domains(p: Problem, s: Settings) -> list[Violation]:
    group = max(s.rollout_tp, s.sequence_parallel_size)
    if group <= 1 or not p.partial_domain_nodes or p.whole_node_fits >= s.nnodes:
        return []
    return [
        Violation(
            field="spec.resources.gpus",
            rule="nvlink-domain",
            message=(
                f"NVLink groups of {group} GPUs on nodes with NVLink domains of {p.nvlink_domain} GPUs only: a pod "
                f"must take a whole node to be sure of whole domains, and {p.whole_node_fits} of the nodes have "
                f"exactly {s.gpus_per_node} GPUs for the {s.nnodes} pods"
            ),
            suggestions=[
                "use whole nodes (spec.resources.gpus a multiple of the GPUs per node)",
                "or set spec.placement.nvlink: preferred",
            ],
        )
    ]


def max_model_len(p: Problem, s: Settings) -> list[Violation]:
    """Rule 20: the rollout's max model length fits the model's ``max_position_embeddings``."""
    length = p.max_model_len if p.max_model_len is not None else p.seq_len
    limit = p.max_positions
    if length <= limit:
        return []
    name = "max_model_len" if p.max_model_len is not None else "max_response_length"
    return [
        Violation(
            field=_field(p, name),
            rule="max-model-len",
            message=(
                f"prompt {p.max_prompt_length} + response {p.max_response_length} = {p.seq_len} tokens"
                if p.max_model_len is None
                else f"max_model_len {p.max_model_len}"
            )
            + f" exceeds the model's max_position_embeddings {limit}",
            suggestions=[f"keep maxPromptLength + maxResponseLength <= {limit}"],
        )
    ]


def mini_batch_per_gpu(p: Problem, s: Settings) -> list[Violation]:
    """Rule 21: ``ppo_mini_batch_size x n`` divides over the data-parallel ranks, at least one per rank."""
    dp = s.data_parallel_size
    total = s.ppo_mini_batch_size * s.rollout_n
    if total % dp == 0 and total >= dp:
        return []
    near = nearest_multiple(s.ppo_mini_batch_size, dp // math.gcd(dp, s.rollout_n), s.train_batch_size)
    return [
        Violation(
            field=_field(p, "ppo_mini_batch_size"),
            rule="mini-batch-per-gpu",
            message=(
                f"ppoMiniBatchSize {s.ppo_mini_batch_size} x {s.rollout_n} = {total} sequences do not divide over "
                f"{dp} data-parallel ranks ({s.world} GPUs / SP {s.sequence_parallel_size})"
            ),
            suggestions=[f"use ppoMiniBatchSize {_or(near)}"] if near else [],
        )
    ]


def micro_divides_mini(p: Problem, s: Settings) -> list[Violation]:
    """Rule 22: without dynamic batch size, the per-GPU mini-batch is a multiple of the micro-batch."""
    if s.dynamic_batch_size:
        return []
    micro = s.ppo_micro_batch_size_per_gpu
    if micro is None:
        return [
            Violation(
                field="spec.batching.ppoMicroBatchSizePerGpu",
                rule="micro-batch-required",
                message="ppoMicroBatchSizePerGpu must be set when dynamicBatchSize is off",
                suggestions=["set ppoMicroBatchSizePerGpu, or dynamicBatchSize: true"],
            )
        ]
    per_gpu = s.ppo_mini_batch_size * s.rollout_n // s.data_parallel_size
    if per_gpu > 0 and per_gpu % micro == 0:
        return []
    return [
        Violation(
            field=_field(p, "ppo_micro_batch_size_per_gpu"),
            rule="micro-divides-mini",
            message=(
                f"per-GPU mini-batch {s.ppo_mini_batch_size} x {s.rollout_n} / {s.data_parallel_size} = {per_gpu} "
                f"is not a multiple of ppoMicroBatchSizePerGpu {micro}"
            ),
            suggestions=[f"use ppoMicroBatchSizePerGpu {_or(nearest_divisor(micro, per_gpu))}"]
            if per_gpu > 0
            else [],
        )
    ]


def log_prob_micro_divides(p: Problem, s: Settings) -> list[Violation]:
    """Rule 22 (verl >= 0.7): the per-GPU log-prob batch is a multiple of the log-prob micro-batch."""
    if s.dynamic_batch_size or p.version == "0.6":
        return []
    micro = s.log_prob_micro_batch_size_per_gpu
    if micro is None:
        return [
            Violation(
                field="spec.batching.logProbMicroBatchSizePerGpu",
                rule="micro-batch-required",
                message="logProbMicroBatchSizePerGpu must be set when dynamicBatchSize is off",
                suggestions=["set logProbMicroBatchSizePerGpu, or dynamicBatchSize: true"],
            )
        ]
    per_gpu = padded_trajectories(s, p.needs_critic) // s.data_parallel_size
    if per_gpu % micro == 0:
        return []
    return [
        Violation(
            field=_field(p, "log_prob_micro_batch_size_per_gpu"),
            rule="log-prob-micro-divides",
            message=(
                f"per-GPU log-prob batch {per_gpu} (trajectories / {s.data_parallel_size} data-parallel ranks) is "
                f"not a multiple of logProbMicroBatchSizePerGpu {micro}"
            ),
            suggestions=[f"use logProbMicroBatchSizePerGpu {_or(nearest_divisor(micro, per_gpu))}"],
        )
    ]


def critic_data_parallel_size(p: Problem, s: Settings) -> int:
    """The critic's data-parallel size: world / the critic's own Ulysses SP (verl's default 1)."""
    return max(1, s.world // p.critic_sequence_parallel_size)


def critic_mesh(p: Problem, s: Settings) -> list[Violation]:
    """Rules 10, 11 and 21 for the critic (ppo), whose Ulysses SP is its own setting."""
    if not p.needs_critic:
        return []
    csp = p.critic_sequence_parallel_size
    heads, kv = p.shape.attention_heads, p.shape.kv_heads
    field = p.source(
        "critic_sequence_parallel_size", "spec.overrides (critic.ulysses_sequence_parallel_size)"
    )
    if s.world % csp or heads % csp or not (kv % csp == 0 or csp % kv == 0):
        return [
            Violation(
                field=field,
                rule="critic-sp",
                message=(
                    f"critic ulysses_sequence_parallel_size {csp} must divide the {s.world} GPUs and the model's "
                    f"{heads} attention heads, and KV heads {kv} % SP or SP % KV heads must be 0"
                ),
                suggestions=["use the actor's sequenceParallelSize for the critic, or 1"],
            )
        ]
    dp = critic_data_parallel_size(p, s)
    total = s.ppo_mini_batch_size * s.rollout_n
    if total % dp == 0 and total >= dp:
        return []
    return [
        Violation(
            field=_field(p, "ppo_mini_batch_size"),
            rule="mini-batch-per-gpu",
            message=(
                f"the critic's mini-batch {s.ppo_mini_batch_size} x {s.rollout_n} = {total} does not divide over its "
                f"{dp} data-parallel ranks ({s.world} GPUs / critic SP {csp})"
            ),
            suggestions=[
                f"use ppoMiniBatchSize {_or(nearest_multiple(s.ppo_mini_batch_size, dp // math.gcd(dp, s.rollout_n)))}"
            ],
        )
    ]


def critic_micro_divides_mini(p: Problem, s: Settings) -> list[Violation]:
    """Rule 22 for the critic (ppo): its per-GPU mini-batch uses its own data-parallel size."""
    micro = s.critic_ppo_micro_batch_size_per_gpu
    if not p.needs_critic or s.dynamic_batch_size or micro is None:
        return []
    per_gpu = s.ppo_mini_batch_size * s.rollout_n // critic_data_parallel_size(p, s)
    if per_gpu > 0 and per_gpu % micro == 0:
        return []
    return [
        Violation(
            field=_field(p, "critic_ppo_micro_batch_size_per_gpu"),
            rule="micro-divides-mini",
            message=f"critic per-GPU mini-batch {per_gpu} is not a multiple of critic micro-batch {micro}",
            suggestions=[f"use critic.ppo_micro_batch_size_per_gpu {_or(nearest_divisor(micro, per_gpu))}"],
        )
    ]


def dynamic_token_budget(p: Problem, s: Settings) -> list[Violation]:
    """Rule 24: with dynamic batch size, ``max_token_len_per_gpu x SP >= prompt + response``."""
    if not s.dynamic_batch_size:
        return []
    out: list[Violation] = []
    need = p.seq_len
    sp = s.sequence_parallel_size
    # An unset log-prob budget follows the actor's (verl's oc.select default).
    budgets = [
        ("max_token_len_per_gpu", s.max_token_len_per_gpu),
        ("log_prob_max_token_len_per_gpu", s.log_prob_max_token_len_per_gpu or s.max_token_len_per_gpu),
    ]
    if p.needs_critic:
        # verl's default critic.ppo_max_token_len_per_gpu is 32768.
        budgets.append(("critic_max_token_len_per_gpu", p.critic_max_token_len_per_gpu or 32768))
    for name, budget in budgets:
        if name.startswith("critic"):
            sp = p.critic_sequence_parallel_size
        if budget is None:
            out.append(
                Violation(
                    field=_field(p, name),
                    rule="dynamic-token-budget",
                    message="dynamicBatchSize needs a token budget per GPU",
                    suggestions=[f"set maxTokenLenPerGpu >= {-(-2 * need // sp)}"],
                )
            )
        elif budget * sp < need:
            out.append(
                Violation(
                    field=_field(p, name),
                    rule="dynamic-token-budget",
                    message=(
                        f"token budget {budget} x SP {sp} = {budget * sp} is below one sequence of "
                        f"{p.max_prompt_length} + {p.max_response_length} = {need} tokens"
                    ),
                    suggestions=[
                        f"use {name} >= {-(-need // sp)} (verl's docs advise >= {-(-2 * need // sp)})"
                    ],
                )
            )
    return out


def sp_remove_padding(p: Problem, s: Settings) -> list[Violation]:
    """Rule 9: Ulysses SP > 1 needs ``model.use_remove_padding=True``."""
    if s.sequence_parallel_size == 1 or p.use_remove_padding is not False:
        return []
    return [
        Violation(
            field=_field(p, "use_remove_padding"),
            rule="sp-remove-padding",
            message=f"sequenceParallelSize {s.sequence_parallel_size} needs use_remove_padding=True",
            suggestions=["drop the use_remove_padding=False override", "or use sequenceParallelSize 1"],
        )
    ]


def batched_tokens_cover_model_len(p: Problem, s: Settings) -> list[Violation]:
    """verl 0.6 SPMD rollout: with chunked prefill, ``max_num_batched_tokens >= max_model_len``."""
    if not p.spmd_rollout or not p.chunked_prefill or p.max_num_batched_tokens >= p.model_len:
        return []
    return [
        Violation(
            field=_field(p, "max_num_batched_tokens"),
            rule="batched-tokens-model-len",
            message=(
                f"rollout max_num_batched_tokens {p.max_num_batched_tokens} is below max_model_len {p.model_len} "
                f"(prompt {p.max_prompt_length} + response {p.max_response_length}); verl 0.6 rejects that "
                "with chunked prefill on"
            ),
            suggestions=[f"use max_num_batched_tokens {p.model_len} or more, or drop the override"],
        )
    ]


def rollout_expert_parallel(p: Problem, s: Settings) -> list[Violation]:
    """Rule 15: rollout expert parallelism > 1 must equal rollout TP x rollout DP (DP is 1 here)."""
    ep = p.rollout_ep
    if ep is None or ep <= 1 or ep == s.rollout_tp:
        return []
    return [
        Violation(
            field="spec.overrides (actor_rollout_ref.rollout.expert_parallel_size)",
            rule="rollout-expert-parallel",
            message=f"rollout expert_parallel_size {ep} must equal tensorParallelSize {s.rollout_tp} x rollout DP 1",
            suggestions=[f"use tensorParallelSize {ep}", "or drop expert_parallel_size"],
        )
    ]


#: Every arithmetic rule, in the order they are checked (memory is checked by the search with the estimate).
RULES: tuple[Rule, ...] = (
    batch_divisible_by_world,
    mini_batch_le_train_batch,
    sp_divides_world,
    sp_heads,
    fsdp_size_valid,
    rollout_tp_divides_world,
    rollout_tp_heads,
    rollout_replica_node,
    rollout_expert_parallel,
    nvlink_groups,
    max_model_len,
    batched_tokens_cover_model_len,
    mini_batch_per_gpu,
    critic_mesh,
    micro_divides_mini,
    log_prob_micro_divides,
    critic_micro_divides_mini,
    dynamic_token_budget,
    sp_remove_padding,
)


def check(p: Problem, s: Settings, rules: Iterable[Rule] = RULES) -> list[Violation]:
    """All violations of ``rules`` for one candidate."""
    out: list[Violation] = []
    for rule in rules:
        out.extend(rule(p, s))
    return out
