"""Ray pods the kubelet cannot start: the containers' waiting reasons as conditions, the GPUs given back.

An invalid image reference fails the job at once; a pull or configuration error after
``spec.startDeadlineSeconds``; the timers wake the job at that deadline. The rows run the reconciler against
the in-memory API server of the transition tests.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_controller_transitions import HEAD, NAME, SPEC, WORKER, World, passes, with_spec

from verl_operator.api.image_ref import image_problem
from verl_operator.controller.podstart import STARTABLE, stuck
from verl_operator.controller.status import format_time
from verl_operator.controller.timers import MARGIN_SECONDS, next_due

IMAGE = "ghcr.io/example/verl:0.9.1"


def waiting(world: World, name: str, reason: str, message: str = "", *, init: bool = False) -> None:
    """The kubelet's part: pod ``name`` bound, Pending, its container waiting with ``reason``."""
    pod = world.kube.pods()[name]
    pod["spec"]["nodeName"] = "gpu-0" if name == HEAD else "gpu-1"
    state = {"waiting": {"reason": reason, "message": message}}
    key = "initContainerStatuses" if init else "containerStatuses"
    pod["status"] = {"phase": "Pending", key: [{"name": "ray", "image": IMAGE, "state": state}]}


def running(world: World) -> None:
    for pod in world.kube.pods().values():
        pod["status"] = {"phase": "Running"}


def conditions(world: World) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in world.status().get("conditions") or []}


def started(spec: dict[str, Any]) -> World:
    world = World()
    world.submit(spec)
    passes(2)(world)  # placed, then every pod created and released
    return world


@pytest.mark.parametrize(
    ("reason", "condition"),
    [
        pytest.param("InvalidImageName", "InvalidImage", id="invalid-image-name"),
        pytest.param("ErrImageNeverPull", "InvalidImage", id="never-pull"),
    ],
)
def test_a_permanent_waiting_reason_fails_the_job_at_once_and_frees_the_gpus(
    reason: str, condition: str
) -> None:
    world = started(SPEC)
    waiting(world, HEAD, reason, 'couldn\'t parse image name "ghcr.io/Example/VERL:0.9.1"')
    world.reconcile()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Failed", condition), status["message"]
    assert f"pod {HEAD} container ray (image {IMAGE}): {reason}" in status["message"]
    assert "16 GPUs given back" in status["message"]
    assert conditions(world)[STARTABLE]["reason"] == condition
    assert conditions(world)["Failed"]["reason"] == condition
    assert world.kube.pods() == {}  # nothing holds the GPUs
    assert [e[1] for e in world.kube.events][-1] == condition


@pytest.mark.parametrize(
    ("reason", "condition", "fix"),
    [
        pytest.param("ErrImagePull", "ImagePullFailed", "the pull secret", id="err-image-pull"),
        pytest.param("ImagePullBackOff", "ImagePullFailed", "the pull secret", id="back-off"),
        pytest.param(
            "CreateContainerConfigError", "ContainerConfigInvalid", "Secret or ConfigMap", id="config-error"
        ),
        pytest.param("CreateContainerError", "ContainerCreateFailed", "container runtime", id="create-error"),
    ],
)
def test_a_transient_waiting_reason_gives_the_gpus_back_after_the_start_deadline(
    reason: str, condition: str, fix: str
) -> None:
    world = started(with_spec(startDeadlineSeconds=300))
    waiting(world, WORKER, reason, "rpc error")
    world.reconcile()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Starting", condition), status["message"]
    first = conditions(world)[STARTABLE]
    assert (first["status"], first["reason"]) == ("False", condition)
    assert fix in first["message"] and f"{reason}: rpc error" in first["message"]
    assert f"gives them back at {format_time(world.now + 300)}" in status["message"]
    assert len(world.kube.pods()) == 2
    assert next_due(world.job() or {}) == world.now + 300 + MARGIN_SECONDS

    world.now += 299  # the kubelet alternates its reasons: the clock keeps running from the first pass
    waiting(world, WORKER, "ImagePullBackOff" if reason == "ErrImagePull" else reason, "back-off")
    world.reconcile()
    assert world.status()["phase"] == "Starting"
    assert conditions(world)[STARTABLE]["lastTransitionTime"] == first["lastTransitionTime"]

    world.now += 1
    world.reconcile()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Failed", "StartDeadlineExceeded"), status["message"]
    assert "not started within spec.startDeadlineSeconds 300" in status["message"]
    assert world.kube.pods() == {}
    assert next_due(world.job() or {}) is None


