"""A running job's progress: the pure decision as a table, then the reconciler reading the launcher's real
endpoint (verl's published step lines fed in) into status.progress, the conditions, the stall action and the
per-job metrics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from verl_contract.progress import ProgressDocument, StepSample
from verl_launcher.progress import ProgressTracker
from verl_launcher.progress_server import ProgressServer
from verl_operator.api.spec import MonitoringSpec, StallSpec
from verl_operator.api.status import Condition, VerlJobStatus, parse_status
from verl_operator.controller import metrics
from verl_operator.controller.decide import decide
from verl_operator.controller.observed import Observed
from verl_operator.controller.progress import ProgressReading, ProgressWriter, follow
from verl_operator.controller.progress_client import ProgressClient, fetch, head_pod_ip
from verl_operator.controller.status import format_time

T0 = 1_800_000_000.0
MON = MonitoringSpec()
OUTPUT = Path(__file__).parent / "data" / "verl-output"


def doc(
    phase: str = "Stepping",
    age: float = 10.0,
    step: int = 0,
    last_step_age: float | None = None,
    recent: tuple[float, ...] = (),
) -> ProgressDocument:
    return ProgressDocument(
        launch_phase=phase,  # type: ignore[arg-type]
        phase_age_seconds=age,
        step=step,
        total_steps=300,
        step_seconds=recent[-1] if recent else None,
        phases={"gen": recent[-1] / 2} if recent else {},
        last_step_age_seconds=last_step_age,
        last_output_age_seconds=last_step_age,
        recent=[StepSample(step=step - len(recent) + 1 + i, seconds=s) for i, s in enumerate(recent)],
    )


def run(
    d: ProgressDocument | None,
    old: Any = None,
    stalled: Condition | None = None,
    mon: MonitoringSpec = MON,
    now: float = T0,
    error: str | None = None,
):  # type: ignore[no-untyped-def]
    return follow(old, ProgressReading(d, error), mon, stalled_before=stalled, now=now, generation=1)


@pytest.mark.parametrize(
    ("document", "reason", "stalled"),
    [
        pytest.param(doc("RayForming", age=899), "RayForming", False, id="ray-forming-in-time"),
        pytest.param(doc("RayForming", age=901), "RayNotFormed", True, id="ray-not-formed"),
        pytest.param(doc("RayFormed", age=601), "VerlNotStarted", True, id="verl-not-started"),
        pytest.param(doc("VerlStarted", age=3599), "VerlStarted", False, id="first-step-in-time"),
        pytest.param(doc("VerlStarted", age=3601), "NoFirstStep", True, id="no-first-step"),
        # 5 x median 93.5 s = 467 s is under the 900 s floor: the floor decides.
        pytest.param(
            doc(step=12, last_step_age=899, recent=(93.5, 94.0, 93.0)), "Stepping", False, id="floor-holds"
        ),
        pytest.param(
            doc(step=12, last_step_age=901, recent=(93.5, 94.0, 93.0)), "NoNewStep", True, id="past-floor"
        ),
        # 5 x median 400 s = 2000 s is over the floor.
        pytest.param(
            doc(step=12, last_step_age=1999, recent=(400.0, 390.0, 410.0)),
            "Stepping",
            False,
            id="k-median-holds",
        ),
        pytest.param(
            doc(step=12, last_step_age=2001, recent=(400.0, 390.0, 410.0)),
            "NoNewStep",
            True,
            id="past-k-median",
        ),
    ],
)
def test_deadlines_per_launch_phase(document: ProgressDocument, reason: str, stalled: bool) -> None:
    out = run(document)
    progressing = next(c for c in out.conditions if c.type == "Progressing")
    assert progressing.reason == reason
    assert progressing.status == ("False" if stalled else "True")
    assert (out.stalled is not None) == stalled
    if stalled:
        assert out.event is not None and out.event.type == "Warning"
        assert any(c.type == "Stalled" and c.status == "True" for c in out.conditions)
        assert f"launch phase {document.launch_phase}" in out.stalled[1]  # type: ignore[index]


def test_stall_message_names_the_step_the_output_age_and_the_phase() -> None:
    out = run(doc(step=12, last_step_age=2001, recent=(400.0, 390.0, 410.0)))
    assert out.stalled is not None
    assert out.stalled[1] == (
        "no new step (deadline max(5 x median step 400.0 s, 900 s) = 2000 s) after 2001 s (deadline 2000 s): "
        "last step 12 of 300, last output line 2001 s ago, launch phase Stepping"
    )


def test_a_stalled_job_keeps_its_message_and_posts_one_event() -> None:
    first = run(doc(step=12, last_step_age=2001, recent=(400.0,)))
    stalled = next(c for c in first.conditions if c.type == "Stalled")
    again = run(doc(step=12, last_step_age=2500, recent=(400.0,)), stalled=stalled)
    assert again.event is None
    assert next(c for c in again.conditions if c.type == "Stalled").message == stalled.message
    resumed = run(doc(step=13, last_step_age=1, recent=(400.0, 400.0)), stalled=stalled)
    assert resumed.stalled is None and resumed.event is not None and resumed.event.reason == "Progressing"
    assert any(c.type == "Stalled" and c.status == "False" for c in resumed.conditions)


def test_status_writes_are_rate_limited() -> None:
    first = run(doc(step=10, last_step_age=1, recent=(93.5,)), now=T0)
    assert first.progress is not None and first.progress.step == 10
    # A new step 10 s later keeps the written progress (and its condition message): nothing to write.
    soon = run(doc(step=11, last_step_age=1, recent=(93.5, 93.5)), old=first.progress, now=T0 + 10)
    assert soon.progress == first.progress
    # (the transition time is kept from the old condition when its status is unchanged: merge_conditions)
    assert [(c.type, c.status, c.reason, c.message) for c in soon.conditions] == [
        (c.type, c.status, c.reason, c.message) for c in first.conditions
    ]
    late = run(doc(step=12, last_step_age=1, recent=(93.5,) * 3), old=first.progress, now=T0 + 30)
    assert late.progress is not None and late.progress.step == 12
    # A new attempt (an earlier step, a new launch phase) is written at once.
    restarted = run(doc("RayForming", age=3), old=late.progress, now=T0 + 31)
    assert restarted.progress is not None and restarted.progress.launch_phase == "RayForming"


def test_progress_fields_and_columns() -> None:
    d = doc(step=12, last_step_age=5, recent=(93.0, 94.0, 93.5))
    out = run(d.model_copy(update={"throughput_per_gpu": 2932.5, "mfu": 0.37}))
    p = out.progress
    assert p is not None
    assert (p.step, p.total_steps, p.step_seconds, p.generation_share) == (12, 300, 93.5, 0.5)
    assert p.eta_seconds == round(288 * 93.5)
    assert p.last_step_time == format_time(T0 - 5)
    assert (p.columns.step, p.columns.step_time, p.columns.generation, p.columns.eta) == (
        "12/300",
        "93.5s",
        "50%",
        "7h28m",
    )
    assert (p.throughput_per_gpu, p.mfu) == (2932.5, 0.37)


def test_an_unreadable_endpoint_is_unknown_and_keeps_the_progress() -> None:
    old = run(doc(step=3, last_step_age=1, recent=(9.0,))).progress
    out = run(None, old=old, error="connection refused")
    assert out.progress == old and out.stalled is None
    assert [(c.type, c.status, c.reason) for c in out.conditions] == [
        ("Progressing", "Unknown", "ProgressUnavailable")
    ]


# -- the reconciler reads the launcher's real endpoint ---------------------------------------------------


@pytest.fixture
def head() -> Iterator[tuple[ProgressTracker, int]]:
    tracker = ProgressTracker()
    server = ProgressServer(tracker.progress, host="127.0.0.1", port=0).start()
    try:
        yield tracker, server.port
    finally:
        server.stop()


def test_the_client_reads_the_head_pod_bounded_and_at_most_every_interval(
    head: tuple[ProgressTracker, int],
) -> None:
    tracker, port = head
    calls: list[str] = []
    clock = [100.0]

    def get(url: str) -> ProgressReading:
        calls.append(url)
        return fetch(url)

    client = ProgressClient(port=port, min_interval=5.0, clock=lambda: clock[0], get=get)
    job = {"metadata": {"namespace": "team", "name": "j"}, "spec": {}}
    pods = [
        {
            "metadata": {"labels": {"verl-operator.io/role": "head", "verl-operator.io/attempt": "0"}},
            "status": {"podIP": "127.0.0.1"},
        }
    ]
    tracker.enter("VerlStarted")
    for line in (OUTPUT / "gsm8k-vllm-ray-wrapped.log").read_text().splitlines():
        tracker.feed(line)
    first = client.read(job, pods, 0)
    assert first is not None and first.document is not None
    assert client.read(job, pods, 0) is first and len(calls) == 1
    clock[0] += 5.0
    assert client.read(job, pods, 0) is not first and len(calls) == 2
    assert head_pod_ip(pods, 1) is None
    assert client.read(job, pods, 1).error == "the head pod has no IP yet"  # type: ignore[union-attr]
    assert client.read({**job, "spec": {"monitoring": {"enabled": False}}}, pods, 0) is None
    assert fetch(f"http://127.0.0.1:{port}/nope").error == f"HTTP 404 from http://127.0.0.1:{port}/nope"


def test_per_job_metrics_are_set_and_removed() -> None:
    progress = run(doc(step=12, last_step_age=5, recent=(93.5,))).progress
    status = VerlJobStatus(phase="Running", progress=progress)
    metrics.set_job_progress("team", "m", status)
    labels = {"verljob_namespace": "team", "verljob": "m"}
    assert REGISTRY.get_sample_value("verl_operator_job_step", labels) == 12
    assert REGISTRY.get_sample_value("verl_operator_job_phase_seconds", {**labels, "phase": "gen"}) == 46.75
    assert REGISTRY.get_sample_value("verl_operator_job_stalled", labels) == 0
    metrics.set_job_progress("team", "m", status.model_copy(update={"phase": "Succeeded"}))
    assert REGISTRY.get_sample_value("verl_operator_job_step", labels) is None
    assert REGISTRY.get_sample_value("verl_operator_job_phase_seconds", {**labels, "phase": "gen"}) is None


def test_status_round_trip() -> None:
    progress = run(doc(step=12, last_step_age=5, recent=(93.5,))).progress
    wire = VerlJobStatus(phase="Running", progress=progress).to_wire()
    assert wire["progress"]["columns"]["step"] == "12/300"
    assert parse_status(wire).progress == progress


def test_stall_spec_bounds() -> None:
    with pytest.raises(ValueError, match=r"stepFactor|step_factor"):
        StallSpec.model_validate({"stepFactor": 1.0})


# -- the reconciler: status, printer columns' fields, stall action ----------------------------------------

NS, NAME = "team", "j"
SPEC: dict[str, Any] = {
    "verl": {"image": "example.com/verl:0.9.1"},
    "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
    "resources": {"gpus": 16},
    "backoffLimit": 1,
}


class Running:
    """A job whose pods run, with the head pod's IP on the local progress endpoint."""

    def __init__(self, port: int, spec: dict[str, Any]) -> None:
        from conftest import make_nodes
        from fakekube import FakeKube

        from verl_operator.controller.reconcile import JobReconciler

        self.kube = FakeKube()
        self.nodes = make_nodes(2, 8)
        self.now = T0
        self.client = ProgressClient(port=port, min_interval=0.0)
        self.reconciler = JobReconciler(
            self.kube, lambda: self.kube.snapshot(self.nodes), lambda: self.now, progress=self.client.read
        )
        self.kube.add(
            {
                "apiVersion": "verl-operator.io/v1alpha1",
                "kind": "VerlJob",
                "metadata": {"name": NAME, "namespace": NS, "uid": "uid-j", "generation": 1},
                "spec": spec,
            }
        )
        self.passes(2)
        self.pods_run()
        self.passes(1)
        assert self.status().phase == "Running"

    def pods_run(self) -> None:
        for index, (_, pod) in enumerate(sorted(self.kube.pods().items())):
            pod["spec"]["nodeName"] = self.nodes[index % 2]["metadata"]["name"]
            pod["status"] = {"phase": "Running", "podIP": "127.0.0.1"}

    def passes(self, n: int) -> None:
        for _ in range(n):
            self.reconciler.reconcile(NS, NAME)

    def status(self) -> VerlJobStatus:
        return parse_status((self.kube.get_job(NS, NAME) or {}).get("status"))


