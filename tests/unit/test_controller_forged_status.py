"""A status patched by hand is never obeyed: a finished phase while the attempt's pods still run is derived
again from the pods (the forged phase overwritten, the pods kept, a ``StatusOverwritten`` Warning event)."""

from __future__ import annotations

from typing import Any

from test_controller_transitions import HEAD, NAME, NS, RUNNING, SPEC, WORKER, World, pods_are


def forge(world: World, **status: Any) -> None:
    """What ``kubectl patch vj --subresource=status --type=merge`` does."""
    world.kube.objects[("VerlJob", NS, NAME)]["status"].update(status)


def running() -> World:
    world = World()
    world.submit(SPEC)
    for step in RUNNING:
        step(world)
    world.reconcile()
    assert world.status()["phase"] == "Running"
    return world


def test_a_forged_succeeded_phase_is_overwritten_and_the_pods_kept() -> None:
    world = running()
    forge(world, phase="Succeeded", completionTime="2027-01-15T08:00:00Z")
    world.reconcile()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Running", "AllPodsRunning")
    assert "completionTime" not in status
    assert sorted(world.kube.pods()) == sorted([HEAD, WORKER])
    (event,) = [e for e in world.kube.events if e[1] == "StatusOverwritten"]
    assert "status.phase Succeeded was not written by the operator: 2 pods of attempt 0 still run" in event[2]


def test_a_forged_failed_phase_is_overwritten_too() -> None:
    world = running()
    forge(world, phase="Failed", reason="PodFailed")
    world.reconcile()
    assert world.status()["phase"] == "Running"
    assert len(world.kube.pods()) == 2


def test_a_forged_phase_on_a_job_that_did_end_ends_it_by_the_pods() -> None:
    world = running()
    pods_are("Succeeded", HEAD, exit_code=0)(world)
    forge(world, phase="Failed")
    world.reconcile()
    assert world.status()["phase"] == "Succeeded"
    assert sorted(world.kube.pods()) == [HEAD]  # the worker stopped, as for any success


def test_the_operator_s_own_finished_phase_is_kept() -> None:
    world = running()
    pods_are("Succeeded", HEAD, exit_code=0)(world)
    world.reconcile()
    assert world.status()["phase"] == "Succeeded"
    writes = len(world.kube.writes)
    world.reconcile()
    assert world.status()["phase"] == "Succeeded" and len(world.kube.writes) == writes
