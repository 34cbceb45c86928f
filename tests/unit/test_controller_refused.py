"""Pods the API server refuses for good (Pod Security, schema, quota): the job says so and frees its GPUs.

Without a webhook in front (or when the namespace changed since admission) a pod create can fail with 400,
403 or 422. The job becomes ``Invalid`` with the API server's message (``Valid=False``, ``Stalled``, a
Warning event), its pods go, its reservation is released, and it is not retried until its spec changes.
"""

from __future__ import annotations

from test_controller_transitions import NS, SPEC, UID, World, spec_becomes

REFUSAL = 'pods "j-r0-head" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true'


def conditions(world: World) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in world.status().get("conditions", [])}


def test_refused_pods_make_the_job_invalid_and_free_its_gpus() -> None:
    world = World()
    world.kube.refuse_pods = REFUSAL
    world.submit(SPEC)
    world.reconcile()  # plans and places (the placement is written before any child)
    world.reconcile()  # creates the children: the head pod is refused
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Invalid", "PodsRefused")
    assert REFUSAL in status["message"] and "(403)" in status["message"]
    cond = conditions(world)
    assert cond["Valid"] == ("False", "PodsRefused") and cond["Stalled"][0] == "True"
    assert ("Warning", "PodsRefused") in [(t, r) for t, r, _ in world.kube.events]
    assert world.kube.pods() == {} and "placement" not in status
    assert UID not in world.reconciler.reservations.decided


def test_a_refused_job_is_not_retried_until_its_spec_changes() -> None:
    world = World()
    world.kube.refuse_pods = REFUSAL
    world.submit(SPEC)
    world.reconcile()
    world.reconcile()
    assert world.status()["reason"] == "PodsRefused"
    creates = [w for w in world.kube.writes if w[0] == "create"]
    world.reconcile()
    world.reconcile()
    assert [w for w in world.kube.writes if w[0] == "create"] == creates, "no retry of the same generation"
    # The namespace now admits the pods and the user changes the spec: placed again.
    world.kube.refuse_pods = None
    spec_becomes({**SPEC, "backoffLimit": 1})(world)
    world.reconcile()
    world.reconcile()
    assert world.status()["phase"] == "Starting"
    assert len(world.kube.pods()) == 2 and all(ns == NS for (_, ns, _) in world.kube.objects)