def test_reconciler_writes_progress_from_the_head(head: tuple[ProgressTracker, int]) -> None:
    tracker, port = head
    world = Running(port, SPEC)
    tracker.enter("VerlStarted")
    tracker.feed("(TaskRunner pid=15930) Total training steps: 435")
    # verl prints the step as one line; the published copy wraps it at each " - ".
    tracker.feed(
        " ".join(line.strip() for line in (OUTPUT / "gsm8k-vllm-ray-wrapped.log").read_text().splitlines())
    )
    world.passes(1)
    status = world.status()
    assert status.progress is not None
    assert (status.progress.step, status.progress.total_steps, status.progress.columns.step) == (
        1,
        435,
        "1/435",
    )
    assert status.progress.columns.generation == "26%" and status.progress.columns.step_time == "93.5s"
    assert status.progress.phases["update_weights"] == pytest.approx(5.458, abs=1e-3)
    progressing = status.condition("Progressing")
    assert progressing is not None and (progressing.status, progressing.reason) == ("True", "Stepping")
    labels = {"verljob_namespace": NS, "verljob": NAME}
    assert REGISTRY.get_sample_value("verl_operator_job_step", labels) == 1
    assert REGISTRY.get_sample_value("verl_operator_job_total_steps", labels) == 435
    writes = world.kube.writes.count(("patch_status", NAME))
    world.passes(3)  # no new step: no status write
    assert world.kube.writes.count(("patch_status", NAME)) == writes


