"""Scale benchmark: the verl-operator and KubeRay's operator on the same devcluster (prints tables, draws plots).

Run: ``.venv/bin/python bench/bench_scale.py [--scenario idle-1 --scenario 200x1000 ...]`` (``make bench``).

For each scenario a devcluster instance ``bench-scale`` gets N simulated 8-GPU DGX H100 nodes; then, one after
the other on the same API server, each operator runs out of cluster against it: the verl-operator
(``verl-operator run`` with its validating webhook) applies M VerlJobs of 1, 2, 4 and 8 nodes (cycled), KubeRay
the equivalent RayClusters (a head and ``nodes - 1`` workers, 8 GPUs per pod: the same pod count and GPU
requests). Reported per operator:

* admission latency (the create call, p50/p99), CR -> all pods Running (p50/p99 per job, and for the batch);
* operator CPU seconds and RSS (``/proc``) while the batch is created and over ``--steady-seconds`` of steady
  state (everything Running, nothing changing);
* API requests by verb and resource (deltas of the API server's ``apiserver_request_total``), and the reads
  (GET/LIST) of the job kind and pods per job per minute in steady state, after subtracting the same
  window measured with no operator running (kwok, the scheduler and the controller-manager);
* time to reject an invalid spec (the verl-operator's webhook; KubeRay has no such check).

KubeRay is built from its Go module (``github.com/ray-project/kuberay/ray-operator``) into the binaries cache
on first use. Results go to ``--json`` and the plots to ``--plots`` (default ``docs/benchmarks/``).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scale_support as S
from verl_devtools.devcluster import DevCluster
from verl_devtools.devcluster.kuberay import KubeRayOperator, ensure_kuberay, install_crds
from verl_devtools.devcluster.localrun import LocalOperator, install_crd

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")


# ---- measuring a process -------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid: int) -> float:
    """Resident set size in MB (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


class Sampler:
    """Samples a process's CPU seconds and RSS every ``interval`` seconds in a thread."""

    def __init__(self, pid: int, interval: float = 1.0) -> None:
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, float, float]] = []  # (monotonic, cpu s, rss MB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.samples.append((time.monotonic(), cpu_seconds(self.pid), rss_mb(self.pid)))
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def peak_rss(self, start: float, end: float) -> float:
        values = [r for t, _, r in self.samples if start <= t <= end]
        return max(values) if values else 0.0


# ---- the API server ------------------------------------------------------------------------------------


def scrape(api: client.ApiClient) -> dict[S.RequestKey, float]:
    """``apiserver_request_total`` by (verb, resource) now."""
    rsp = api.rest_client.request(
        "GET", f"{api.configuration.host}/metrics", headers={"Accept": "text/plain"}
    )
    return S.request_counts(rsp.read().decode())


class PodWatch:
    """Records when each pod of the namespace is first seen Running, grouped by a job label."""

    def __init__(self, api: client.ApiClient, namespace: str, label: str) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace, self.label = namespace, label
        self.running: dict[str, dict[str, float]] = {}  # job -> pod -> first time Running
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _record(self, pod: Any) -> None:
        job = (pod.metadata.labels or {}).get(self.label)
        if job and pod.status and pod.status.phase == "Running":
            with self.lock:
                self.running.setdefault(job, {}).setdefault(pod.metadata.name, time.monotonic())

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    listed = self.core.list_namespaced_pod(self.namespace)
                    for pod in listed.items:
                        self._record(pod)
                    version = listed.metadata.resource_version
                stream = watch.Watch().stream(
                    self.core.list_namespaced_pod,
                    self.namespace,
                    resource_version=version,
                    timeout_seconds=30,
                    allow_watch_bookmarks=True,
                )
                for event in stream:
                    obj = event["object"]
                    version = obj.metadata.resource_version or version
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._record(obj)
                    if self._stop.is_set():
                        break
            except ApiException as exc:
                if exc.status == 410:
                    version = ""  # too old: list again
                else:
                    time.sleep(0.5)
            except Exception:  # a dropped connection: watch again from the last version
                time.sleep(0.2)

    def all_running(self, job: str, pods: int) -> float | None:
        """When the job's ``pods``-th pod became Running (None: not yet)."""
        with self.lock:
            seen = self.running.get(job, {})
            return max(seen.values()) if len(seen) >= pods else None

    def __enter__(self) -> PodWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()


