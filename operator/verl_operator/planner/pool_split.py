"""A two-pool job's split: both pools' sizes from the pinned keys, and the spec the trainer pool is planned from.

The pool keys and the mode come from ``pools.read_mode``; ``job_pools`` plans each split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from verl_operator.api.plan import Violation
from verl_operator.api.spec import VerlJobSpec
from verl_operator.planner.overrides import OverrideError as _OverrideError
from verl_operator.planner.overrides import parse_override
from verl_operator.planner.pools import ARR, CONFIG_ARG, ROLLOUT_POOL_KEYS, TRAINER_POOL_KEYS, ModeInputs


@dataclass(frozen=True)
class Split:
    """Both pools' sizes: ``trainer_nnodes x trainer_gpn + rollout_nnodes x rollout_gpn`` GPUs."""

    trainer_nnodes: int
    trainer_gpn: int
    rollout_nnodes: int
    rollout_gpn: int

    @property
    def trainer_gpus(self) -> int:
        """GPUs of the trainer pool."""
        return self.trainer_nnodes * self.trainer_gpn

    @property
    def rollout_gpus(self) -> int:
        """GPUs of the rollout pool."""
        return self.rollout_nnodes * self.rollout_gpn

    def shared(self, node_gpus: int) -> bool:
        """Both pools fit the same nodes: as many nodes each, their GPUs per node together on one node (verl's
        one_step_off README, "resource-constrained scenario": ``trainer.nnodes = rollout.nnodes``)."""
        return self.trainer_nnodes == self.rollout_nnodes and self.trainer_gpn + self.rollout_gpn <= node_gpus

    def nodes(self, node_gpus: int) -> int:
        """The job's nodes: max(trainer, rollout) when both fit a node, else their sum."""
        if self.shared(node_gpus):
            return max(self.trainer_nnodes, self.rollout_nnodes)
        return self.trainer_nnodes + self.rollout_nnodes


