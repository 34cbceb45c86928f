"""The reconciler against an in-memory API server: one row per phase change and condition.

Each row sets a job up (a spec, earlier passes, what the pods did meanwhile), runs one more reconcile pass
and checks what that pass wrote: phase and reason, conditions, the events it posted, the objects that exist
afterwards. The decisions are pure (``controller.decide``); the rows go through ``JobReconciler`` so that
applying a transition is covered too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import make_nodes
from fakekube import FakeKube

from verl_operator.api.status import PHASES, VerlJobStatus, parse_status
from verl_operator.controller.decide import decide
from verl_operator.controller.observed import Observed
from verl_operator.controller.reconcile import JobReconciler
from verl_operator.controller.status import format_time

NS, NAME, UID = "team", "j", "uid-j"
T0 = 1_800_000_000.0
SPEC: dict[str, Any] = {
    "verl": {"image": "example.com/verl:0.9.1"},
    "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
    "resources": {"gpus": 16},
}
HEAD, WORKER = f"{NAME}-r0-head", f"{NAME}-r0-worker-1"


@dataclass
class World:
    """A fake API server with two 8-GPU nodes, a clock and the reconciler."""

    kube: FakeKube = field(default_factory=FakeKube)
    nodes: list[dict[str, Any]] = field(default_factory=lambda: make_nodes(2, 8))
    now: float = T0
    reconciler: JobReconciler = field(init=False)

    def __post_init__(self) -> None:
        self.reconciler = JobReconciler(self.kube, lambda: self.kube.snapshot(self.nodes), lambda: self.now)

    def submit(self, spec: dict[str, Any], **meta: Any) -> None:
        self.kube.add(
            {
                "apiVersion": "verl-operator.io/v1alpha1",
                "kind": "VerlJob",
                "metadata": {
                    "name": NAME,
                    "namespace": NS,
                    "uid": UID,
                    "generation": 1,
                    "creationTimestamp": format_time(T0),
                    **meta,
                },
                "spec": spec,
            }
        )

    def job(self) -> dict[str, Any] | None:
        return self.kube.get_job(NS, NAME)

    def status(self) -> dict[str, Any]:
        job = self.job()
        return dict((job or {}).get("status") or {})

    def reconcile(self) -> None:
        self.reconciler.reconcile(NS, NAME)


Step = Callable[[World], None]


def passes(n: int) -> Step:
    def step(w: World) -> None:
        for _ in range(n):
            w.reconcile()

    return step


def pods_are(phase: str, *names: str, exit_code: int | None = None, message: str | None = None) -> Step:
    """The kubelet's part: the named pods (all when none named) bound to a node and in ``phase``."""

    def step(w: World) -> None:
        for index, (name, pod) in enumerate(sorted(w.kube.pods().items())):
            if names and name not in names:
                continue
            pod["spec"]["nodeName"] = w.nodes[index % len(w.nodes)]["metadata"]["name"]
            pod["status"] = {"phase": phase}
            if exit_code is not None:
                term: dict[str, Any] = {"exitCode": exit_code}
                if message is not None:
                    term["message"] = message
                pod["status"]["containerStatuses"] = [{"name": "ray", "state": {"terminated": term}}]

    return step


def pod_vanishes(name: str) -> Step:
    def step(w: World) -> None:
        w.kube.objects.pop(("Pod", NS, name))

    return step


def spec_becomes(spec: dict[str, Any]) -> Step:
    def step(w: World) -> None:
        job = w.kube.objects[("VerlJob", NS, NAME)]
        job["spec"] = spec
        job["metadata"]["generation"] += 1

    return step


def later(seconds: float) -> Step:
    def step(w: World) -> None:
        w.now += seconds

    return step