def test_pods_that_start_before_the_deadline_drop_the_condition() -> None:
    world = started(SPEC)
    waiting(world, HEAD, "ImagePullBackOff")
    world.reconcile()
    world.now += 60
    running(world)
    world.reconcile()
    assert world.status()["phase"] == "Running"
    assert STARTABLE not in conditions(world)
    assert next_due(world.job() or {}) is None


def test_plain_container_creating_is_not_a_start_error() -> None:
    world = started(SPEC)
    waiting(world, HEAD, "ContainerCreating")
    world.now += 10_000
    world.reconcile()
    assert (world.status()["phase"], world.status()["reason"]) == ("Starting", "PodsStarting")


def test_an_init_container_that_cannot_pull_is_read_too() -> None:
    pod = {
        "status": {
            "initContainerStatuses": [
                {"name": "launcher", "image": "op:1", "state": {"waiting": {"reason": "ErrImagePull"}}}
            ]
        }
    }
    found = stuck([f"{NAME}-r0-head"], {f"{NAME}-r0-head": pod})
    assert (
        found is not None
        and found.reason == "ImagePullFailed"
        and "container launcher (image op:1)" in found.message
    )


@pytest.mark.parametrize(
    ("image", "problem"),
    [
        pytest.param(
            "ghcr.io/Example/VERL:0.9.1", "use ghcr.io/example/verl:0.9.1", id="upper-case-repository"
        ),
        pytest.param("Verl:1", "use verl:1", id="upper-case-single-name"),
        pytest.param("ghcr.io/x/verl:bad tag", "the tag 'bad tag'", id="space-in-tag"),
        pytest.param("ghcr.io/x/verl:", "the tag ''", id="empty-tag"),
        pytest.param("ghcr.io/x//verl:1", "not a valid image path", id="empty-component"),
        pytest.param("ghcr.io/x/-verl:1", "not a valid image path", id="leading-separator"),
        pytest.param("x/verl@sha256:abc", "the digest", id="short-digest"),
        pytest.param("ghcr.io/x/verl:1", None, id="plain"),
        pytest.param("localhost:5000/x/verl:0.9.1", None, id="registry-port"),
        pytest.param("Registry/verl:1", None, id="upper-case-first-component-is-a-domain"),
        pytest.param("nvcr.io/nvidia/pytorch:24.05-py3", None, id="ngc"),
        pytest.param("a/b_c__d-e.f:1", None, id="separators"),
        pytest.param("x/verl@sha256:" + "a" * 64, None, id="digest"),
        pytest.param("[::1]:5000/x:1", None, id="ipv6-registry"),
    ],
)
def test_image_references_as_the_kubelet_parses_them(image: str, problem: str | None) -> None:
    found = image_problem(image)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found, found


def test_the_admission_models_refuse_an_upper_case_repository() -> None:
    from pydantic import ValidationError

    from verl_operator.api.errors import validation_lines
    from verl_operator.api.spec import VerlJobSpec

    with pytest.raises(ValidationError) as exc:
        VerlJobSpec.model_validate({**SPEC, "verl": {"image": "ghcr.io/Example/VERL:0.9.1"}})
    (line,) = validation_lines(exc.value)
    assert line.startswith("spec.verl.image: the repository Example/VERL has upper-case letters")
    assert line.endswith("use ghcr.io/example/verl:0.9.1")