def pinned_split(
    spec: VerlJobSpec, inputs: ModeInputs, node_gpus: int
) -> tuple[Split | None, list[Violation]]:
    """The split the spec pins (any pool key set), or None when it leaves the split open.

    Unset keys are filled so the pools add up to ``spec.resources.gpus``: the GPUs per node from the other
    pool, ``spec.resources.gpusPerNode`` or, with both node counts set, ``gpus / (trainer.nnodes +
    rollout nnodes)``; a missing node count from the GPUs left. Example: 16 GPUs, ``trainer.nnodes=1``,
    ``actor_rollout_ref.rollout.nnodes=1`` -> 1 x 8 + 1 x 8.

    Args:
        spec: The job spec.
        inputs: The mode and its keys.
        node_gpus: GPUs of the largest eligible node (the GPUs per node when nothing else says).
    """
    if spec.resources.rollout_gpus is not None:
        return spec_split(spec, inputs, node_gpus)
    r_nn_key, r_gpn_key = ROLLOUT_POOL_KEYS[inputs.mode]
    t_nn, t_gpn = inputs.get("trainer.nnodes"), inputs.get("trainer.n_gpus_per_node")
    r_nn, r_gpn = inputs.get(r_nn_key), inputs.get(r_gpn_key)
    if t_nn is None and t_gpn is None and r_nn is None and r_gpn is None:
        return None, []
    gpus = spec.resources.gpus
    for key in (*TRAINER_POOL_KEYS, r_gpn_key):
        value = inputs.get(key)
        if value is not None and value < 1:
            return None, [
                Violation(
                    field=inputs.source(key),
                    rule="pool-size",
                    message=f"{key} {value}: a pool needs at least 1 (verl asserts > 0)",
                    suggestions=[f"set {key} to 1 or more"],
                )
            ]
    if r_nn is not None and r_nn < 1:
        return None, [
            Violation(
                field=inputs.source(r_nn_key),
                rule="pool-size",
                message=(
                    f"{r_nn_key} {r_nn}: {inputs.mode} needs a standalone rollout pool (verl asserts nnodes > 0)"
                ),
                suggestions=[f"set {r_nn_key} to 1 or more", "or run trainer.v1.trainer_mode=colocate_async"],
            )
        ]
    g = t_gpn or r_gpn or spec.resources.gpus_per_node
    if g is None and t_nn is not None and r_nn is not None:
        if gpus % (t_nn + r_nn):
            return None, [
                Violation(
                    field="spec.resources.gpus",
                    rule="pools-agree",
                    message=(
                        f"spec.resources.gpus {gpus} does not split over trainer.nnodes {t_nn} + {r_nn_key} "
                        f"{r_nn} = {t_nn + r_nn} nodes of equal GPUs"
                    ),
                    suggestions=[
                        f"set spec.resources.gpus to a multiple of {t_nn + r_nn}",
                        "or set trainer.n_gpus_per_node and " + r_gpn_key,
                    ],
                )
            ]
        g = gpus // (t_nn + r_nn)
    g = g or min(node_gpus, gpus)
    tg, rg = t_gpn or g, r_gpn or g
    if t_nn is None:
        rest = gpus - (r_nn or 1) * rg
        t_nn = rest // tg if rest > 0 and rest % tg == 0 else max(1, rest // tg)
    if r_nn is None:
        rest = gpus - t_nn * tg
        r_nn = rest // rg if rest > 0 and rest % rg == 0 else max(1, rest // rg)
    split = Split(t_nn, tg, r_nn, rg)
    total = split.trainer_gpus + split.rollout_gpus
    if total != gpus:
        want = gpus - split.trainer_gpus
        near = [v for v in ((want // rg), -(-want // rg)) if v >= 1] if want > 0 else []
        return None, [
            Violation(
                field="spec.resources.gpus",
                rule="pools-agree",
                message=(
                    f"trainer pool trainer.nnodes {t_nn} x n_gpus_per_node {tg} = {split.trainer_gpus} + rollout "
                    f"pool {r_nn_key} {r_nn} x {r_gpn_key.rsplit('.', 1)[-1]} {rg} = {split.rollout_gpus} "
                    f"= {total} != spec.resources.gpus {gpus} (the job's GPUs are both pools')"
                ),
                suggestions=[f"set spec.resources.gpus: {total}"]
                + [f"or {r_nn_key}={v}" for v in sorted(set(near)) if split.trainer_gpus + v * rg == gpus],
            )
        ]
    return split, []


ROLLOUT_GPUS = "spec.resources.rolloutGpus"


def spec_split(spec: VerlJobSpec, inputs: ModeInputs, node_gpus: int) -> tuple[Split | None, list[Violation]]:
    """The split ``spec.resources.rolloutGpus`` gives: the rollout pool's GPUs, the trainer pool the rest.

    Each pool is whole nodes of ``g`` GPUs (the pool's ``n_gpus_per_node`` override, else
    ``spec.resources.gpusPerNode``, else the largest node's GPUs), or, for a job that fits one node, both pools
    share it. A pool key in the overrides must agree with the split (a conflict names both). Example: 16 GPUs,
    ``rolloutGpus: 8`` -> trainer 1 x 8, rollout 1 x 8; 8 GPUs on one node, ``rolloutGpus: 2`` -> 1 x 6 + 1 x 2.
    """
    r_nn_key, r_gpn_key = ROLLOUT_POOL_KEYS[inputs.mode]
    gpus, rollout = spec.resources.gpus, int(spec.resources.rollout_gpus or 0)
    trainer = gpus - rollout
    if trainer < 1:
        return None, [
            Violation(
                field=ROLLOUT_GPUS,
                rule="pools-agree",
                message=(
                    f"{ROLLOUT_GPUS} {rollout} leaves spec.resources.gpus {gpus} - {rollout} = {trainer} GPUs for "
                    "the trainer pool (the job's GPUs are both pools')"
                ),
                suggestions=[f"set {ROLLOUT_GPUS} below {gpus}", f"or spec.resources.gpus above {rollout}"],
            )
        ]
    t_gpn, r_gpn = inputs.get("trainer.n_gpus_per_node"), inputs.get(r_gpn_key)
    g = spec.resources.gpus_per_node or t_gpn or r_gpn or min(node_gpus, gpus)
    tg, rg = t_gpn or g, r_gpn or g
    if rollout % rg == 0 and trainer % tg == 0:
        split = Split(trainer // tg, tg, rollout // rg, rg)
    elif gpus <= node_gpus and t_gpn in (None, trainer) and r_gpn in (None, rollout):
        split = Split(1, trainer, 1, rollout)  # one node holds both pools
    else:
        unit = tg if tg == rg else g
        near = sorted({v for v in (rollout // unit * unit, -(-rollout // unit) * unit) if 0 < v < gpus})
        return None, [
            Violation(
                field=ROLLOUT_GPUS,
                rule="pools-agree",
                message=(
                    f"{ROLLOUT_GPUS} {rollout} and the trainer pool's {gpus} - {rollout} = {trainer} GPUs are not "
                    f"whole nodes of {rg} and {tg} GPUs (rollout {r_gpn_key}, trainer.n_gpus_per_node), and "
                    f"{gpus} GPUs do not fit one node of {node_gpus}"
                ),
                suggestions=[f"set {ROLLOUT_GPUS}: {v}" for v in near]
                or [f"set spec.resources.gpus to a multiple of {unit}"],
            )
        ]
    # A pinned node count, and the rolloutGpus that would agree with it.
    pinned = (
        (
            "trainer.nnodes",
            split.trainer_nnodes,
            gpus - (inputs.get("trainer.nnodes") or 0) * split.trainer_gpn,
        ),
        (r_nn_key, split.rollout_nnodes, (inputs.get(r_nn_key) or 0) * split.rollout_gpn),
    )
    for key, want, better in pinned:
        got = inputs.get(key)
        if got is not None and got != want:
            return None, [
                Violation(
                    field=ROLLOUT_GPUS,
                    rule="override-conflict",
                    message=(
                        f"{ROLLOUT_GPUS} = {rollout} makes {key} {want} (trainer {split.trainer_nnodes} x "
                        f"{split.trainer_gpn} + rollout {split.rollout_nnodes} x {split.rollout_gpn} GPUs) but "
                        f"{inputs.source(key)} = {got}"
                    ),
                    suggestions=[f"drop {inputs.source(key)}"]
                    + ([f"or set {ROLLOUT_GPUS}: {better}"] if 0 < better < gpus else []),
                )
            ]
    return split, []


def pool_overrides(inputs: ModeInputs, split: Split) -> list[str]:
    """The pool keys verl reads for the mode, set to the split (the trainer's come with the trainer plan)."""
    r_nn_key, r_gpn_key = ROLLOUT_POOL_KEYS[inputs.mode]
    return [f"{r_nn_key}={split.rollout_nnodes}", f"{r_gpn_key}={split.rollout_gpn}"]


def trainer_spec(
    spec: VerlJobSpec,
    inputs: ModeInputs,
    split: Split,
    extra: Sequence[str],
    drop_keys: frozenset[str] = frozenset(),
) -> VerlJobSpec:
    """The spec the colocated planner plans the trainer pool from: the trainer pool's GPUs, without the
    rollout pool's keys, the recipes' own sections and ``drop_keys``, with ``extra`` overrides appended."""
    drop = set(inputs.recipe_indices)
    r_keys = set(ROLLOUT_POOL_KEYS[inputs.mode]) | {f"{ARR}.rollout.nnodes", f"{ARR}.rollout.n_gpus_per_node"}
    r_keys |= drop_keys
    kept: list[str] = []
    for i, raw in enumerate(spec.overrides):
        if i in drop:
            continue
        try:
            key = parse_override(raw, i).key
        except _OverrideError:
            kept.append(raw)
            continue
        if key in r_keys:
            continue
        kept.append(raw)
    if inputs.megatron_config:
        kept.append("--config-name=ppo_megatron_trainer")
    resources = spec.resources.model_copy(
        update={"gpus": split.trainer_gpus, "gpus_per_node": split.trainer_gpn}
    )
    update: dict[str, object] = {"resources": resources, "overrides": [*kept, *extra]}
    if "data.train_batch_size" in drop_keys:
        update["data"] = spec.data.model_copy(update={"train_batch_size": None})
    if f"{ARR}.actor.ppo_mini_batch_size" in drop_keys:
        update["batching"] = spec.batching.model_copy(update={"ppo_mini_batch_size": None})
    return spec.model_copy(update=update)


def recipe_overrides(spec: VerlJobSpec, inputs: ModeInputs) -> list[str]:
    """The recipes' own sections as the user wrote them (their pool keys excepted: the plan sets those)."""
    r_keys = set(ROLLOUT_POOL_KEYS[inputs.mode])
    out = []
    for i in inputs.recipe_indices:
        raw = spec.overrides[i]
        if CONFIG_ARG.match(raw):
            continue
        if parse_override(raw, i).key not in r_keys:
            out.append(raw)
    return out