@pytest.mark.parametrize(
    ("action", "phase", "attempt"),
    [
        pytest.param("none", "Running", 0, id="none-keeps-running"),
        pytest.param("restart", "Pending", 1, id="restart-under-backoff"),
        pytest.param("fail", "Failed", 0, id="fail"),
    ],
)
def test_a_hung_verl_is_stalled_and_handled_per_its_action(
    head: tuple[ProgressTracker, int], action: str, phase: str, attempt: int
) -> None:
    tracker, port = head
    world = Running(port, {**SPEC, "monitoring": {"stall": {"action": action}}})
    tracker.enter("VerlStarted")
    tracker.phase_since -= 3601  # verl started an hour ago and printed no step
    world.passes(1)
    status = world.status()
    assert (status.phase, status.attempt) == (phase, attempt)
    if action == "none":
        stalled = status.condition("Stalled")
        assert stalled is not None and (stalled.status, stalled.reason) == ("True", "NoFirstStep")
        assert (
            REGISTRY.get_sample_value("verl_operator_job_stalled", {"verljob_namespace": NS, "verljob": NAME})
            == 1
        )
    else:
        assert "verl has logged no step after 360" in (status.message or "")
    reasons = {"none": "Stalled", "restart": "Restarting", "fail": "NoFirstStep"}
    assert [e for e in world.kube.events if e[1] == reasons[action]], world.kube.events


