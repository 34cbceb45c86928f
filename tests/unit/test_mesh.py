"""The one owner of the mesh and batch arithmetic (``planner.mesh``): its numbers, and the search agreeing
with it (the search's candidates are the Mesh's numbers, not a second derivation)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import make_problem, make_settings

from verl_operator.api.spec import ModelShape, VerlJobSpec
from verl_operator.commands.plan import load_nodes
from verl_operator.planner import plan_job
from verl_operator.planner.mesh import (
    Mesh,
    batch_step,
    divides_over,
    fewest_batch,
    fits_nvlink_domain,
    heads_allow_sp,
    heads_allow_tp,
    nvlink_group_per_node,
    nvlink_spans_nodes,
    pod_cpu,
    replica_fits_nodes,
    rollout_tp_sizes,
)

CLUSTERS = Path(__file__).parents[2] / "examples" / "clusters"


def _shape(heads: int, kv: int) -> ModelShape:
    return ModelShape(
        hidden_size=heads * 128,
        layers=2,
        attention_heads=heads,
        kv_heads=kv,
        vocab_size=1000,
        intermediate_size=heads * 256,
        max_position_embeddings=4096,
    )


@pytest.mark.parametrize(
    ("heads", "kv", "sp", "ok"),
    [
        (28, 4, 1, True),
        (28, 4, 2, True),
        (28, 4, 4, True),
        (28, 4, 7, False),  # 4 KV heads: 4 % 7 and 7 % 4 are both non-zero
        (28, 4, 8, False),  # 28 % 8
        (32, 8, 16, True),  # SP a multiple of the KV heads
        (40, 8, 16, False),
    ],
)
def test_heads_allow_sp(heads: int, kv: int, sp: int, ok: bool) -> None:
    assert heads_allow_sp(_shape(heads, kv), sp) is ok


@pytest.mark.parametrize(("heads", "tp", "ok"), [(28, 1, True), (28, 4, True), (28, 8, False), (40, 8, True)])
def test_heads_allow_tp(heads: int, tp: int, ok: bool) -> None:
    assert heads_allow_tp(_shape(heads, 4), tp) is ok


@pytest.mark.parametrize(
    ("size", "domain", "ok"),
    [(1, 1, True), (2, 8, True), (8, 8, True), (16, 8, False), (3, 8, False), (4, 2, False)],
)
def test_fits_nvlink_domain(size: int, domain: int, ok: bool) -> None:
    assert fits_nvlink_domain(size, domain) is ok


@pytest.mark.parametrize(
    ("group", "gpn", "per_node"), [(1, 8, 1), (4, 8, 4), (8, 8, 8), (8, 4, 4), (16, 4, 4)]
)
def test_nvlink_group_per_node(group: int, gpn: int, per_node: int) -> None:
    assert nvlink_group_per_node(group, gpn) == per_node


@pytest.mark.parametrize(
    ("requested", "gpus", "cpu"),
    [(None, 8, "26"), (None, 1, "5"), ("", 4, "14"), ("64", 8, "64"), ("2500m", 1, "2500m")],
)
def test_pod_cpu(requested: str | None, gpus: int, cpu: str) -> None:
    assert pod_cpu(requested, gpus) == cpu


@pytest.mark.parametrize(
    ("version", "tb", "n", "mini", "world", "sp", "padded", "lp_per_gpu"),
    [
        ("0.9", 96, 1, 40, 4, 1, 120, 30),  # 96 padded to a multiple of lcm(4, 40) = 40
        ("0.6", 96, 1, 40, 4, 1, 96, 24),  # verl 0.6 does not pad
        ("0.9", 1024, 5, 256, 8, 1, 5120, 640),
        ("0.9", 60, 1, 16, 8, 2, 64, 16),  # DP 4, unit lcm(4, 16) = 16
    ],
)
def test_mesh_padding_and_log_prob_batch(
    version: str, tb: int, n: int, mini: int, world: int, sp: int, padded: int, lp_per_gpu: int
) -> None:
    p = make_problem(version=version)
    s = make_settings(
        world=world,
        gpus_per_node=world,
        train_batch_size=tb,
        rollout_n=n,
        ppo_mini_batch_size=mini,
        sequence_parallel_size=sp,
    )
    mesh = Mesh.of(p, s)
    assert (mesh.padded_trajectories, mesh.log_prob_per_gpu) == (padded, lp_per_gpu)
    assert mesh.data_parallel_size == world // sp
    assert mesh.mini_per_gpu == mini * n // (world // sp)


def _plan(cluster: str, spec: dict[str, Any]) -> Any:
    result = plan_job(VerlJobSpec.model_validate(spec), load_nodes(str(CLUSTERS / f"{cluster}.yaml")))
    assert result.feasible and result.plan is not None, result.violations
    return result.plan


@pytest.mark.parametrize("version", ["0.6", "0.9"])
def test_the_search_picks_log_prob_micro_batches_of_the_meshes_batch(version: str) -> None:
    # A pinned mini-batch of 40 does not divide 96 prompts: verl 0.9 pads to 120 trajectories (30 per GPU),
    # verl 0.6 does not (24 per GPU). The search's log-prob candidates are divisors of that per-GPU batch:
    # on 0.6 it once used the padded 30 and chose 15, which splits neither 24 nor matches the reported passes.
    plan = _plan(
        "a100-pcie",
        {
            "verl": {"image": "verl:x", "version": version},
            "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"},
            "algorithm": "ppo",
            "data": {"trainBatchSize": 96},
            "batching": {"ppoMiniBatchSize": 40},
            "resources": {"gpus": 4},
        },
    )
    per_gpu = (
        plan.batching.trajectories_per_step + plan.padding.padded_trajectories
    ) // plan.data_parallel_size
    assert per_gpu == (30 if version == "0.9" else 24)
    micro = plan.batching.log_prob_micro_batch_size_per_gpu
    assert per_gpu % micro == 0, (per_gpu, micro)
    assert plan.batching.log_prob_passes_per_gpu * micro == per_gpu


@pytest.mark.parametrize("gpn", [1, 2, 4, 8])
@pytest.mark.parametrize("nnodes", [1, 2, 3, 4])
def test_replica_sizes_and_node_fit_follow_their_definitions(gpn: int, nnodes: int) -> None:
    """The search's TP candidates and the replica rule share ``mesh``'s helpers: every candidate fits the
    nodes and divides the world, and every size that does (up to the world) is a candidate."""
    world = gpn * nnodes
    sizes = rollout_tp_sizes(gpn, nnodes)
    assert all(replica_fits_nodes(tp, gpn) and world % tp == 0 for tp in sizes)
    assert sizes == [tp for tp in range(1, world + 1) if world % tp == 0 and replica_fits_nodes(tp, gpn)]
    assert nvlink_spans_nodes(gpn * 2, gpn) and not nvlink_spans_nodes(gpn, gpn)


@pytest.mark.parametrize(("ranks", "n"), [(8, 1), (8, 5), (6, 4), (12, 8), (7, 3)])
def test_batch_steps_are_the_sizes_that_divide_over_the_ranks(ranks: int, n: int) -> None:
    step = batch_step(ranks, n)
    assert [b for b in range(1, 100) if b * n % ranks == 0] == list(range(step, 100, step))
    fewest = fewest_batch(ranks, n)
    assert fewest * n >= ranks > (fewest - 1) * n
    assert divides_over(step * n, ranks) == (step * n >= ranks)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # 8 GPUs, batch 1024 x n 5 = 5120 trajectories, mini 256 x 5 = 1280, TP 2, SP 1: DP 8, 4 replicas,
        # 1280 / 8 = 160 per GPU, 5120 / 8 = 640 log-prob sequences per GPU.
        pytest.param({}, (8, 4, 160, 640, 160), id="unchanged"),
        pytest.param({"rollout_tp": 4}, (8, 2, 160, 640, 160), id="tp4-8/4=2-replicas"),
        # SP 2: DP 8 / 2 = 4, 1280 / 4 = 320, 5120 / 4 = 1280; the critic's SP is the job's (1): 160.
        pytest.param({"sequence_parallel_size": 2}, (4, 4, 320, 1280, 160), id="sp2-dp4"),
        # n 4: 1024 x 4 = 4096 trajectories, mini 256 x 4 = 1024: 1024 / 8 = 128, 4096 / 8 = 512.
        pytest.param({"rollout_n": 4}, (8, 4, 128, 512, 128), id="n4"),
    ],
)
def test_a_changed_mesh_is_the_mesh_of_the_changed_settings(
    change: dict[str, int], expected: tuple[int, int, int, int, int]
) -> None:
    mesh = Mesh.of(make_problem(), make_settings())
    new = mesh.changed(**change)
    got = (
        new.data_parallel_size,
        new.rollout_replicas,
        new.mini_per_gpu,
        new.log_prob_per_gpu,
        new.critic_mini_per_gpu,
    )
    assert got == expected
    assert all(getattr(new.settings, k) == v for k, v in change.items())
    assert new.problem is mesh.problem
    assert (mesh.data_parallel_size, mesh.rollout_replicas) == (8, 4)  # the original mesh is untouched