def busy_node(gpus: int) -> Step:
    """Another workload holds ``gpus`` GPUs on the first node."""

    def step(w: World) -> None:
        node = w.nodes[0]["metadata"]["name"]
        w.kube.add(
            {
                "kind": "Pod",
                "metadata": {"name": "other", "namespace": "default", "uid": "o"},
                "spec": {
                    "nodeName": node,
                    "containers": [{"resources": {"requests": {"nvidia.com/gpu": gpus}}}],
                },
                "status": {"phase": "Running"},
            }
        )

    return step


def waiting_ahead(name: str, spec: dict[str, Any], age: float = 60.0) -> Step:
    """Another job, created ``age`` seconds before the job under test, is submitted and reconciled once."""

    def step(w: World) -> None:
        meta = {"name": name, "namespace": NS, "uid": f"uid-{name}", "generation": 1}
        w.kube.add(
            {
                "apiVersion": "verl-operator.io/v1alpha1",
                "kind": "VerlJob",
                "metadata": {**meta, "creationTimestamp": format_time(T0 - age)},
                "spec": spec,
            }
        )
        w.reconciler.reconcile(NS, name)

    return step


def node_deleted(name: str) -> Step:
    """``kubectl delete node``: the node watch no longer shows it (its pods are still there)."""

    def step(w: World) -> None:
        w.nodes = [n for n in w.nodes if n["metadata"]["name"] != name]

    return step


def node_not_ready(name: str) -> Step:
    """The node's kubelet stops reporting: its Ready condition turns Unknown."""

    def step(w: World) -> None:
        for node in w.nodes:
            if node["metadata"]["name"] == name:
                node.setdefault("status", {})["conditions"] = [{"type": "Ready", "status": "Unknown"}]

    return step


def priority_classes(**values: int) -> Step:
    def step(w: World) -> None:
        w.kube.priority_classes.update(values)

    return step


def with_spec(**sections: Any) -> dict[str, Any]:
    return {**SPEC, **sections}


RUNNING = [passes(2), pods_are("Running")]


@dataclass(frozen=True)
class Expect:
    """What the pass under test leaves: phase/reason, conditions ``type -> (status, reason)``, events it
    posted (reasons), and the children that exist afterwards (``Kind/name``; None: not checked)."""

    phase: str | None
    reason: str | None = None
    conditions: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    events: tuple[str, ...] = ()
    children: tuple[str, ...] | None = None
    status: dict[str, Any] = field(default_factory=dict)


KEPT = (f"ConfigMap/{NAME}-launch", f"Service/{NAME}-ray", f"ServiceAccount/{NAME}-ray")
CHILDREN = tuple(sorted((*KEPT, f"Pod/{HEAD}", f"Pod/{WORKER}")))