def test_advice_appears_in_status_once_enough_steps_are_in(head: tuple[ProgressTracker, int]) -> None:
    tracker, port = head
    world = Running(port, SPEC)
    tracker.enter("VerlStarted")
    # The published Qwen3-8B step: generation 699 of 1268 s (55%); the 16-GPU job runs on two nodes.
    line = (OUTPUT / "qwen3-8b-megatron-before.log").read_text().strip()
    for step in range(1, 5):
        tracker.feed(line.replace("step:3 ", f"step:{step} ", 1))
    world.passes(1)
    progress = world.status().progress
    assert progress is not None and progress.step == 4 and progress.advice is None  # 4 steps: too few
    tracker.feed(line.replace("step:3 ", "step:5 ", 1))
    world.now += 30
    world.passes(1)
    progress = world.status().progress
    assert progress is not None and progress.step == 5 and progress.advice is not None
    assert (progress.advice.setting, progress.advice.value) == ("rollout.nnodes", "1")
    assert "generation takes 698.9 s of the 1268.5 s step (55%" in progress.advice.reason


def test_status_writes_per_running_job_are_bounded_by_the_interval(head: tuple[ProgressTracker, int]) -> None:
    """A step every 2 s for 400 s, a pass after each step: at most one status write per 30 s (14 of 200)."""
    tracker, port = head
    world = Running(port, SPEC)
    tracker.enter("VerlStarted")
    before = world.kube.writes.count(("patch_status", NAME))
    for step in range(1, 201):
        tracker.feed(f"step:{step} - timing_s/step:2.0 - timing_s/gen:0.8 - timing_s/update_actor:1.0")
        world.now += 2.0
        world.passes(1)
    writes = world.kube.writes.count(("patch_status", NAME)) - before
    print(f"status writes: {writes} for 200 steps in 400 s")
    assert writes <= 400 / 30 + 1, writes
    assert world.status().progress.step >= 200 - 15  # type: ignore[union-attr]


