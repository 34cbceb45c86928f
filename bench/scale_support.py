"""Pure parts of the scale benchmark: the workload, the equivalent RayClusters, metrics parsing, statistics.

Nothing here touches a cluster or a clock; ``bench/bench_scale.py`` runs it and ``tests/unit`` tests it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_devtools.devcluster.profiles import node_group_like

GPU = "nvidia.com/gpu"
IMAGE = "ghcr.io/example/verl:0.9.1"
#: Nodes per job, cycled: 1, 2, 4, 8 DGX nodes -> 3.75 pods per job on average (200 jobs = 750 pods).
JOB_NODES = (1, 2, 4, 8)
GPUS_PER_NODE = 8
#: Label KubeRay puts on every pod of a RayCluster.
RAY_CLUSTER_LABEL = "ray.io/cluster"
#: Label the verl-operator puts on every pod of a VerlJob.
VERL_JOB_LABEL = "verl-operator.io/job"


@dataclass(frozen=True)
class Scenario:
    """One benchmark size."""

    name: str
    nodes: int
    jobs: int


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("idle-1", nodes=4, jobs=1),
        Scenario("200x1000", nodes=1000, jobs=200),
        Scenario("1000x5000", nodes=5000, jobs=1000),
    )
}


def job_nodes(index: int) -> int:
    """Nodes of the ``index``-th job of the mix."""
    return JOB_NODES[index % len(JOB_NODES)]


def job_name(index: int) -> str:
    """The name of the ``index``-th job (the same for the VerlJob and its RayCluster)."""
    return f"job-{index:04d}"


def scale_profile(nodes: int, rack_size: int = 16, group_size: int = 200) -> dict[str, Any]:
    """A devcluster profile of ``nodes`` DGX H100 nodes (8 GPUs each) in racks of ``rack_size``.

    Profiles cap a node group at 200 nodes, so the nodes come in groups ``sc00``, ``sc01``, ... of
    ``group_size``, each with its own racks.
    """
    groups = []
    for g, start in enumerate(range(0, nodes, group_size)):
        count = min(group_size, nodes - start)
        racks = max(1, math.ceil(count / rack_size))
        groups.append(
            node_group_like(
                "dgx-h100",
                namePrefix=f"sc{g:02d}",
                count=count,
                racks=[f"rack-{g:02d}-{i:02d}" for i in range(racks)],
            )
        )
    return {
        "name": "scale",
        "description": f"{nodes} x DGX H100 for the scale benchmark",
        "nodeGroups": groups,
    }


def verljob(index: int, namespace: str) -> dict[str, Any]:
    """The ``index``-th VerlJob: GRPO on Qwen2.5-7B over ``job_nodes(index)`` whole DGX nodes."""
    nodes = job_nodes(index)
    return {
        "apiVersion": "verl-operator.io/v1alpha1",
        "kind": "VerlJob",
        "metadata": {"name": job_name(index), "namespace": namespace},
        "spec": {
            "verl": {"image": IMAGE, "version": "0.9"},
            "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
            "algorithm": "grpo",
            "data": {"trainBatchSize": 256, "maxPromptLength": 512, "maxResponseLength": 1024},
            "rollout": {"responsesPerPrompt": 8},
            "resources": {
                "gpus": nodes * GPUS_PER_NODE,
                "gpusPerNode": GPUS_PER_NODE,
                "gpuProduct": "NVIDIA-H100-80GB-HBM3",
            },
        },
    }


def invalid_verljob(namespace: str) -> dict[str, Any]:
    """A VerlJob the planner rejects: 100 prompts x 1 response cannot be split over 16 GPUs."""
    job = verljob(1, namespace)
    job["metadata"]["name"] = "invalid-batch"
    job["spec"]["data"]["trainBatchSize"] = 100
    job["spec"]["rollout"]["responsesPerPrompt"] = 1
    return job


def _ray_container(gpus: int) -> dict[str, Any]:
    res = {"cpu": "16", "memory": "64Gi", GPU: str(gpus)}
    return {"name": "ray", "image": IMAGE, "resources": {"requests": dict(res), "limits": dict(res)}}


def raycluster(index: int, namespace: str) -> dict[str, Any]:
    """The RayCluster equivalent to :func:`verljob`: a head and ``nodes - 1`` workers, 8 GPUs per pod."""
    nodes = job_nodes(index)
    spec: dict[str, Any] = {
        "headGroupSpec": {
            "rayStartParams": {},
            "template": {"spec": {"containers": [_ray_container(GPUS_PER_NODE)]}},
        },
        "workerGroupSpecs": [],
    }
    if nodes > 1:
        spec["workerGroupSpecs"].append(
            {
                "groupName": "gpu",
                "replicas": nodes - 1,
                "minReplicas": nodes - 1,
                "maxReplicas": nodes - 1,
                "rayStartParams": {},
                "template": {"spec": {"containers": [_ray_container(GPUS_PER_NODE)]}},
            }
        )
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": job_name(index), "namespace": namespace},
        "spec": spec,
    }


def raycluster_pod_gpus(cluster: Mapping[str, Any]) -> list[int]:
    """GPUs requested by each pod a RayCluster asks for (head first)."""

    def gpus(template: Mapping[str, Any]) -> int:
        return sum(
            int(c.get("resources", {}).get("requests", {}).get(GPU, 0))
            for c in template["spec"]["containers"]
        )

    spec = cluster["spec"]
    out = [gpus(spec["headGroupSpec"]["template"])]
    for group in spec.get("workerGroupSpecs") or []:
        out += [gpus(group["template"])] * int(group["replicas"])
    return out


# ---- API server /metrics --------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>[0-9.eE+-]+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

RequestKey = tuple[str, str]


def request_counts(metrics_text: str) -> dict[RequestKey, float]:
    """``apiserver_request_total`` summed by ``(verb, resource[/subresource])`` from the /metrics text.

    Args:
        metrics_text: The Prometheus exposition text of the API server.

    Returns:
        ``(verb, resource)`` -> count, over every code, group, version, scope and component.
    """
    out: dict[RequestKey, float] = {}
    for line in metrics_text.splitlines():
        match = _SAMPLE.match(line.strip())
        if not match:
            continue
        labels = dict(_LABEL.findall(match.group("labels")))
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        key = (labels.get("verb", ""), resource)
        out[key] = out.get(key, 0.0) + float(match.group("value"))
    return out


def delta(after: Mapping[RequestKey, float], before: Mapping[RequestKey, float]) -> dict[RequestKey, float]:
    """Requests made between two scrapes (keys with no change left out)."""
    keys = set(after) | set(before)
    out = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in keys}
    return {k: v for k, v in sorted(out.items()) if v}


READ_VERBS = frozenset({"GET", "LIST"})
#: Verbs that change an object.
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
#: The objects a verl-operator creates or reports on (a job's status is ``verljobs/status``).
OPERATOR_KINDS = frozenset(
    {
        "verljobs",
        "verljobs/status",
        "pods",
        "configmaps",
        "services",
        "serviceaccounts",
        "events",
        "podgroups",
    }
)


def writes(counts: Mapping[RequestKey, float], resources: Iterable[str]) -> dict[RequestKey, float]:
    """The writes among ``counts`` to the named resources."""
    wanted = set(resources)
    return {(verb, res): v for (verb, res), v in counts.items() if verb in WRITE_VERBS and res in wanted}


#: A frame of py-spy's raw (collapsed) output: ``function (file:line)``; the line is dropped.
_FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


@dataclass(frozen=True)
class ProfileEntry:
    """One function of a sampled profile: the share of samples it was on the stack / on top of it."""

    function: str
    inclusive: float
    own: float


#: Frames on nearly every stack that say nothing of where the time goes: thread and event-loop plumbing.
PLUMBING = ("threading.py", "concurrent/futures/thread.py", "asyncio/", "runpy")


def profile_top(raw: str, top: int = 12, strip: str = "site-packages/") -> tuple[int, list[ProfileEntry]]:
    """The total samples and the ``top`` functions by inclusive share of ``py-spy record --format raw``.

    Each line is ``frame;frame;...;frame count`` (outermost first; the first frame names the thread); a
    function counts once per stack however often it recurses. File paths keep what follows ``strip``; module
    bodies and the frames of ``PLUMBING`` files are left out of the ranking (not of the total).

    Example: ``"t;a (x.py:1);b (y.py:2) 3\nt;a (x.py:1) 1"`` -> 4 samples, ``a (x.py)`` 100% inclusive,
    25% own, ``b (y.py)`` 75% and 75%.
    """
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rstrip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        names = []
        for frame in stack.split(";")[1:]:
            m = _FRAME.match(frame)
            if m is None:
                continue
            path = m["file"]
            path = path.split(strip, 1)[1] if strip and strip in path else path
            if m["name"] == "<module>" or any(part in path for part in PLUMBING):
                continue
            names.append(f"{m['name']} ({path})")
        for name in set(names):
            inclusive[name] = inclusive.get(name, 0) + count
        if names:
            own[names[-1]] = own.get(names[-1], 0) + count
    ranked = sorted(inclusive, key=lambda n: (-inclusive[n], n))[:top]
    entries = [ProfileEntry(n, inclusive[n] / total, own.get(n, 0) / total) for n in ranked] if total else []
    return total, entries


def reads(counts: Mapping[RequestKey, float], resources: Iterable[str]) -> float:
    """GET and LIST requests (not WATCH) of the named resources."""
    wanted = set(resources)
    return sum(v for (verb, res), v in counts.items() if verb in READ_VERBS and res in wanted)


# ---- statistics -----------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


_BUCKET = re.compile(r'^(?P<name>\w+)_bucket\{(?:[^}]*,)?le="(?P<le>[^"]+)"[^}]*\}\s+(?P<value>[0-9.eE+-]+)$')


def histogram_buckets(metrics_text: str, name: str) -> dict[float, float]:
    """Cumulative bucket counts of one Prometheus histogram: upper bound (``le``) -> count."""
    out: dict[float, float] = {}
    for line in metrics_text.splitlines():
        match = _BUCKET.match(line.strip())
        if match and match.group("name") == name:
            out[float(match.group("le"))] = float(match.group("value"))
    return out


def histogram_quantile(buckets: Mapping[float, float], q: float) -> float:
    """The ``q``-quantile (0-1) of a histogram, interpolated linearly inside its bucket (as PromQL does).

    Example: buckets ``{0.001: 10, 0.002: 30, inf: 30}``, q 0.5 -> the 15th of 30 observations lies in
    (0.001, 0.002], a quarter of the way in: 0.00125.
    """
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] == 0:
        return math.nan
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for upper in bounds:
        count = buckets[upper]
        if count >= rank:
            if math.isinf(upper):
                return lower
            inside = count - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 0.0)
        lower, below = upper, count
    return lower


def ratio(ours: float, theirs: float) -> float:
    """``ours / theirs`` (NaN when undefined)."""
    if theirs == 0 or math.isnan(theirs) or math.isnan(ours):
        return math.nan
    return ours / theirs


# ---- jobs reporting steps (bench/bench_progress.py) ----------------------------------------------------

#: Addresses per third octet of :func:`loopback_address` (the fourth octet runs 1-254).
_PER_BLOCK = 254
#: The timer names of verl's step lines: seconds, scaled together so the step takes the time asked for.
_TIMING = re.compile(
    r"(timing_s/(?!agent_loop/(?:slowest/)?(?:prompt_length|response_length|num_preempted))[\w/]+):([0-9.e+-]+)"
)
_STEP_SECONDS = re.compile(r"timing_s/step:([0-9.e+-]+)")


def loopback_address(index: int) -> str:
    """A distinct loopback address for the ``index``-th job's head pod: ``127.1.0.1``, ``127.1.0.2``, ...

    Linux routes all of 127.0.0.0/8 to the loopback device, so a server bound to ``0.0.0.0`` answers each of
    them and tells them apart by the address a connection arrived on. 127.0.0.x is left to other programs.

    Example: 0 -> ``127.1.0.1``, 253 -> ``127.1.0.254``, 254 -> ``127.1.1.1``.
    """
    if not 0 <= index < _PER_BLOCK * 256:
        raise ValueError(f"no loopback address for job {index}")
    return f"127.1.{index // _PER_BLOCK}.{index % _PER_BLOCK + 1}"


def job_of_address(address: str) -> int | None:
    """The job index :func:`loopback_address` gave ``address`` (None for any other address)."""
    parts = address.split(".")
    if len(parts) != 4 or parts[:2] != ["127", "1"] or not all(p.isdigit() for p in parts[2:]):
        return None
    block, host = int(parts[2]), int(parts[3])
    if block > 255 or not 1 <= host <= _PER_BLOCK:
        return None
    return block * _PER_BLOCK + host - 1


def step_line(published: str, step: int, seconds: float) -> str:
    """verl's console step line (``published``: one step as printed, its metrics on continuation lines) with
    its step number set and every ``timing_s/*`` seconds scaled so that ``timing_s/step`` is ``seconds``: the
    phases keep their shares of the step. The line is joined as Ray's log prefix carries it.

    Example: the published gsm8k step (``timing_s/step:93.52``, ``timing_s/gen:24.53``) at 10 s ->
    ``step:7 ... timing_s/gen:2.623... timing_s/step:10.0``.
    """
    lines = [part.strip() for part in published.strip().splitlines()]
    head, body = lines[0], " ".join(lines[1:])
    found = _STEP_SECONDS.search(body)
    if found is None or float(found.group(1)) <= 0:
        raise ValueError("the published step has no timing_s/step")
    factor = seconds / float(found.group(1))
    body = _TIMING.sub(lambda m: f"{m.group(1)}:{float(m.group(2)) * factor!r}", body)
    prefix = head.split("step:", 1)[0]
    return f"{prefix}step:{step} {body}"


def per_job_per_interval(count: float, jobs: int, seconds: float, interval: float = 30.0) -> float:
    """``count`` events over ``jobs`` jobs in ``seconds``, as events per job per ``interval`` seconds.

    Example: 400 status writes of 200 jobs in 300 s -> 0.2 per job per 30 s.
    """
    if jobs <= 0 or seconds <= 0:
        return math.nan
    return count / jobs / (seconds / interval)