# ---- one run -------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    """What one operator did in one scenario."""

    operator: str
    jobs: int
    pods: int
    admission_ms: list[float] = field(default_factory=list)
    running_s: list[float] = field(default_factory=list)
    not_running: int = 0
    batch_s: float = math.nan
    create_cpu_s: float = math.nan
    create_peak_rss_mb: float = math.nan
    steady_cpu_s: float = math.nan
    steady_seconds: float = math.nan
    steady_rss_mb: float = math.nan
    steady_cpu_series: list[float] = field(default_factory=list)
    create_requests: dict[str, float] = field(default_factory=dict)
    steady_requests: dict[str, float] = field(default_factory=dict)
    steady_reads_per_job_min: float = math.nan
    rejection_ms: float | None = None
    rejection_message: str = ""
    operator_metrics: dict[str, float] = field(default_factory=dict)
    #: The verl-operator stopped and started again with every job Running: seconds from the start to its
    #: health endpoint, to every job reconciled once with nothing queued, and the writes to the objects the
    #: operator owns or reports on over that time and ``RESTART_QUIET_SECONDS`` after it.
    restart_up_s: float = math.nan
    restart_caught_up_s: float = math.nan
    restart_rss_mb: float = math.nan
    restart_writes: dict[str, float] = field(default_factory=dict)
    restart_window_s: float = math.nan
    #: py-spy's samples of the verl-operator holding the GIL from its first create to its last pod Running,
    #: and the functions most often on those stacks (``--profile``).
    profile_samples: int = 0
    profile: list[S.ProfileEntry] = field(default_factory=list)


def _keyed(counts: dict[S.RequestKey, float]) -> dict[str, float]:
    return {f"{verb} {res}": v for (verb, res), v in counts.items()}


def _wait_pods_gone(core: client.CoreV1Api, namespace: str, timeout: float) -> None:
    """Wait until the namespace has no pod left (their GPUs are free for the next run)."""
    deadline = time.monotonic() + timeout
    left = -1
    while time.monotonic() < deadline:
        left = len(core.list_namespaced_pod(namespace, limit=1).items)
        if not left:
            return
        time.sleep(1.0)
    raise TimeoutError(f"pods of namespace {namespace} still there after {timeout:.0f}s")