ROWS = [
    pytest.param(
        SPEC,
        [],
        Expect(
            "Starting",
            "Placed",
            {
                "Valid": ("True", "Planned"),
                "Planned": ("True", "Planned"),
                "Placed": ("True", "Placed"),
                "Ready": ("False", "Placed"),
                "Reconciling": ("True", "Placed"),
                "Stalled": ("False", "Starting"),
            },
            events=("Placed",),
            children=(),
            status={"nodes": "gpu-0,gpu-1", "mesh": "dp16 sp1 tp1", "attempt": 0},
        ),
        id="new-job-is-placed-before-any-pod",
    ),
    pytest.param(
        SPEC,
        [passes(1)],
        Expect(
            "Starting",
            "PodsCreated",
            {"Placed": ("True", "Placed")},
            events=("PodsCreated",),
            children=CHILDREN,
            status={"placement": {"ungated": True}},
        ),
        id="placed-job-gets-every-child-released-together",
    ),
    pytest.param(
        SPEC,
        [passes(2), pods_are("Running", HEAD)],
        Expect(
            "Starting", "PodsStarting", {"Ready": ("False", "PodsStarting")}, events=(), children=CHILDREN
        ),
        id="one-of-two-running-is-starting",
    ),
    pytest.param(
        SPEC,
        RUNNING,
        Expect(
            "Running",
            "AllPodsRunning",
            {
                "Ready": ("True", "AllPodsRunning"),
                "Reconciling": ("False", "Running"),
                "Stalled": ("False", "Running"),
            },
            events=("Running",),
            children=CHILDREN,
        ),
        id="all-running-ready-names-pods-and-nodes",
    ),
    pytest.param(
        SPEC,
        [*RUNNING, pods_are("Succeeded", HEAD, exit_code=0)],
        Expect(
            "Succeeded",
            "Succeeded",
            {"Complete": ("True", "Succeeded"), "Ready": ("True", "Succeeded")},
            events=("Succeeded",),
            children=tuple(sorted((*KEPT, f"Pod/{HEAD}"))),
        ),
        id="head-exit-0-succeeds-and-stops-the-workers",
    ),
    pytest.param(
        with_spec(backoffLimit=1),
        [*RUNNING, pods_are("Failed", WORKER, exit_code=11)],
        Expect(
            "Pending",
            "Restarting",
            {"Placed": ("False", "Restarting"), "Reconciling": ("True", "Restarting")},
            events=("Restarting",),
            children=KEPT,
            status={"attempt": 1, "restarts": 1},
        ),
        id="worker-lost-restarts-the-whole-cluster",
    ),
    pytest.param(
        with_spec(backoffLimit=1),
        [
            *RUNNING,
            pods_are("Failed", WORKER, exit_code=11),
            passes(3),
            pods_are("Running"),
            pods_are("Failed", f"{NAME}-r1-worker-1", exit_code=11),
        ],
        Expect(
            "Failed",
            "BackoffLimitExceeded",
            {"Failed": ("True", "BackoffLimitExceeded"), "Stalled": ("True", "BackoffLimitExceeded")},
            events=("BackoffLimitExceeded",),
            status={"restarts": 1},
        ),
        id="second-failure-exceeds-the-backoff-limit",
    ),
    pytest.param(
        with_spec(backoffLimit=3),
        [*RUNNING, pods_are("Failed", WORKER, exit_code=12)],
        Expect(
            "Failed",
            "TopologyMismatch",
            {"Failed": ("True", "TopologyMismatch")},
            events=("TopologyMismatch",),
            status={"restarts": 0},
        ),
        id="topology-mismatch-is-not-retried",
    ),
    pytest.param(
        with_spec(backoffLimit=1),
        [*RUNNING, pod_vanishes(WORKER)],
        Expect("Pending", "Restarting", {"Placed": ("False", "Restarting")}, events=("Restarting",)),
        id="lost-pod-restarts",
    ),
    pytest.param(
        with_spec(activeDeadlineSeconds=60),
        [*RUNNING, later(61)],
        Expect(
            "Failed",
            "DeadlineExceeded",
            {"Failed": ("True", "DeadlineExceeded")},
            events=("DeadlineExceeded",),
        ),
        id="deadline-fails-the-job",
    ),
    pytest.param(
        with_spec(data={"trainBatchSize": 7}),
        [],
        Expect(
            "Invalid",
            "PlanInfeasible",
            {
                "Valid": ("False", "PlanInfeasible"),
                "Planned": ("False", "PlanInfeasible"),
                "Stalled": ("True", "PlanInfeasible"),
            },
            events=("PlanInfeasible",),
            children=(),
        ),
        id="infeasible-spec-is-invalid-with-violations",
    ),
    pytest.param(
        with_spec(resources={"gpus": 0}),
        [],
        Expect(
            "Invalid",
            "InvalidSpec",
            {"Valid": ("False", "InvalidSpec")},
            events=("InvalidSpec",),
            children=(),
        ),
        id="schema-error-is-invalid-spec",
    ),
    pytest.param(
        SPEC,
        [*RUNNING, passes(1), spec_becomes(with_spec(resources={"gpus": 0}))],
        Expect(
            "Running",
            "AllPodsRunning",
            {"Valid": ("False", "InvalidSpec"), "Ready": ("True", "AllPodsRunning")},
            events=(),
            children=CHILDREN,
        ),
        id="invalid-update-keeps-the-pods",
    ),
    pytest.param(
        SPEC,
        [busy_node(4)],
        Expect(
            "Pending",
            "InsufficientCapacity",
            {"Placed": ("False", "InsufficientCapacity"), "Valid": ("True", "Planned")},
            events=("WaitingForCapacity",),
            children=("Pod/other",),
        ),
        id="busy-node-waits-for-capacity",
    ),
    pytest.param(
        with_spec(scheduling={"queueName": "rl"}),
        [],
        Expect(
            "Starting",
            "HandedOff",
            {"Placed": ("Unknown", "HandedOff")},
            events=("HandedOff",),
            children=(),
            status={"placement": {"handoff": "Kueue", "nodes": []}},
        ),
        id="kueue-job-is-handed-off",
    ),
    pytest.param(
        with_spec(scheduling={"scheduler": "volcano"}),
        [passes(1)],
        Expect("Pending", "SchedulerUnavailable", {}, events=("SchedulerUnavailable",)),
        id="volcano-without-podgroups-says-so",
    ),
    pytest.param(
        SPEC,
        [*RUNNING, spec_becomes(with_spec(suspend=True))],
        Expect(
            "Suspended",
            "Suspended",
            {
                "Placed": ("False", "Suspended"),
                "Ready": ("False", "Suspended"),
                "Reconciling": ("False", "Suspended"),
            },
            events=("Suspended",),
            children=KEPT,
            status={"attempt": 1},
        ),
        id="suspend-deletes-pods-next-attempt",
    ),
    pytest.param(
        SPEC,
        [*RUNNING, spec_becomes(with_spec(suspend=True)), passes(1), spec_becomes(SPEC)],
        Expect(
            "Starting",
            "Placed",
            {"Placed": ("True", "Placed")},
            events=("Placed",),
            status={"attempt": 1, "placement": {"attempt": 1}},
        ),
        id="resume-places-the-next-attempt",
    ),
    pytest.param(
        with_spec(backoffLimit=3),
        [*RUNNING, passes(1), node_deleted("gpu-1")],
        Expect(
            "Pending",
            "Restarting",
            {"Placed": ("False", "Restarting"), "Ready": ("False", "Restarting")},
            events=("Restarting",),
            children=KEPT,
            status={
                "attempt": 1,
                "restarts": 1,
                "message": f"node gpu-1 of pod {WORKER} was deleted; restarting the whole Ray cluster "
                "(restart 1 of 3)",
            },
        ),
        id="deleted-node-restarts-the-job-at-once",
    ),
    pytest.param(
        with_spec(backoffLimit=3),
        [passes(1), node_deleted("gpu-0")],
        Expect("Pending", "Restarting", {"Placed": ("False", "Restarting")}, events=("Restarting",)),
        id="deleted-node-before-the-pods-exist-restarts-the-job",
    ),
    pytest.param(
        with_spec(backoffLimit=0),
        [*RUNNING, passes(1), node_deleted("gpu-1")],
        Expect(
            "Failed",
            "NodeLost",
            {"Failed": ("True", "NodeLost"), "Stalled": ("True", "NodeLost")},
            events=("NodeLost",),
            children=KEPT,
        ),
        id="deleted-node-without-restarts-left-fails-the-job",
    ),
    pytest.param(
        SPEC,
        [*RUNNING, passes(1), node_not_ready("gpu-1")],
        Expect(
            "Running",
            "NodeNotReady",
            {"Ready": ("False", "NodeNotReady")},
            events=("NodeNotReady",),
            children=CHILDREN,
            status={
                "message": f"node gpu-1 of pod {WORKER} is NotReady; the pods are kept until it returns "
                "or is deleted"
            },
        ),
        id="notready-node-is-named-and-the-pods-kept",
    ),
    pytest.param(
        with_spec(resources={"gpus": 8}),
        [busy_node(4), waiting_ahead("big", SPEC)],
        Expect(
            "Pending",
            "Queued",
            {"Valid": ("True", "Planned"), "Placed": ("False", "Queued"), "Reconciling": ("True", "Queued")},
            events=("Queued",),
            children=("Pod/other",),
            status={
                "message": f"queued behind {NS}/big: the free GPUs this job fits on are kept for jobs "
                "ahead of it in the queue (priority, then creation time)"
            },
        ),
        id="small-job-behind-a-waiting-large-one-is-queued",
    ),
    pytest.param(
        with_spec(resources={"gpus": 8}),
        [busy_node(4), waiting_ahead("big", SPEC, age=-60.0)],
        Expect("Starting", "Placed", {"Placed": ("True", "Placed")}, events=("Placed",)),
        id="small-job-ahead-of-a-later-large-one-is-placed",
    ),
    pytest.param(
        with_spec(resources={"gpus": 8}, scheduling={"priorityClassName": "high"}),
        [priority_classes(high=1000), busy_node(4), waiting_ahead("big", SPEC)],
        Expect("Starting", "Placed", {"Placed": ("True", "Placed")}, events=("Placed",)),
        id="higher-priority-job-goes-before-an-older-one",
    ),
    pytest.param(
        with_spec(resources={"gpus": 8}),
        [
            busy_node(4),
            waiting_ahead("big", with_spec(scheduling={"priorityClassName": "low"})),
            priority_classes(low=-5),
        ],
        Expect("Starting", "Placed", {"Placed": ("True", "Placed")}, events=("Placed",)),
        id="lower-priority-job-does-not-hold-the-queue",
    ),
]