# -- the fast path: a progress read that finds nothing else changed --------------------------------------


@pytest.fixture
def decisions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The whole decisions the reconciler takes (``decide`` still runs: it is counted, not replaced)."""
    from verl_operator.controller import reconcile

    taken: list[str] = []
    real = reconcile.decide

    def counted(seen: Any) -> Any:
        taken.append(str(seen.job["metadata"]["name"]))
        return real(seen)

    monkeypatch.setattr(reconcile, "decide", counted)
    return taken


def stepping(tracker: ProgressTracker, world: Running, steps: range) -> None:
    for step in steps:
        tracker.feed(f"step:{step} - timing_s/step:10.0 - timing_s/gen:4.0 - timing_s/update_actor:5.0")
        world.now += 30.0
        world.passes(1)


def test_a_progress_read_with_nothing_else_changed_skips_the_decision(
    head: tuple[ProgressTracker, int], decisions: list[str]
) -> None:
    tracker, port = head
    world = Running(port, SPEC)
    tracker.enter("VerlStarted")
    stepping(tracker, world, range(1, 3))  # the first progress write, then a steady pass to remember
    decisions.clear()
    before = world.kube.writes.count(("patch_status", NAME))
    stepping(tracker, world, range(3, 8))
    assert decisions == []  # five reads, no whole pass
    assert world.kube.writes.count(("patch_status", NAME)) - before == 5  # each new step, 30 s apart
    status = world.status()
    assert status.phase == "Running" and status.progress is not None and status.progress.step == 7
    ready = status.condition("Ready")
    assert ready is not None and ready.status == "True" and f"{NAME}-r0-head@" in (ready.message or "")
    progressing = status.condition("Progressing")
    assert progressing is not None and progressing.message == "step 7, 10.0s per step"


@pytest.mark.parametrize(
    "change",
    ["pod-failed", "spec", "label", "node-gone", "status-by-hand"],
)
def test_any_other_change_takes_the_whole_pass(
    head: tuple[ProgressTracker, int], decisions: list[str], change: str
) -> None:
    tracker, port = head
    world = Running(port, SPEC)
    tracker.enter("VerlStarted")
    stepping(tracker, world, range(1, 3))
    decisions.clear()
    job = world.kube.objects[("VerlJob", NS, NAME)]
    pods = sorted(world.kube.pods().items())
    if change == "pod-failed":
        pods[-1][1]["status"] = {"phase": "Failed"}
    elif change == "spec":
        job["spec"] = {**job["spec"], "backoffLimit": 0}
        job["metadata"]["generation"] = 2
    elif change == "label":
        job["metadata"]["labels"] = {"team": "b"}
    elif change == "node-gone":
        world.reconciler.node_facts = lambda name: None
    else:
        job["status"]["attempt"] = 5  # a status patched by hand: derived again from the pods
    stepping(tracker, world, range(3, 4))
    assert decisions == [NAME]
    status = world.status()
    if change == "pod-failed":
        assert (status.phase, status.attempt) == ("Pending", 1)  # restarted under backoffLimit 1
    elif change == "node-gone":
        assert status.phase == "Pending" and status.restarts == 1
    elif change == "status-by-hand":
        assert status.attempt == 0 and [e for e in world.kube.events if e[1] == "StatusOverwritten"]
    else:
        assert status.phase == "Running" and status.observed_generation == job["metadata"]["generation"]


def test_a_stall_is_found_on_the_fast_path_and_its_action_taken(
    head: tuple[ProgressTracker, int], decisions: list[str]
) -> None:
    tracker, port = head
    world = Running(port, {**SPEC, "monitoring": {"stall": {"action": "fail", "minStepSeconds": 30}}})
    tracker.enter("VerlStarted")
    stepping(tracker, world, range(1, 3))
    decisions.clear()
    tracker.last_step -= 3600  # type: ignore[operator]  # no step for an hour
    world.passes(1)
    status = world.status()
    assert decisions == [NAME]  # the stall ends the attempt: a whole pass deletes the pods
    assert status.phase == "Failed" and status.reason == "NoNewStep" and not world.kube.pods()


def test_a_stall_without_action_is_written_by_the_fast_path(
    head: tuple[ProgressTracker, int], decisions: list[str]
) -> None:
    tracker, port = head
    world = Running(port, {**SPEC, "monitoring": {"stall": {"minStepSeconds": 30}}})
    tracker.enter("VerlStarted")
    stepping(tracker, world, range(1, 3))
    decisions.clear()
    tracker.last_step -= 3600  # type: ignore[operator]
    world.passes(1)
    stalled = world.status().condition("Stalled")
    assert decisions == []
    assert stalled is not None and (stalled.status, stalled.reason) == ("True", "NoNewStep")
    assert [e for e in world.kube.events if e[1] == "Stalled"]


def test_the_active_deadline_still_ends_a_running_job(
    head: tuple[ProgressTracker, int], decisions: list[str]
) -> None:
    tracker, port = head
    world = Running(port, {**SPEC, "activeDeadlineSeconds": 600})
    tracker.enter("VerlStarted")
    stepping(tracker, world, range(1, 3))
    decisions.clear()
    world.now += 600
    world.passes(1)
    assert decisions == [NAME]
    assert (world.status().phase, world.status().reason) == ("Failed", "DeadlineExceeded")


# -- status.progress written by someone else -----------------------------------------------------------------


def forge_progress(world: Running, **fields: Any) -> None:
    """What ``kubectl patch vj --subresource=status --type=merge -p '{"status": {"progress": ...}}'`` does."""
    status = world.kube.objects[("VerlJob", NS, NAME)]["status"]
    status["progress"] = {**status.get("progress", {}), **fields}


def overwritten(world: Running) -> list[str]:
    return [message for _, reason, message in world.kube.events if reason == "StatusOverwritten"]


@pytest.mark.parametrize(
    "forged",
    [
        pytest.param(
            {"stepSeconds": 0.001, "columns": {"step": "3/300", "stepTime": "0.0s"}}, id="same-step"
        ),
        pytest.param({"step": 1, "updatedAt": "2099-01-01T00:00:00Z"}, id="written-in-the-future"),
        pytest.param(
            {"advice": {"setting": "resources.gpus", "value": "1024", "reason": "forged"}}, id="advice"
        ),
        pytest.param({"step": 999, "lastStepTime": "2001-01-01T00:00:00Z"}, id="ahead"),
    ],
)
def test_a_forged_progress_is_replaced_by_the_head_s_reading_at_the_next_read(
    head: tuple[ProgressTracker, int], forged: dict[str, Any]
) -> None:
    tracker, port = head
    world = Running(port, SPEC)
    tracker.enter("VerlStarted")
    stepping(tracker, world, range(1, 4))
    own = world.status().progress
    assert own is not None and own.step == 3
    forge_progress(world, **forged)
    world.passes(1)  # no new step, no time passed: the operator's own progress would not be written again
    progress = world.status().progress
    assert progress == own.changed(updated_at=format_time(world.now))
    (message,) = overwritten(world)
    assert f"status.progress (step {forged.get('step', 3)}" in message
    assert "the head pod's reading is written instead (step 3)" in message
    labels = {"verljob_namespace": NS, "verljob": NAME}
    assert REGISTRY.get_sample_value("verl_operator_job_step", labels) == 3
    writes = world.kube.writes.count(("patch_status", NAME))
    world.passes(2)  # its own again: kept between writes, no second event
    assert world.kube.writes.count(("patch_status", NAME)) == writes and len(overwritten(world)) == 1


@pytest.mark.parametrize("action", ["restart", "fail"])
def test_a_forged_progress_or_stall_never_ends_an_attempt(
    head: tuple[ProgressTracker, int], action: str
) -> None:
    """A progress whose last step is years old, at step 0 of a stepping run, with a Stalled condition: the
    stall is judged on the head's reading alone (its ages on the launcher's clock), which shows a step 30 s
    ago."""
    tracker, port = head
    world = Running(port, {**SPEC, "monitoring": {"stall": {"action": action, "minStepSeconds": 60}}})
    tracker.enter("VerlStarted")
    stepping(tracker, world, range(1, 4))
    pods = sorted(world.kube.pods())
    forge_progress(
        world,
        step=0,
        lastStepTime="2001-01-01T00:00:00Z",
        updatedAt="2001-01-01T00:00:00Z",
        stepSeconds=0.001,
    )
    stalled = {
        "type": "Stalled",
        "status": "True",
        "reason": "NoNewStep",
        "message": "forged",
        "lastTransitionTime": "2001-01-01T00:00:00Z",
    }
    job = world.kube.objects[("VerlJob", NS, NAME)]
    job["status"]["conditions"] = [c for c in job["status"]["conditions"] if c["type"] != "Stalled"] + [
        stalled
    ]
    world.passes(3)
    status = world.status()
    assert (status.phase, status.attempt, status.restarts) == ("Running", 0, 0)
    assert sorted(world.kube.pods()) == pods
    after = status.condition("Stalled")
    assert after is not None and after.status == "False"
    assert status.progress is not None and status.progress.step == 3


def test_a_new_operator_writes_its_own_reading_first(head: tuple[ProgressTracker, int]) -> None:
    """An operator that has written no progress since it started (a restart, a new leader) cannot tell its
    predecessor's progress from a forged one: it writes the head's reading at its first read (no event), and
    removes the progress while the head cannot be read; from then on its own is kept between writes."""
    from verl_operator.controller.reconcile import JobReconciler

    tracker, port = head
    world = Running(port, SPEC)
    tracker.enter("VerlStarted")
    stepping(tracker, world, range(1, 4))
    forge_progress(world, step=2, stepSeconds=0.001)

    def restart(progress: Any) -> None:
        world.reconciler = JobReconciler(
            world.kube, lambda: world.kube.snapshot(world.nodes), lambda: world.now, progress=progress
        )

    restart(lambda job, pods, attempt: ProgressReading(None, "connection refused"))
    world.passes(1)
    status = world.status()
    assert status.progress is None and status.phase == "Running"
    progressing = status.condition("Progressing")
    assert progressing is not None and progressing.reason == "ProgressUnavailable"
    forge_progress(world, step=2, stepSeconds=0.001)
    restart(world.client.read)
    world.passes(1)
    progress = world.status().progress
    assert progress is not None and (progress.step, progress.step_seconds) == (3, 10.0)
    assert overwritten(world) == []
    writes = world.kube.writes.count(("patch_status", NAME))
    world.passes(2)
    assert world.kube.writes.count(("patch_status", NAME)) == writes


@pytest.mark.parametrize(
    ("writer", "readable", "expect"),
    [
        pytest.param("own", True, "kept", id="own-read"),
        pytest.param("own", False, "kept", id="own-unreadable"),
        pytest.param("unknown", True, "read", id="unknown-read"),
        pytest.param("unknown", False, "removed", id="unknown-unreadable"),
        pytest.param("other", True, "read", id="other-read"),
        pytest.param("other", False, "removed", id="other-unreadable"),
    ],
)
def test_who_wrote_the_progress_decides_whether_it_is_kept(
    head: tuple[ProgressTracker, int], writer: ProgressWriter, readable: bool, expect: str
) -> None:
    """The pure decision: only the process's own progress is kept between writes; another is replaced by the
    reading or removed, with a StatusOverwritten Warning when it is known to be someone else's."""
    tracker, port = head
    world = Running(port, SPEC)
    tracker.enter("VerlStarted")
    stepping(tracker, world, range(1, 4))
    forge_progress(world, stepSeconds=0.001)
    job = world.kube.get_job(NS, NAME)
    assert job is not None
    pods = world.kube.job_pods(NS, NAME)
    reading = world.client.read(job, pods, 0) if readable else ProgressReading(None, "connection refused")
    status = parse_status(job["status"])
    seen = Observed(job, status, pods, now=world.now, progress=reading, progress_writer=writer)
    t = decide(seen)
    assert t.status is not None and t.status.phase == "Running" and not t.delete
    progress = t.status.progress
    if expect == "kept":
        assert progress == status.progress
    elif expect == "read":
        assert progress is not None and (progress.step, progress.step_seconds) == (3, 10.0)
    else:
        assert progress is None
    events = [t.event.reason] if t.event is not None else []
    assert events == (["StatusOverwritten"] if writer == "other" else [])