def _operator_metrics(text: str) -> dict[str, float]:
    """A few of the verl-operator's own metrics (reconciles, planning and placement time) from /metrics."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        for name in (
            "verl_operator_reconciles_total",
            "verl_operator_queue_depth",
            "verl_operator_planning_seconds_sum",
            "verl_operator_planning_seconds_count",
            "verl_operator_plan_and_place_seconds_sum",
            "verl_operator_plan_and_place_seconds_count",
        ):
            if line.startswith(name + " "):
                out[name] = float(line.split()[1])
    buckets = S.histogram_buckets(text, "verl_operator_plan_and_place_seconds")
    out["plan_and_place_p50_ms"] = S.histogram_quantile(buckets, 0.5) * 1000
    out["plan_and_place_p99_ms"] = S.histogram_quantile(buckets, 0.99) * 1000
    review = S.histogram_buckets(text, "verl_operator_admission_seconds")
    if review:
        out["webhook_p50_ms"] = S.histogram_quantile(review, 0.5) * 1000
        out["webhook_p99_ms"] = S.histogram_quantile(review, 0.99) * 1000
    served = S.histogram_buckets(text, "verl_operator_webhook_request_seconds")
    if served:
        out["webhook_http_p50_ms"] = S.histogram_quantile(served, 0.5) * 1000
        out["webhook_http_p99_ms"] = S.histogram_quantile(served, 0.99) * 1000
    count = out.get("verl_operator_plan_and_place_seconds_count", 0.0)
    if count:
        out["plan_and_place_mean_ms"] = out["verl_operator_plan_and_place_seconds_sum"] / count * 1000
    return out


#: Seconds the restarted operator is watched after it caught up (writes it makes when nothing changed).
RESTART_QUIET_SECONDS = 30.0


def _restart(
    cluster: DevCluster,
    namespace: str,
    jobs: int,
    workdir: Path,
    result: RunResult,
    say: Callable[[str], None],
) -> LocalOperator:
    """Start a second verl-operator on the running jobs and measure it (``RunResult.restart_*``); the caller
    stops the returned process."""
    api = cluster.api_client()
    try:
        m0, t0 = scrape(api), time.monotonic()
        proc = LocalOperator(cluster.kubeconfig, workdir, namespaces=(namespace,)).start(timeout=900)
        result.restart_up_s = time.monotonic() - t0
        deadline = t0 + 900
        while time.monotonic() < deadline:
            seen = _operator_metrics(proc.metrics())
            if (
                seen.get("verl_operator_reconciles_total", 0) >= jobs
                and seen.get("verl_operator_queue_depth") == 0
            ):
                break
            time.sleep(0.5)
        result.restart_caught_up_s = time.monotonic() - t0
        say(
            f"verl: restarted, up in {result.restart_up_s:.1f}s, caught up in {result.restart_caught_up_s:.1f}s"
        )
        time.sleep(RESTART_QUIET_SECONDS)
        result.restart_window_s = time.monotonic() - t0
        result.restart_writes = _keyed(S.writes(S.delta(scrape(api), m0), S.OPERATOR_KINDS))
        result.restart_rss_mb = rss_mb(proc.proc.pid) if proc.proc is not None else math.nan
        return proc
    finally:
        api.close()


class Profiler:
    """``py-spy record`` of one process, stopped on exit (SIGINT: py-spy then writes its output)."""

    def __init__(self, pid: int, out: Path | None) -> None:
        self.pid, self.out = pid, out
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Profiler:
        spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
        if self.out is not None and spy is not None:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            argv = [spy, "record", "--pid", str(self.pid), "--format", "raw", "--output", str(self.out)]
            argv += ["--rate", "50", "--gil", "--nolineno", "--nonblocking"]
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop sampling and let py-spy write its output (again: nothing)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=60)

    def top(self, n: int = 15) -> tuple[int, list[S.ProfileEntry]]:
        """The samples and top entries written (nothing without py-spy or an output)."""
        if self.proc is None or self.out is None or not self.out.exists():
            return 0, []
        return S.profile_top(self.out.read_text(), n)


def run_one(
    cluster: DevCluster,
    operator: str,
    jobs: int,
    baseline_reads_per_min: dict[str, float],
    steady_seconds: float,
    timeout: float,
    workdir: Path,
    say: Callable[[str], None],
    restart: bool = True,
    profile: Path | None = None,
) -> RunResult:
    """Run one operator with ``jobs`` jobs on the cluster; leaves the cluster as it found it. With ``restart``
    the verl-operator is stopped at the end and started again on the running jobs (``_restart``); with
    ``profile`` (a folder) py-spy samples the verl-operator during the creation (``Profiler``)."""
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    namespace = f"scale-{operator}"
    core.create_namespace({"metadata": {"name": namespace}})
    pods_of = [S.job_nodes(i) for i in range(jobs)]
    result = RunResult(operator=operator, jobs=jobs, pods=sum(pods_of))
    proc: Any
    if operator == "verl":
        install_crd(cluster.kubeconfig)
        proc = LocalOperator(cluster.kubeconfig, workdir / "verl", namespaces=(namespace,)).start()
        label, group, version, plural, build = (
            S.VERL_JOB_LABEL,
            "verl-operator.io",
            "v1alpha1",
            "verljobs",
            S.verljob,
        )
    else:
        kr = ensure_kuberay(progress=say)
        install_crds(api, kr.crds)
        proc = KubeRayOperator(kr.binary, cluster.kubeconfig, workdir / "kuberay").start()
        label, group, version, plural, build = (
            S.RAY_CLUSTER_LABEL,
            "ray.io",
            "v1",
            "rayclusters",
            S.raycluster,
        )
    pid = proc.proc.pid
    try:
        time.sleep(5)  # let the informers finish their initial lists
        spy = Profiler(pid, profile / f"{operator}-create.txt" if profile and operator == "verl" else None)
        with Sampler(pid) as sampler, PodWatch(api, namespace, label) as pods, spy:
            m0, c0, t0 = scrape(api), cpu_seconds(pid), time.monotonic()
            started: list[float] = []
            for i in range(jobs):
                body = build(i, namespace)
                begin = time.monotonic()
                custom.create_namespaced_custom_object(group, version, namespace, plural, body)
                started.append(begin)
                result.admission_ms.append((time.monotonic() - begin) * 1000)
            say(f"{operator}: {jobs} created in {time.monotonic() - t0:.1f}s; waiting for every pod Running")
            deadline = time.monotonic() + timeout
            done: dict[int, float] = {}
            while len(done) < jobs and time.monotonic() < deadline:
                for i in range(jobs):
                    if i not in done:
                        at = pods.all_running(S.job_name(i), pods_of[i])
                        if at is not None:
                            done[i] = at
                time.sleep(0.2)
            t1 = time.monotonic()
            spy.stop()
            result.profile_samples, result.profile = spy.top()
            result.running_s = [done[i] - started[i] for i in sorted(done)]
            result.not_running = jobs - len(done)
            result.batch_s = (max(done.values()) - t0) if done else math.nan
            end_create = max(done.values()) if done else t1
            # CPU up to the moment the last pod ran (the sampler's nearest sample after it)
            after = [c for t, c, _ in sampler.samples if t >= end_create] or [cpu_seconds(pid)]
            result.create_cpu_s = after[0] - c0
            result.create_peak_rss_mb = max(sampler.peak_rss(t0, t1 + 1), rss_mb(pid))
            result.create_requests = _keyed(S.delta(scrape(api), m0))
            say(f"{operator}: {len(done)}/{jobs} jobs Running after {result.batch_s:.1f}s; steady state")
            time.sleep(5)  # the last status writes land
            m2, c2, t2 = scrape(api), cpu_seconds(pid), time.monotonic()
            time.sleep(steady_seconds)
            m3, c3, t3 = scrape(api), cpu_seconds(pid), time.monotonic()
            result.steady_cpu_s = c3 - c2
            result.steady_seconds = t3 - t2
            result.steady_rss_mb = rss_mb(pid)
            window = [(t, c) for t, c, _ in sampler.samples if t2 <= t <= t3]
            result.steady_cpu_series = [
                (c1 - c0_) / (ta - t0_) * 100 for (t0_, c0_), (ta, c1) in itertools.pairwise(window)
            ]
            steady = S.delta(m3, m2)
            result.steady_requests = _keyed(steady)
            minutes = (t3 - t2) / 60
            kinds = (plural, "pods")
            extra = S.reads(steady, kinds) / minutes - sum(baseline_reads_per_min.get(k, 0.0) for k in kinds)
            result.steady_reads_per_job_min = max(0.0, extra) / max(1, jobs)
        if operator == "verl":
            result.operator_metrics = _operator_metrics(proc.metrics())
            bad = S.invalid_verljob(namespace)
            begin = time.monotonic()
            try:
                custom.create_namespaced_custom_object(group, version, namespace, plural, bad)
                result.rejection_message = "accepted"
            except ApiException as exc:
                result.rejection_ms = (time.monotonic() - begin) * 1000
                result.rejection_message = json.loads(exc.body or "{}").get("message", "")[:300]
            if restart:
                proc.stop()
                proc = _restart(cluster, namespace, jobs, workdir / "verl-restart", result, say)
    finally:
        proc.stop()
        # Collections first (one request each): the namespace controller alone deletes object by object.
        with contextlib.suppress(ApiException):
            custom.delete_collection_namespaced_custom_object(group, version, namespace, plural)
        with contextlib.suppress(ApiException):
            core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        with contextlib.suppress(ApiException):
            core.delete_collection_namespaced_event(namespace)
        core.delete_namespace(namespace)  # the rest (ConfigMaps, Services) goes in the background
        try:
            _wait_pods_gone(core, namespace, timeout=max(300.0, jobs * 0.6))
        finally:
            api.close()
    return result


def baseline_reads(cluster: DevCluster, seconds: float) -> dict[str, float]:
    """GET/LIST per minute by resource with no operator running (kwok, scheduler, controller-manager)."""
    api = cluster.api_client()
    with api:
        before = scrape(api)
        time.sleep(seconds)
        counts = S.delta(scrape(api), before)
    out: dict[str, float] = {}
    for (verb, res), v in counts.items():
        if verb in S.READ_VERBS:
            out[res] = out.get(res, 0.0) + v * 60 / seconds
    return out


# ---- reporting -----------------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def report(scenario: S.Scenario, runs: dict[str, RunResult]) -> str:
    """The scenario's tables as Markdown."""
    lines = [f"### {scenario.name}: {scenario.jobs} jobs on {scenario.nodes} nodes", ""]
    ops = list(runs)
    header = "| metric | " + " | ".join(ops) + (" | verl / KubeRay |" if len(ops) == 2 else " |")
    lines += [header, "|---|" + "---|" * (len(ops) + (1 if len(ops) == 2 else 0))]

    def row(name: str, get: Callable[[RunResult], float | None], digits: int = 1) -> None:
        values = [get(runs[o]) for o in ops]
        cells = [_fmt(v, digits) for v in values]
        if len(ops) == 2:
            a, b = values
            r = S.ratio(a, b) if a is not None and b is not None else math.nan
            cells.append(_fmt(r, 2))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    row("pods", lambda r: float(r.pods), 0)
    row("admission p50 ms", lambda r: S.percentile(r.admission_ms, 50))
    row("admission p99 ms", lambda r: S.percentile(r.admission_ms, 99))
    row("CR -> all pods Running p50 s", lambda r: S.percentile(r.running_s, 50), 2)
    row("CR -> all pods Running p99 s", lambda r: S.percentile(r.running_s, 99), 2)
    row("batch: first create -> last pod Running s", lambda r: r.batch_s, 1)
    row("jobs not Running at the timeout", lambda r: float(r.not_running), 0)
    row("operator CPU s during creation", lambda r: r.create_cpu_s, 1)
    row("operator peak RSS MB during creation", lambda r: r.create_peak_rss_mb, 0)
    row("operator CPU % of a core, steady", lambda r: r.steady_cpu_s / r.steady_seconds * 100, 2)
    row("operator RSS MB, steady", lambda r: r.steady_rss_mb, 0)
    row("GET+LIST of jobs and pods per job per minute, steady", lambda r: r.steady_reads_per_job_min, 2)
    row("time to reject an invalid spec ms", lambda r: r.rejection_ms, 1)
    row(
        "plan + place one job, p50 ms (operator histogram)",
        lambda r: r.operator_metrics.get("plan_and_place_p50_ms"),
        2,
    )
    row("plan + place one job, mean ms", lambda r: r.operator_metrics.get("plan_and_place_mean_ms"), 2)
    row(
        "webhook's own answer p50 ms (operator histogram)",
        lambda r: r.operator_metrics.get("webhook_p50_ms"),
        1,
    )
    row(
        "webhook's own answer p99 ms (operator histogram)",
        lambda r: r.operator_metrics.get("webhook_p99_ms"),
        1,
    )
    row(
        "webhook's HTTP server p50 ms (body read to answer encoded)",
        lambda r: r.operator_metrics.get("webhook_http_p50_ms"),
        1,
    )
    row(
        "webhook's HTTP server p99 ms (body read to answer encoded)",
        lambda r: r.operator_metrics.get("webhook_http_p99_ms"),
        1,
    )
    row("reconcile passes (whole run)", lambda r: r.operator_metrics.get("verl_operator_reconciles_total"), 0)
    row("restart: start -> health endpoint s", lambda r: r.restart_up_s, 1)
    row("restart: start -> every job reconciled, none queued s", lambda r: r.restart_caught_up_s, 1)
    row("restart: writes to jobs, pods and their objects", lambda r: sum(r.restart_writes.values()), 0)
    row("restart: RSS MB after catching up", lambda r: r.restart_rss_mb, 0)
    lines.append("")
    for o in ops:
        if runs[o].restart_writes:
            lines.append(
                f"{o} restart writes (verb resource: count): "
                + ", ".join(f"{k}: {v:.0f}" for k, v in sorted(runs[o].restart_writes.items()))
            )
            lines.append("")
    for o in ops:
        if runs[o].profile:
            lines.append(
                f"{o}: py-spy, {runs[o].profile_samples} samples holding the GIL from the first create to the "
                "last pod Running (50 per second):"
            )
            lines.append("")
            lines.append("| function (file) | on the stack | on top |")
            lines.append("|---|---|---|")
            for e in runs[o].profile:
                lines.append(f"| `{e.function}` | {e.inclusive:.1%} | {e.own:.1%} |")
            lines.append("")
    for phase in ("create", "steady"):
        keys = sorted({k for o in ops for k in getattr(runs[o], f"{phase}_requests")})
        keys = [k for k in keys if not k.startswith("WATCH")]
        lines += [f"API requests during {phase} (all clients; WATCH left out):", ""]
        lines += ["| verb resource | " + " | ".join(ops) + " |", "|---|" + "---|" * len(ops)]
        for k in keys:
            lines.append(
                f"| {k} | "
                + " | ".join(f"{getattr(runs[o], f'{phase}_requests').get(k, 0):.0f}" for o in ops)
                + " |"
            )
        lines.append("")
    return "\n".join(lines)