def conditions_of(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status.get("conditions") or []}


def contains(actual: Any, expected: Any) -> bool:
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(contains(actual.get(k), v) for k, v in expected.items())
    return bool(actual == expected)


@pytest.mark.parametrize(("spec", "steps", "expect"), ROWS)
def test_one_pass(spec: dict[str, Any], steps: list[Step], expect: Expect) -> None:
    world = World()
    world.submit(spec)
    for step in steps:
        step(world)
    before = len(world.kube.events)
    world.reconcile()
    status = world.status()
    assert (status.get("phase"), status.get("reason")) == (expect.phase, expect.reason), status.get("message")
    conds = conditions_of(status)
    for ctype, (cstatus, reason) in expect.conditions.items():
        assert ctype in conds, f"no {ctype} condition: {conds}"
        assert conds[ctype][0] == cstatus and (reason is None or conds[ctype][1] == reason), (
            ctype,
            conds[ctype],
        )
    assert tuple(e[1] for e in world.kube.events[before:]) == expect.events
    if expect.children is not None:
        assert tuple(world.kube.kinds()) == expect.children
    typed = VerlJobStatus.model_validate(status)  # what the operator wrote parses strictly, nothing dropped
    assert contains(typed.to_wire(), expect.status), status


def test_ready_condition_names_every_pod_and_its_node() -> None:
    """The Ready condition of a running job is the detailed one, not the phase summary written after it."""
    world = World()
    world.submit(SPEC)
    for step in RUNNING:
        step(world)
    world.reconcile()
    ready = {c["type"]: c for c in world.status()["conditions"]}["Ready"]
    assert ready["message"] == f"{HEAD}@gpu-0, {WORKER}@gpu-1"


