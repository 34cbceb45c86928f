"""Prometheus metrics of the operator (served by ``verl-operator run --metrics-port``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram

from verl_operator.api.status import PHASES, VerlJobStatus

JOBS = Gauge("verl_operator_jobs", "VerlJobs by phase.", ["phase"])
PLANNING_SECONDS = Histogram(
    "verl_operator_planning_seconds",
    "Time to plan one VerlJob (planner only).",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
PLAN_AND_PLACE_SECONDS = Histogram(
    "verl_operator_plan_and_place_seconds",
    "Time to plan one VerlJob and choose its nodes on the cached snapshot (planner + placement; no API call).",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0),
)
RECONCILE_ERRORS = Counter("verl_operator_reconcile_errors_total", "Reconcile passes that raised an error.")
RECONCILES = Counter("verl_operator_reconciles_total", "Reconcile passes run.")
QUEUE_DEPTH = Gauge(
    "verl_operator_queue_depth",
    "VerlJobs queued for a reconcile or being reconciled (0: the operator has caught up with every change).",
)
ADMISSION_SECONDS = Histogram(
    "verl_operator_admission_seconds",
    "Time the validating webhook takes to answer one AdmissionReview (the checks, the permission check and "
    "the dry run of the pods; not the API server's own part of the create).",
    buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5),
)
WEBHOOK_REQUEST_SECONDS = Histogram(
    "verl_operator_webhook_request_seconds",
    "Time the webhook's HTTP server spends on one AdmissionReview request of this operator's webhooks: the "
    "body read and parsed, the wait for a review thread, the answer and its encoding (not TLS).",
    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5),
)
WEBHOOK_REVIEWS_IN_FLIGHT = Gauge(
    "verl_operator_webhook_reviews_in_flight",
    "AdmissionReview requests of this operator's webhooks the webhook's HTTP server has received and not answered.",
)
ADMISSION_DENIALS = Counter(
    "verl_operator_admission_denials_total", "VerlJobs denied by the validating webhook."
)

LEADER = Gauge(
    "verl_operator_leader",
    "1 while this replica holds the leader Lease and reconciles (also 1 without leader election), else 0.",
)


def set_job_phases(phases: Iterable[str | None]) -> None:
    """Set the jobs-by-phase gauge from the phases of every known job (no phase yet counts as Pending)."""
    counts = dict.fromkeys(PHASES, 0)
    for phase in phases:
        key = phase if phase in counts else "Pending"
        counts[key] += 1
    for phase, count in counts.items():
        JOBS.labels(phase=phase).set(count)


# -- per-job progress (status.progress of Running jobs; removed when the job stops running or goes) ---------
#: The VerlJob's namespace and name: not ``namespace`` and ``job``, which Prometheus sets on every scraped series
#: (the scrape job, and the ServiceMonitor's target namespace) and would rename to ``exported_*``.
_JOB = ["verljob_namespace", "verljob"]
JOB_STEP = Gauge("verl_operator_job_step", "The last step verl logged.", _JOB)
JOB_TOTAL_STEPS = Gauge("verl_operator_job_total_steps", "verl's total training steps.", _JOB)
JOB_STEP_SECONDS = Gauge("verl_operator_job_step_seconds", "The last step's time (timing_s/step).", _JOB)
JOB_PHASE_SECONDS = Gauge(
    "verl_operator_job_phase_seconds",
    "The last step's seconds in each phase (verl's timer names).",
    [*_JOB, "phase"],
)
JOB_THROUGHPUT = Gauge("verl_operator_job_throughput_per_gpu", "perf/throughput: tokens/s per GPU.", _JOB)
JOB_MFU = Gauge("verl_operator_job_mfu", "perf/mfu/actor, where verl reports one.", _JOB)
JOB_GENERATION_SHARE = Gauge(
    "verl_operator_job_generation_share", "timing_s/gen over timing_s/step of the last step.", _JOB
)
JOB_STALLED = Gauge(
    "verl_operator_job_stalled", "1 while the job is Stalled (no step within its deadline).", _JOB
)
_PER_JOB = (
    JOB_STEP,
    JOB_TOTAL_STEPS,
    JOB_STEP_SECONDS,
    JOB_THROUGHPUT,
    JOB_MFU,
    JOB_GENERATION_SHARE,
    JOB_STALLED,
)
#: The phase labels set per job, to remove them with the job.
_PHASES: dict[tuple[str, str], set[str]] = {}
_PHASES_LOCK = threading.Lock()


def forget_job(namespace: str, job: str) -> None:
    """Remove every per-job series of ``namespace/job``."""
    for gauge in _PER_JOB:
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, job)
    with _PHASES_LOCK:
        phases = _PHASES.pop((namespace, job), set())
    for phase in phases:
        with contextlib.suppress(KeyError):
            JOB_PHASE_SECONDS.remove(namespace, job, phase)


def set_job_progress(namespace: str, job: str, status: VerlJobStatus) -> None:
    """Set the per-job series from a status written for ``namespace/job`` (a job not Running has none)."""
    progress = status.progress
    if status.phase != "Running" or progress is None:
        forget_job(namespace, job)
        return
    key = (namespace, job)
    JOB_STEP.labels(namespace, job).set(progress.step)
    values = (
        (JOB_TOTAL_STEPS, progress.total_steps),
        (JOB_STEP_SECONDS, progress.step_seconds),
        (JOB_THROUGHPUT, progress.throughput_per_gpu),
        (JOB_MFU, progress.mfu),
        (JOB_GENERATION_SHARE, progress.generation_share),
    )
    for gauge, value in values:
        if value is None:
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, job)
        else:
            gauge.labels(namespace, job).set(value)
    stalled = status.condition("Stalled")
    JOB_STALLED.labels(namespace, job).set(1 if stalled is not None and stalled.status == "True" else 0)
    with _PHASES_LOCK:
        old = _PHASES.get(key, set())
        _PHASES[key] = set(progress.phases)
    for phase in old - set(progress.phases):
        with contextlib.suppress(KeyError):
            JOB_PHASE_SECONDS.remove(namespace, job, phase)
    for phase, seconds in progress.phases.items():
        JOB_PHASE_SECONDS.labels(namespace, job, phase).set(seconds)