def plot(scenario: S.Scenario, runs: dict[str, RunResult], out: Path) -> list[Path]:
    """CR -> Running latency distribution and steady-state CPU, one PNG each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, run in runs.items():
        values = sorted(run.running_s)
        if values:
            ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=name)
    ax.set_xlabel("CR created -> all its pods Running (s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(f"{scenario.jobs} jobs on {scenario.nodes} nodes: CR -> Running")
    ax.grid(alpha=0.3)
    ax.legend()
    path = out / f"scale-{scenario.name}-running.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    paths.append(path)
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, run in runs.items():
        ax.plot(range(1, len(run.steady_cpu_series) + 1), run.steady_cpu_series, label=name)
    ax.set_xlabel("steady state (s)")
    ax.set_ylabel("operator CPU (% of one core)")
    ax.set_title(f"{scenario.jobs} jobs on {scenario.nodes} nodes: steady-state CPU")
    ax.grid(alpha=0.3)
    ax.legend()
    path = out / f"scale-{scenario.name}-steady-cpu.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    paths.append(path)
    return paths


# ---- main ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def scale_cluster(
    nodes: int, say: Callable[[str], None], keep: bool, name: str = "bench-scale"
) -> Iterator[DevCluster]:
    """A devcluster instance ``name`` with ``nodes`` DGX H100 nodes (taken down after, unless ``keep``)."""
    with tempfile.TemporaryDirectory(prefix="verl-operator-scale-") as tmp:
        profile = Path(tmp) / "scale.yaml"
        profile.write_text(yaml.safe_dump(S.scale_profile(nodes)))
        cluster = DevCluster(name=name, profile="dgx-h100", progress=say)
        try:
            cluster.up()
            cluster.remove_profile("dgx-h100")
            begin = time.monotonic()
            cluster.apply_profile(str(profile), timeout=max(60.0, nodes * 0.2))
            say(f"{nodes} nodes Ready in {time.monotonic() - begin:.0f}s")
            yield cluster
        finally:
            if not keep:
                cluster.down()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scenario", action="append", choices=sorted(S.SCENARIOS), help="repeatable; default: all three"
    )
    parser.add_argument("--nodes", type=int, help="a custom scenario: this many nodes (with --jobs)")
    parser.add_argument("--jobs", type=int, help="a custom scenario: this many jobs (with --nodes)")
    parser.add_argument("--operator", action="append", choices=("verl", "kuberay"), help="default: both")
    parser.add_argument("--steady-seconds", type=float, default=60.0)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for a batch to run")
    parser.add_argument("--plots", type=Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument("--json", type=Path, default=None, help="write every number here")
    parser.add_argument("--keep", action="store_true", help="leave the devcluster running")
    parser.add_argument(
        "--profile", type=Path, default=None, help="sample the verl-operator with py-spy, raw output here"
    )
    parser.add_argument(
        "--no-restart", action="store_true", help="skip restarting the verl-operator on the running jobs"
    )
    args = parser.parse_args(argv)

    def say(message: str) -> None:
        print(f"[scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    scenarios = [S.SCENARIOS[n] for n in (args.scenario or [])]
    if args.nodes or args.jobs:
        if not (args.nodes and args.jobs):
            parser.error("--nodes and --jobs go together")
        scenarios.append(S.Scenario(f"{args.jobs}x{args.nodes}", nodes=args.nodes, jobs=args.jobs))
    scenarios = scenarios or list(S.SCENARIOS.values())
    operators = args.operator or ["verl", "kuberay"]
    out: dict[str, Any] = {"cores": os.cpu_count(), "scenarios": {}}
    for scenario in scenarios:
        say(f"scenario {scenario.name}: {scenario.nodes} nodes, {scenario.jobs} jobs")
        with (
            tempfile.TemporaryDirectory(prefix="verl-operator-scale-run-") as work,
            scale_cluster(scenario.nodes, say, args.keep) as cluster,
        ):
            time.sleep(5)
            base = baseline_reads(cluster, 20.0)
            runs: dict[str, RunResult] = {}
            for op in operators:
                run = run_one(
                    cluster,
                    op,
                    scenario.jobs,
                    base,
                    args.steady_seconds,
                    args.timeout,
                    Path(work),
                    say,
                    restart=not args.no_restart,
                    profile=args.profile,
                )
                runs[op] = run
                say(
                    f"{op}: admission p99 {S.percentile(run.admission_ms, 99):.1f} ms, CR->Running p50 "
                    f"{S.percentile(run.running_s, 50):.2f} s p99 {S.percentile(run.running_s, 99):.2f} s, batch "
                    f"{run.batch_s:.1f} s, steady CPU {run.steady_cpu_s / run.steady_seconds * 100:.2f}% RSS "
                    f"{run.steady_rss_mb:.0f} MB"
                )
                if args.json:
                    partial = {**out, "partial": {scenario.name: {k: asdict(v) for k, v in runs.items()}}}
                    args.json.write_text(json.dumps(partial, indent=1, sort_keys=True))
        text = report(scenario, runs)
        print(text, flush=True)
        paths = plot(scenario, runs, args.plots)
        say("plots: " + ", ".join(str(p) for p in paths))
        out["scenarios"][scenario.name] = {
            "nodes": scenario.nodes,
            "jobs": scenario.jobs,
            "baseline_reads_per_min": base,
            "runs": {k: asdict(v) for k, v in runs.items()},
        }
        if args.json:
            args.json.write_text(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