def test_a_steady_state_writes_nothing() -> None:
    world = World()
    world.submit(SPEC)
    for step in RUNNING:
        step(world)
    world.reconcile()
    writes, events = len(world.kube.writes), len(world.kube.events)
    world.reconcile()
    world.reconcile()
    assert world.kube.writes[writes:] == [] and world.kube.events[events:] == []


def test_every_phase_is_reached_by_a_row() -> None:
    reached = {row.values[2].phase for row in ROWS}
    assert reached == set(PHASES)


def test_the_launch_spec_expects_the_plan_node_pool_also_for_kueue() -> None:
    world = World()
    world.submit(with_spec(scheduling={"queueName": "rl"}))
    passes(2)(world)
    launch = json.loads(world.kube.objects[("ConfigMap", NS, f"{NAME}-launch")]["data"]["launch.json"])
    assert launch["expect"]["gpuProduct"] == "NVIDIA-H100-80GB-HBM3"
    assert launch["expect"]["gpuMemoryMiB"] == 81559
    pods = world.kube.pods()
    assert set(pods) == {HEAD, WORKER}
    assert all("schedulingGates" not in p["spec"] for p in pods.values()), "Kueue gates the pods itself"


def test_the_launch_spec_does_not_follow_the_live_nodes() -> None:
    world = World()
    world.submit(SPEC)
    passes(2)(world)
    before = world.kube.objects[("ConfigMap", NS, f"{NAME}-launch")]["data"]
    world.nodes = world.nodes[1:]  # the head's node leaves the index
    world.reconcile()
    assert world.kube.objects[("ConfigMap", NS, f"{NAME}-launch")]["data"] == before