def stalled_world(tracker: ProgressTracker, port: int) -> Running:
    """A job that stepped three times and then no step for an hour, after the pass that found it stalled."""
    world = Running(port, {**SPEC, "monitoring": {"stall": {"minStepSeconds": 30}}})
    tracker.enter("VerlStarted")
    stepping(tracker, world, range(1, 4))
    tracker.last_step -= 3600  # type: ignore[operator]
    world.passes(1)
    return world


def test_a_stalled_job_posts_one_stalled_event_and_keeps_its_message(
    head: tuple[ProgressTracker, int],
) -> None:
    """Through the reconciler: the job's own Stalled condition (reason NoNewStep) is read back as the stall
    in progress at every pass, so the event is posted once and the condition (message, transition time) is
    kept: a stalled job's passes write nothing."""
    world = stalled_world(*head)
    first = world.status().condition("Stalled")
    assert first is not None and (first.status, first.reason) == ("True", "NoNewStep")
    writes = world.kube.writes.count(("patch_status", NAME))
    for _ in range(3):
        world.now += 10
        world.passes(1)
    assert [e[1] for e in world.kube.events].count("Stalled") == 1
    assert world.status().condition("Stalled") == first
    assert world.kube.writes.count(("patch_status", NAME)) == writes  # nothing changed: nothing written


