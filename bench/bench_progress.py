"""Jobs reporting steps: the verl-operator following N running jobs whose head pods report a step every 10 s.

Run: ``.venv/bin/python bench/bench_progress.py [--jobs 200 --nodes 1000] [--seconds 300] [--json FILE]``.

A devcluster gets ``--nodes`` simulated DGX H100 nodes and the verl-operator runs ``--jobs`` VerlJobs (the
scale benchmark's mix, ``bench/scale_support.py``) until every one is Running. Their pods are kwok's, with
simulated IPs that no pod holds, so the head pods are moved onto this machine's loopback device before any
progress is read:

1. the operator that created the jobs runs with ``--progress-port 0`` (it reads no head pod);
2. once every job is Running it is stopped, and each head pod's ``status.podIP`` is set to a distinct
   loopback address (``127.1.x.y``; kwok gives a pod its IP once and leaves it, which the run checks);
3. ONE stand-in server bound to ``0.0.0.0`` answers ``GET /progress`` for every job, telling the jobs apart by
   the local address a connection arrived on: each job has the launcher's own ``ProgressTracker`` fed verl's
   published gsm8k step line (``tests/unit/data/verl-output/gsm8k-vllm-ray-wrapped.log``) every
   ``--step-seconds`` with its timers scaled to that step time, the jobs' steps spread over the interval
   and their step numbers over the 50 steps after which the operator computes a job's advice again;
4. a new operator starts on the running jobs with ``--progress-port`` the server's port.

After every job's progress is in its status and ``--warmup`` more seconds, ``--seconds`` of steady state are
measured: the operator's CPU (% of one core, ``/proc``), its RSS, the status writes (``PATCH``/``PUT`` of
``verljobs/status`` from the API server's ``apiserver_request_total``; and per job, the MODIFIED events of a
watch), the progress reads the server answered, and the jobs whose ``Stalled`` condition turned True (false
positives: every job steps). The jobs' stall deadline is tight (``minStepSeconds: 30``, ``stepFactor: 3``)
so that a late or mixed-up reading would show. Then one job stops stepping and the run waits for its
``Stalled`` condition (the detector works under the same load). Targets (issue "Create jobs at KubeRay's
pace"): operator CPU < 5% of a core, status writes <= 1 per job per 30 s, no false Stalled.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import itertools
import json
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scale_support as S
from bench_scale import Profiler, Sampler, cpu_seconds, rss_mb, scale_cluster, scrape
from verl_devtools.devcluster import DevCluster
from verl_devtools.devcluster.localrun import LocalOperator, install_crd
from verl_launcher.progress import ProgressTracker
from verl_operator.controller.progress import ADVICE_EVERY

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "tests" / "unit" / "data" / "verl-output" / "gsm8k-vllm-ray-wrapped.log"
GROUP, VERSION, PLURAL = "verl-operator.io", "v1alpha1", "verljobs"
NAMESPACE = "progress"
#: Job i reports ``TOTAL_BASE + i`` total steps, so a reading served for the wrong job shows in its status.
TOTAL_BASE = 1000
#: The jobs' stall deadline: no new step within max(3 x median step, 30 s).
STALL = {"stepFactor": 3, "minStepSeconds": 30, "action": "none"}


# ---- the head pods' stand-in ---------------------------------------------------------------------------


class Heads:
    """Every job's head: a launcher ``ProgressTracker`` per job fed a verl step line every ``step_seconds``,
    and one HTTP server on ``0.0.0.0:port`` answering ``/progress`` by the local address of the connection."""

    def __init__(self, jobs: int, step_seconds: float, port: int = 0) -> None:
        self.jobs, self.step_seconds = jobs, step_seconds
        self.published = PUBLISHED.read_text()
        self.trackers = [ProgressTracker() for _ in range(jobs)]
        # The jobs are at different points of their runs: job i starts after step ``i * ADVICE_EVERY // jobs``,
        # so the operator's advice, computed again every ADVICE_EVERY steps, comes due evenly over time.
        self.steps = [i * ADVICE_EVERY // jobs for i in range(jobs)]
        self.reads = [0] * jobs
        self.unknown = 0
        self.hung: set[int] = set()
        self.lock = threading.Lock()
        self._stop = threading.Event()
        heads = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                index = S.job_of_address(self.connection.getsockname()[0])
                if self.path.split("?", 1)[0] != "/progress" or index is None or index >= heads.jobs:
                    with heads.lock:
                        heads.unknown += 1
                    self._answer(404, b'{"error":"not found"}')
                    return
                with heads.lock:
                    heads.reads[index] += 1
                self._answer(200, heads.trackers[index].progress().to_json().encode())

            def _answer(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
        self.server.daemon_threads = True
        self._threads = [threading.Thread(target=self.server.serve_forever, name="heads", daemon=True)]

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> Heads:
        """Serve, and start every job: Ray formed, verl started, its total steps, then a step every
        ``step_seconds`` (job i's first one ``i / jobs`` of the interval in)."""
        for i, tracker in enumerate(self.trackers):
            tracker.enter("RayFormed")
            tracker.enter("VerlStarted")
            tracker.feed(f"(TaskRunner pid={15930 + i}) Total training steps: {TOTAL_BASE + i}")
        self._threads.append(threading.Thread(target=self._feed, name="steps", daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def _feed(self) -> None:
        begin = time.monotonic()
        due = [(begin + self.step_seconds * i / self.jobs, i) for i in range(self.jobs)]
        heapq.heapify(due)
        while due and not self._stop.is_set():
            at, i = due[0]
            if self._stop.wait(max(0.0, at - time.monotonic())):
                return
            heapq.heappop(due)
            with self.lock:
                if i in self.hung:
                    continue
                self.steps[i] += 1
                step = self.steps[i]
            self.trackers[i].feed(S.step_line(self.published, step, self.step_seconds))
            heapq.heappush(due, (at + self.step_seconds, i))

    def hang(self, index: int) -> None:
        """Job ``index`` prints nothing more (a stuck collective)."""
        with self.lock:
            self.hung.add(index)

    def stop(self) -> None:
        self._stop.set()
        if self._threads[0].is_alive():
            self.server.shutdown()
        self.server.server_close()


# ---- watching the jobs ---------------------------------------------------------------------------------


class JobWatch:
    """Every VerlJob of the namespace as last seen, the times of its MODIFIED events, and the jobs seen with
    ``Stalled`` True (with when)."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.jobs: dict[str, dict[str, Any]] = {}
        self.modified: dict[str, list[float]] = {}
        self.stalled: dict[str, float] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _record(self, obj: dict[str, Any], modified: bool) -> None:
        name = obj["metadata"]["name"]
        now = time.monotonic()
        conds = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}
        with self.lock:
            self.jobs[name] = obj
            if modified:
                self.modified.setdefault(name, []).append(now)
            if (conds.get("Stalled") or {}).get("status") == "True":
                self.stalled.setdefault(name, now)

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    listed = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)
                    for obj in listed["items"]:
                        self._record(obj, modified=False)
                    version = listed["metadata"]["resourceVersion"]
                stream = watch.Watch().stream(
                    self.custom.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    self.namespace,
                    PLURAL,
                    resource_version=version,
                    timeout_seconds=30,
                    allow_watch_bookmarks=True,
                )
                for event in stream:
                    obj = event["object"]
                    version = obj.get("metadata", {}).get("resourceVersion") or version
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._record(obj, modified=event["type"] == "MODIFIED")
                    if self._stop.is_set():
                        break
            except ApiException as exc:
                if exc.status == 410:
                    version = ""
                else:
                    time.sleep(0.5)
            except Exception:  # a dropped connection: watch again from the last version
                time.sleep(0.2)

    def progress(self, name: str) -> dict[str, Any]:
        with self.lock:
            return dict(((self.jobs.get(name) or {}).get("status") or {}).get("progress") or {})

    def writes_between(self, start: float, end: float) -> dict[str, int]:
        with self.lock:
            return {n: sum(1 for t in ts if start <= t <= end) for n, ts in self.modified.items()}

    def __enter__(self) -> JobWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()


# ---- one run -------------------------------------------------------------------------------------------


@dataclass
class Result:
    jobs: int
    nodes: int
    step_seconds: float
    load_before: tuple[float, float, float] = (math.nan, math.nan, math.nan)
    running_s: float = math.nan
    ips_moved: int = 0
    ips_kept: int = 0
    caught_up_s: float = math.nan
    window_s: float = math.nan
    cpu_s: float = math.nan
    cpu_pct: float = math.nan
    cpu_series: list[float] = field(default_factory=list)
    rss_mb: float = math.nan
    status_writes: float = 0.0
    status_writes_per_job_30s: float = math.nan
    max_job_writes_per_30s: float = math.nan
    job_writes_per_30s_p50: float = math.nan
    reads_per_job_min: float = math.nan
    unknown_reads: int = 0
    requests: dict[str, float] = field(default_factory=dict)
    false_stalls: list[str] = field(default_factory=list)
    wrong_job: list[str] = field(default_factory=list)
    step_lag: list[int] = field(default_factory=list)
    hung_stalled_after_s: float = math.nan
    hung_reason: str = ""
    #: py-spy's samples of the operator holding the GIL in the steady window, and the top functions.
    profile_samples: int = 0
    profile: list[S.ProfileEntry] = field(default_factory=list)
    operator_log_tail: str = ""


def _job(index: int) -> dict[str, Any]:
    body = S.verljob(index, NAMESPACE)
    body["spec"]["monitoring"] = {"stall": dict(STALL)}
    return body


def _wait(what: str, check: Callable[[], bool], timeout: float, interval: float = 1.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise TimeoutError(f"{what}: not after {timeout:.0f}s")


def run(cluster: DevCluster, args: argparse.Namespace, work: Path, say: Callable[[str], None]) -> Result:
    result = Result(jobs=args.jobs, nodes=args.nodes, step_seconds=args.step_seconds)
    api = cluster.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    install_crd(cluster.kubeconfig)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    names = [S.job_name(i) for i in range(args.jobs)]
    heads = Heads(args.jobs, args.step_seconds)
    creator = LocalOperator(cluster.kubeconfig, work / "create", webhook_name=None, namespaces=(NAMESPACE,))
    follower: LocalOperator | None = None
    try:
        # 1. The jobs, created and run by an operator that reads no head pod (their IPs are simulated).
        creator.start(timeout=300)
        begin = time.monotonic()
        for i in range(args.jobs):
            custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, _job(i))

        def all_running() -> bool:
            items = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)["items"]
            return sum((o.get("status") or {}).get("phase") == "Running" for o in items) == args.jobs

        _wait("every job Running", all_running, args.timeout, interval=2.0)
        result.running_s = time.monotonic() - begin
        say(f"{args.jobs} jobs Running after {result.running_s:.1f}s; moving the head pods onto loopback")
        creator.stop()

        # 2. Each head pod onto its own loopback address.
        heads_of = {
            (p.metadata.labels or {}).get(S.VERL_JOB_LABEL): p
            for p in core.list_namespaced_pod(NAMESPACE, label_selector="verl-operator.io/role=head").items
        }
        for i, name in enumerate(names):
            pod = heads_of[name]
            ip = S.loopback_address(i)
            # a JSON patch: a strategic merge would add the address to podIPs beside kwok's
            replace = [
                {"op": "replace", "path": "/status/podIP", "value": ip},
                {"op": "replace", "path": "/status/podIPs", "value": [{"ip": ip}]},
            ]
            core.patch_namespaced_pod_status(
                pod.metadata.name, NAMESPACE, replace, _content_type="application/json-patch+json"
            )
            result.ips_moved += 1

        # 3-4. The heads step; a new operator reads them.
        heads.start()
        say(f"heads serving on 0.0.0.0:{heads.port}; starting the operator with --progress-port")
        with JobWatch(api, NAMESPACE) as jobs:
            follower = LocalOperator(
                cluster.kubeconfig,
                work / "follow",
                webhook_name=None,
                namespaces=(NAMESPACE,),
                extra_args=(f"--progress-port={heads.port}",),
            )
            started = time.monotonic()
            follower.start(timeout=300)
            pid = follower.proc.pid if follower.proc is not None else 0
            _wait(
                "every job's progress in its status",
                lambda: all(jobs.progress(n).get("step", 0) > 0 for n in names),
                args.timeout,
            )
            result.caught_up_s = time.monotonic() - started
            say(f"every job's progress in status {result.caught_up_s:.1f}s after the start; warming up")
            time.sleep(args.warmup)

            # Steady state.
            spy = Profiler(pid, args.profile)
            with Sampler(pid) as sampler, spy:
                with heads.lock:
                    reads0 = sum(heads.reads)
                m0, c0, t0 = scrape(api), cpu_seconds(pid), time.monotonic()
                time.sleep(args.seconds)
                m1, c1, t1 = scrape(api), cpu_seconds(pid), time.monotonic()
                with heads.lock:
                    reads1, result.unknown_reads = sum(heads.reads), heads.unknown
                spy.stop()
            result.profile_samples, result.profile = spy.top()
            result.window_s = t1 - t0
            result.cpu_s = c1 - c0
            result.cpu_pct = result.cpu_s / result.window_s * 100
            series = [(t, c) for t, c, _ in sampler.samples if t0 <= t <= t1]
            result.cpu_series = [(b - a) / (tb - ta) * 100 for (ta, a), (tb, b) in itertools.pairwise(series)]
            result.rss_mb = rss_mb(pid)
            counts = S.delta(m1, m0)
            result.requests = {f"{v} {r}": n for (v, r), n in counts.items() if not v.startswith("WATCH")}
            result.status_writes = sum(
                counts.get((verb, "verljobs/status"), 0.0) for verb in ("PATCH", "PUT")
            )
            result.status_writes_per_job_30s = S.per_job_per_interval(
                result.status_writes, args.jobs, result.window_s
            )
            per_job = jobs.writes_between(t0, t1)
            rates = [S.per_job_per_interval(per_job.get(n, 0), 1, result.window_s) for n in names]
            result.max_job_writes_per_30s = max(rates)
            result.job_writes_per_30s_p50 = S.percentile(rates, 50)
            result.reads_per_job_min = (reads1 - reads0) / args.jobs / (result.window_s / 60)

            # Each job's status is its own head's (its total steps) and current within a status interval.
            with heads.lock:
                served = list(heads.steps)
            for i, name in enumerate(names):
                progress = jobs.progress(name)
                if progress.get("totalSteps") != TOTAL_BASE + i:
                    result.wrong_job.append(name)
                result.step_lag.append(served[i] - int(progress.get("step") or 0))
            with jobs.lock:
                result.false_stalls = sorted(jobs.stalled)
            pods = core.list_namespaced_pod(NAMESPACE, label_selector="verl-operator.io/role=head").items
            ips = {(p.metadata.labels or {}).get(S.VERL_JOB_LABEL): p.status.pod_ip for p in pods}
            result.ips_kept = sum(ips.get(n) == S.loopback_address(i) for i, n in enumerate(names))
            say(
                f"steady {result.window_s:.0f}s: CPU {result.cpu_pct:.2f}% of a core, RSS {result.rss_mb:.0f} MB, "
                f"{result.status_writes_per_job_30s:.3f} status writes per job per 30 s "
                f"(max one job {result.max_job_writes_per_30s:.2f}), false Stalled {len(result.false_stalls)}"
            )

            # One job stops stepping: its Stalled condition under the same load.
            hung = names[-1]
            heads.hang(args.jobs - 1)
            hung_at = time.monotonic()
            with contextlib.suppress(TimeoutError):
                _wait("the hung job Stalled", lambda: hung in jobs.stalled, args.step_seconds * 3 + 120)
            if hung in jobs.stalled:
                # from its last step: at most one step interval before the hang
                result.hung_stalled_after_s = jobs.stalled[hung] - hung_at
                conds = {c["type"]: c for c in (jobs.jobs[hung].get("status") or {}).get("conditions") or []}
                result.hung_reason = conds["Stalled"].get("reason", "")
            with jobs.lock:
                late = sorted(set(jobs.stalled) - {hung})
            result.false_stalls = sorted(set(result.false_stalls) | set(late))
            say(f"hung job Stalled {result.hung_stalled_after_s:.1f}s after its steps stopped")
        result.operator_log_tail = follower.log_tail(20)
    finally:
        if follower is not None:
            follower.stop()
        creator.stop()
        heads.stop()
        with contextlib.suppress(ApiException):
            custom.delete_collection_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)
        with contextlib.suppress(ApiException):
            core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
        with contextlib.suppress(ApiException):
            core.delete_namespace(NAMESPACE)
        api.close()
    return result


def report(r: Result) -> str:
    def fmt(v: float, d: int = 2) -> str:
        return "-" if isinstance(v, float) and math.isnan(v) else f"{v:.{d}f}"

    lag = sorted(r.step_lag)
    rows = [
        ("jobs / nodes / step every", f"{r.jobs} / {r.nodes} / {r.step_seconds:g} s"),
        ("load average before the run (1/5/15 min)", " / ".join(f"{x:.2f}" for x in r.load_before)),
        ("every job Running after (create, no progress read) s", fmt(r.running_s, 1)),
        ("head pods on loopback: moved / still there at the end", f"{r.ips_moved} / {r.ips_kept}"),
        ("operator start -> every job's progress in status s", fmt(r.caught_up_s, 1)),
        ("steady window s", fmt(r.window_s, 0)),
        ("operator CPU % of a core (target < 5)", fmt(r.cpu_pct)),
        (
            "operator CPU % of a core, 1 s samples p50 / max",
            f"{fmt(S.percentile(r.cpu_series, 50))} / {fmt(max(r.cpu_series) if r.cpu_series else math.nan)}",
        ),
        ("operator RSS MB", fmt(r.rss_mb, 0)),
        ("PATCH+PUT verljobs/status in the window", fmt(r.status_writes, 0)),
        ("status writes per job per 30 s (target <= 1)", fmt(r.status_writes_per_job_30s, 3)),
        (
            "writes per job per 30 s, one job: p50 / max (watch)",
            f"{fmt(r.job_writes_per_30s_p50, 3)} / {fmt(r.max_job_writes_per_30s, 3)}",
        ),
        ("progress reads per job per minute", fmt(r.reads_per_job_min)),
        ("reads of an unknown address", str(r.unknown_reads)),
        ("jobs Stalled while stepping (target 0)", str(len(r.false_stalls))),
        ("jobs whose status shows another job's progress", str(len(r.wrong_job))),
        (
            "steps the status is behind the head at the end: p50 / max",
            f"{fmt(S.percentile(lag, 50), 0)} / {max(lag) if lag else '-'}",
        ),
        (
            "a job that stops stepping: Stalled after s (reason)",
            f"{fmt(r.hung_stalled_after_s, 1)} ({r.hung_reason or 'not Stalled'})",
        ),
    ]
    lines = ["| metric | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    lines += [
        "",
        "API requests in the window (all clients; WATCH left out):",
        "",
        "| verb resource | count |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v:.0f} |" for k, v in sorted(r.requests.items())]
    if r.profile:
        lines += [
            "",
            f"py-spy, {r.profile_samples} samples holding the GIL in the steady window (50 per second):",
            "",
            "| function (file) | on the stack | on top |",
            "|---|---|---|",
        ]
        lines += [f"| `{e.function}` | {e.inclusive:.1%} | {e.own:.1%} |" for e in r.profile]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--step-seconds", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=300.0, help="the steady window")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds after every job's progress is in")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", type=Path, default=None, help="write every number here")
    parser.add_argument("--keep", action="store_true", help="leave the devcluster running")
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="sample the operator with py-spy in the window, raw output here",
    )
    args = parser.parse_args(argv)
    if args.jobs <= 0 or sum(S.job_nodes(i) for i in range(args.jobs)) > args.nodes:
        parser.error(f"{args.jobs} jobs of the mix need more than {args.nodes} nodes")

    def say(message: str) -> None:
        print(f"[progress {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    load = os.getloadavg()
    with (
        tempfile.TemporaryDirectory(prefix="verl-operator-progress-") as work,
        scale_cluster(args.nodes, say, args.keep, name="bench-progress") as cluster,
    ):
        result = run(cluster, args, Path(work), say)
    result.load_before = load
    print(report(result), flush=True)
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=1, sort_keys=True))
    ok = (
        result.cpu_pct < 5
        and result.status_writes_per_job_30s <= 1
        and not result.false_stalls
        and not result.wrong_job
        and result.ips_kept == result.jobs
        and not math.isnan(result.hung_stalled_after_s)
    )
    say("targets met" if ok else "targets NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