def test_finished_job_is_deleted_after_its_ttl() -> None:
    world = World()
    world.submit(with_spec(ttlSecondsAfterFinished=30))
    for step in [*RUNNING, pods_are("Succeeded", HEAD, exit_code=0), passes(1), later(29), passes(1)]:
        step(world)
    assert world.job() is not None
    later(1)(world)
    world.reconcile()
    assert world.job() is None and world.kube.events[-1][1] == "Deleted"


def test_pods_of_a_deleted_job_are_released_unless_orphaned() -> None:
    world = World()
    world.submit(SPEC)
    passes(2)(world)
    orphan = world.kube.objects[("Pod", NS, WORKER)]
    orphan["metadata"]["ownerReferences"] = []
    world.kube.objects.pop(("VerlJob", NS, NAME))
    world.reconcile()
    assert set(world.kube.pods()) == {WORKER}


def test_a_job_being_deleted_is_left_alone() -> None:
    world = World()
    world.submit(SPEC, deletionTimestamp=format_time(T0))
    world.reconcile()
    assert world.kube.writes == [] and world.status() == {}


def test_decide_is_pure_and_deterministic() -> None:
    """The same observation gives the same whole transition, and decide leaves what it read as it was (it
    has no API to write to: a decision that changed its input would be a write the reconciler never makes)."""
    world = World()
    world.submit(SPEC)
    passes(2)(world)  # placed, pods created: the next decision reads the pods and the snapshot
    pods_are("Running")(world)
    job = world.job()
    assert job is not None
    pods = world.kube.job_pods(NS, NAME)
    seen = Observed(job, parse_status(job["status"]), pods, world.kube.snapshot(world.nodes), (), T0 + 5)
    before = json.dumps([job, pods], sort_keys=True)
    first, second = decide(seen), decide(seen)
    assert first == second
    assert first.status is not None and first.status.phase == "Running"
    assert json.dumps([seen.job, seen.pods], sort_keys=True) == before


def test_gpus_of_a_job_placed_before_a_restart_are_not_given_to_another() -> None:
    """A job placed on both nodes whose pods were not created yet (the operator restarted in between) holds
    their GPUs through its status alone: the snapshot's reservations, read from the status by the watch
    cache, keep a second job of 16 GPUs waiting."""
    world = World()
    world.kube.add(
        {
            "apiVersion": "verl-operator.io/v1alpha1",
            "kind": "VerlJob",
            "metadata": {"name": "first", "namespace": NS, "uid": "uid-first", "generation": 1},
            "spec": SPEC,
            "status": {
                "phase": "Starting",
                "reason": "Placed",
                "placement": {
                    "attempt": 0,
                    "nodes": [n["metadata"]["name"] for n in world.nodes],
                    "gpusPerNode": 8,
                },
            },
        }
    )
    world.submit(SPEC)
    world.reconcile()
    assert (world.status().get("phase"), world.status().get("reason")) == ("Pending", "InsufficientCapacity")
    assert world.kube.pods() == {}


