"""Capacity is not validity: a job the cluster is too small for today waits (``Pending``), never ``Invalid``.

``Invalid`` is for specs no cluster of this shape could run (a rule, memory); a job short of GPUs or of
eligible nodes (lost, NotReady) is ``Pending`` with the planner's reason and is placed when capacity returns.
"""

from __future__ import annotations

from conftest import make_nodes
from test_controller_transitions import HEAD, SPEC, World, passes, pod_vanishes, pods_are


def conditions(world: World) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in world.status().get("conditions", [])}


def test_a_job_larger_than_the_cluster_waits_and_runs_when_nodes_join() -> None:
    world = World()
    world.submit({**SPEC, "resources": {"gpus": 32, "gpusPerNode": 8}})
    world.reconcile()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Pending", "InsufficientCapacity")
    assert "32 GPUs at 8 per node do not fit" in status["message"]
    cond = conditions(world)
    assert cond["Valid"] == ("True", "InsufficientCapacity") and cond["Stalled"][0] == "False"
    assert status["violations"][0]["rule"] == "not-enough-gpus"
    assert ("Normal", "WaitingForCapacity") in [(t, r) for t, r, _ in world.kube.events]
    world.nodes += make_nodes(2, 8, prefix="joined")
    world.reconcile()
    assert world.status()["phase"] == "Starting" and "violations" not in world.status()


def test_a_restart_on_a_shrunken_cluster_is_pending_not_invalid() -> None:
    world = World()
    world.submit({**SPEC, "backoffLimit": 1})
    passes(2)(world)
    pods_are("Running")(world)
    world.reconcile()
    assert world.status()["phase"] == "Running"
    # A node is deleted: its pod goes with it and the cluster has 8 GPUs left for a 16-GPU job.
    world.nodes = world.nodes[1:]
    pod_vanishes(HEAD)(world)
    passes(3)(world)
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Pending", "InsufficientCapacity"), status
    assert status["restarts"] == 1
