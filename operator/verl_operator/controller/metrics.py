"""Prometheus metrics of the operator (served by ``verl-operator run --metrics-port``)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram

from verl_operator.api.status import PHASES

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