def test_the_creating_pass_posts_each_child_once_and_reads_nothing() -> None:
    """The pass's second decision (after the pods exist) names the children again: none is posted twice (a
    409) and the ConfigMap the pass just created is not read back."""
    world = World()
    world.submit(SPEC)
    passes(2)(world)
    children = [
        "ServiceAccount/j-ray",
        "ConfigMap/j-launch",
        "Service/j-ray",
        f"Pod/{HEAD}",
        f"Pod/{WORKER}",
    ]
    assert sorted(world.kube.requests) == sorted(("create", c) for c in children), world.kube.requests
    assert [w for w in world.kube.writes if w[0] == "ungate"] == [("ungate", HEAD), ("ungate", WORKER)]


def test_a_pass_that_finds_a_child_ensures_it_and_keeps_the_launch_spec_in_step() -> None:
    """After an operator restart mid-creation the ConfigMap exists: one create (409) and one read, and a
    launch spec that differs is written back; children created by nobody yet are created."""
    world = World()
    world.submit(SPEC)
    passes(2)(world)
    cm = world.kube.objects[("ConfigMap", NS, f"{NAME}-launch")]
    wanted = dict(cm["data"])
    cm["data"] = {"launch.json": "{}"}
    world.kube.objects.pop(("Service", NS, f"{NAME}-ray"))
    for pod in (HEAD, WORKER):  # the pods of a crashed creation: gone again, the gang not released
        world.kube.objects.pop(("Pod", NS, pod))
    job = world.kube.objects[("VerlJob", NS, NAME)]
    job["status"]["placement"].pop("ungated", None)
    world.kube.requests.clear()
    world.reconcile()
    assert world.kube.requests.count(("create", f"ConfigMap/{NAME}-launch")) == 1
    assert world.kube.requests.count(("read_configmap", f"{NAME}-launch")) == 1
    assert world.kube.objects[("ConfigMap", NS, f"{NAME}-launch")]["data"] == wanted
    assert ("Service", NS, f"{NAME}-ray") in world.kube.objects


def test_pods_created_and_released_at_once_end_as_one_after_the_other() -> None:
    """With threads for the pass's calls, the pods are created and released at once: the same objects, writes
    and status as one after the other, and still only once every pod exists."""
    from concurrent.futures import ThreadPoolExecutor

    one, many = World(), World()
    with ThreadPoolExecutor(max_workers=4) as calls:
        many.reconciler.calls = calls
        for world in (one, many):
            world.submit(with_spec(resources={"gpus": 32}))
            world.nodes = make_nodes(4, 8)
            world.reconcile()  # placed
            world.reconcile()  # children created, then the gang released
    assert many.kube.kinds() == one.kube.kinds() and len(many.kube.pods()) == 4
    assert sorted(many.kube.writes) == sorted(one.kube.writes)
    assert many.status() == one.status() and many.status()["reason"] == "PodsCreated"
    ungates = [i for i, w in enumerate(many.kube.writes) if w[0] == "ungate"]
    pod_creates = [i for i, w in enumerate(many.kube.writes) if w[0] == "create" and w[1].startswith("Pod/")]
    assert len(ungates) == 4 and max(pod_creates) < min(ungates), "released only once all exist"


def test_a_pod_refused_among_pods_created_at_once_makes_the_job_invalid() -> None:
    from concurrent.futures import ThreadPoolExecutor

    world = World()
    world.kube.refuse_pods = 'pods "j-r0-head" is forbidden: violates PodSecurity'
    world.submit(SPEC)
    with ThreadPoolExecutor(max_workers=4) as calls:
        world.reconciler.calls = calls
        passes(2)(world)
    assert (world.status()["phase"], world.status()["reason"]) == ("Invalid", "PodsRefused")
    assert world.kube.pods() == {} and not [w for w in world.kube.writes if w[0] == "ungate"]