@pytest.mark.parametrize("new_term", [True, False])
def test_a_replica_that_leads_again_takes_the_other_leader_s_progress_for_unknown(
    head: tuple[ProgressTracker, int], new_term: bool
) -> None:
    """Another replica led meanwhile and wrote the progress: a replica that starts a new term (``lead``)
    writes the head's reading at its first read without calling it someone else's; one that did not lose the
    lease knows it is not its own write (the StatusOverwritten Warning)."""
    tracker, port = head
    world = Running(port, SPEC)
    tracker.enter("VerlStarted")
    stepping(tracker, world, range(1, 3))
    forge_progress(world, updatedAt=format_time(world.now + 1))  # the other leader's write of the same step
    if new_term:
        world.reconciler.lead()
    world.passes(1)
    progress = world.status().progress
    assert progress is not None and progress.updated_at == format_time(world.now)
    assert len(overwritten(world)) == (0 if new_term else 1)


def test_a_forged_attempt_reads_the_progress_of_the_attempt_that_runs(
    head: tuple[ProgressTracker, int],
) -> None:
    """``attempt`` and ``placement.attempt`` patched to 5 on a stalled job: the pass that derives the attempt
    again reads the head of attempt 0 (whose pods run), so the stall and its one event stay as they were."""
    world = stalled_world(*head)
    stalled = world.status().condition("Stalled")
    assert stalled is not None and stalled.status == "True"
    status = world.kube.objects[("VerlJob", NS, NAME)]["status"]
    status["attempt"] = 5
    status["placement"]["attempt"] = 5
    world.now += 10
    world.passes(2)
    after = world.status()
    assert (after.attempt, after.phase) == (0, "Running")
    assert after.condition("Stalled") == stalled
    assert after.progress is not None and after.progress.step == 3
    reasons = [e[1] for e in world.kube.events]
    assert reasons.count("Stalled") == 1 and reasons.count("StatusOverwritten") == 1
