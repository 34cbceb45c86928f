"""Admission: the checks of the validating webhook, and a self-signed serving certificate for local mode."""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pydantic import ValidationError

from verl_operator.api.errors import validation_lines
from verl_operator.api.plan import PlanResult
from verl_operator.api.spec import VerlJobSpec
from verl_operator.planner import plan_job
from verl_operator.planner.budget import Budget
from verl_operator.planner.facts import NodeFacts
from verl_operator.policy import AdminPolicy, PolicyError, access_review, load_policy, policy_problems

LOG = logging.getLogger(__name__)

#: Seconds the planner may take for one admission request: the webhook answers well inside the API server's
#: timeout (chart default 10 s) and within 1 s at the 99th percentile (docs/benchmarks.md).
PLAN_SECONDS = 0.8


def admission_problems(
    spec: Mapping[str, Any] | None,
    old_spec: Mapping[str, Any] | None,
    nodes: Sequence[Mapping[str, Any] | NodeFacts],
    clock: Callable[[], float] = time.monotonic,
    policy: AdminPolicy | None = None,
) -> list[str]:
    """Why a VerlJob must be denied (empty: admit).

    The spec is parsed by the API models (a field error names its path) and planned against the current
    nodes, within ``PLAN_SECONDS`` on ``clock``. An update that leaves the spec unchanged, or changes only
    ``suspend`` (pausing or resuming, which must work whatever the cluster holds today), is admitted without
    planning; any other update is checked in full, suspended or not. Never raises: an unexpected error is a
    problem naming ``spec``.

    Args:
        spec: The new ``spec``.
        old_spec: The old ``spec`` on UPDATE, else None.
        nodes: The cluster's Node objects, or their facts (the operator keeps them per Node).
        clock: A monotonic clock in seconds (for the planning deadline).
        policy: The administrator's policy for the pass-through fields (default: ``AdminPolicy()``).

    Returns:
        One line per problem: ``field: message (suggestions: ...)`` (:meth:`Violation.one_line`).
    """
    return check_admission(spec, old_spec, nodes, clock, policy).problems


#: Plans a spec within a budget (``WatchCache.plan``).
Planner = Callable[[VerlJobSpec, Budget], PlanResult]


@dataclass(frozen=True)
class Admission:
    """The outcome of the admission checks.

    Attributes:
        problems: Why to deny (empty: admit).
        spec: The parsed spec, when it was planned.
        plan: The feasible plan (camelCase, as in ``status.plan``), for the dry run of the pods.
    """

    problems: list[str]
    spec: VerlJobSpec | None = None
    plan: dict[str, Any] | None = None


def check_admission(
    spec: Mapping[str, Any] | None,
    old_spec: Mapping[str, Any] | None,
    nodes: Sequence[Mapping[str, Any] | NodeFacts],
    clock: Callable[[], float] = time.monotonic,
    policy: AdminPolicy | None = None,
    planner: Planner | None = None,
) -> Admission:
    """:func:`admission_problems` with the parsed spec and the plan of an admitted, planned spec.

    ``planner`` plans the parsed spec within the review's budget (the operator's: the watch cache's memo, so
    a spec planned on the same node facts is not planned again); None: ``plan_job`` on ``nodes``.
    """
    try:
        return _check(spec, old_spec, nodes, clock, policy or AdminPolicy(), planner)
    except Exception as exc:  # the last line of defence: a denial that says why, never an HTTP 500
        LOG.exception("admission check failed")
        return Admission(
            [f"spec: the operator could not check this spec ({type(exc).__name__}: {str(exc)[:200]})"]
        )


def _check(
    spec: Mapping[str, Any] | None,
    old_spec: Mapping[str, Any] | None,
    nodes: Sequence[Mapping[str, Any] | NodeFacts],
    clock: Callable[[], float],
    policy: AdminPolicy,
    planner: Planner | None = None,
) -> Admission:
    plain = json.loads(json.dumps(dict(spec or {})))  # plain types (kopf hands in mapping views)
    if old_spec is not None and _without_suspend(old_spec) == _without_suspend(plain):
        return Admission([])
    try:
        parsed = VerlJobSpec.model_validate(plain)
    except ValidationError as exc:
        return Admission(validation_lines(exc))
    denied = policy_problems(parsed, policy)
    budget = Budget(clock=clock, deadline=clock() + PLAN_SECONDS)
    result = planner(parsed, budget) if planner is not None else plan_job(parsed, list(nodes), budget=budget)
    if result.feasible:
        return Admission(denied, parsed, result.to_json_dict()["plan"])
    return Admission(denied + [v.one_line() for v in result.violations], parsed)


class PolicySource:
    """The admission policy of ``path``, read again when the file changes (a mounted ConfigMap is updated in
    place by the kubelet); the defaults when ``path`` is None."""

    def __init__(self) -> None:
        self._cache: tuple[str | None, float, AdminPolicy] | None = None

    def get(self, path: str | None) -> AdminPolicy:
        """The current policy.

        Raises:
            PolicyError: the file cannot be read or does not validate (admission then fails closed).
        """
        if path is None:
            return AdminPolicy()
        try:
            mtime = Path(path).stat().st_mtime
        except OSError as exc:
            raise PolicyError(f"cannot read the policy {path}: {exc.strerror or exc}") from exc
        if self._cache is None or self._cache[:2] != (path, mtime):
            self._cache = (path, mtime, load_policy(path))
        return self._cache[2]


def pod_permission_problems(api: Any, user: Mapping[str, Any], namespace: str) -> list[str]:
    """Empty when ``user`` may create pods in ``namespace`` (a SubjectAccessReview), else the denial."""
    from kubernetes import client

    who = user.get("username") or "the requesting user"
    try:
        body: Any = access_review(user, namespace)
        review = client.AuthorizationV1Api(api).create_subject_access_review(body)
    except Exception as exc:  # fail closed, with the reason, never an HTTP 500
        LOG.warning("SubjectAccessReview failed: %s", exc)
        reason = str(exc)
        with contextlib.suppress(TypeError, ValueError, AttributeError):
            reason = str(json.loads(getattr(exc, "body", "")).get("message") or reason)
        return [f"spec: cannot check whether {who} may create pods in namespace {namespace}: {reason[:300]}"]
    if review.status is not None and review.status.allowed:
        return []
    return [
        f"spec: {who} may not create pods in namespace {namespace}, and a VerlJob makes the operator create "
        "pods on its behalf (policy requirePodCreatePermission)"
    ]


def _without_suspend(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k != "suspend"}


def write_self_signed(
    directory: Path, hosts: Sequence[str] = ("127.0.0.1", "localhost")
) -> tuple[Path, Path]:
    """Write a self-signed serving certificate (its own CA) and key for ``hosts``; returns (cert, key) paths.

    kopf hands the certificate to the API server as the CA bundle of the webhook configuration it manages.
    """
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "verl-operator-webhook")])
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path
