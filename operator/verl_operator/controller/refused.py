"""Why the API server will not create a child, told apart from errors a retry can fix (pure: no client).

Two verdicts:

* :class:`ChildRefused`: the manifest itself is refused (400 or 422: its schema; 403 from Pod Security).
  The same manifest can never be created: the job is ``Invalid`` until its spec changes.
* :class:`ChildBlocked`: the cluster refuses it *now* (a 403 of another admission plugin: the ServiceAccount
  or the PriorityClass it names does not exist, a ResourceQuota is exceeded; or its name is taken by an
  object the job does not own). The job gives its GPUs back, waits ``Pending`` with the object and the cause,
  and is tried again when the cause may have gone.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from verl_operator.api.quantity import parse_quantity


class ChildRefused(RuntimeError):
    """The API server refused a child for good (400 or 422: its schema or an admission plugin; 403 from Pod
    Security); retrying the same manifest cannot succeed."""

    def __init__(self, kind: str, name: str, status: int, message: str) -> None:
        super().__init__(f"the API server refused {kind} {name} ({status}): {message}")
        self.kind, self.name, self.status, self.api_message = kind, name, status, message

    @property
    def denies_admission(self) -> bool:
        """A dry run at admission that meets this refusal denies the job."""
        return True


class ChildBlocked(ChildRefused):
    """The cluster cannot take a child now; it may once an object appears, a quota frees up or a name is
    released.

    Attributes:
        reason: The CamelCase reason (``ServiceAccountNotFound``, ``PriorityClassNotFound``, ``QuotaExceeded``,
            ``NameTaken``, ``PodsForbidden``).
        blocker: The object in the way, ``Kind namespace/name`` (or ``Kind name`` when cluster-scoped).
        cause: What is wrong with it, in a few words.
        transient: Only the current use of a quota is in the way (the request fits the quota's limit):
            admission does not deny the job for it.
        limited: An exceeded quota's limits as its message gives them (``requests.nvidia.com/gpu -> 8``).
    """

    def __init__(
        self,
        kind: str,
        name: str,
        status: int,
        message: str,
        *,
        reason: str,
        blocker: str,
        cause: str,
        transient: bool = False,
        limited: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(kind, name, status, message)
        self.reason, self.blocker, self.cause, self.transient = reason, blocker, cause, transient
        self.limited = dict(limited or {})

    @property
    def denies_admission(self) -> bool:
        """Admission denies a job whose pods cannot be created (a missing ServiceAccount or PriorityClass, a
        quota below the pod's request), not one that waits only for a quota other pods use now."""
        return not self.transient

    def summary(self) -> str:
        """The object, the cause and the child, the way the job's condition starts."""
        return f"{self.blocker} {self.cause}: {self.kind} {self.name} cannot be created"


#: The reasons of :class:`ChildBlocked`: a job ``Pending`` with one of them holds no GPUs and is not queued.
BLOCKED_REASONS = frozenset(
    {"ServiceAccountNotFound", "PriorityClassNotFound", "QuotaExceeded", "NameTaken", "PodsForbidden"}
)
#: Statuses of a create that a retry of the same manifest cannot fix.
REFUSED_STATUSES = frozenset({400, 422})
#: The 403 that is about the manifest (Pod Security admission); other 403s (RBAC, an exceeded quota) pass.
POD_SECURITY_REFUSAL = "violates PodSecurity"

_SERVICE_ACCOUNT = re.compile(r'serviceaccount "([^"]+)" not found|service account ([\w.-]+/[\w.-]+)')
_PRIORITY_CLASS = re.compile(r"no PriorityClass with name ([\w.-]+) was found")
_QUOTA = re.compile(r"exceeded quota: ([\w.-]+)")
#: The quota plugin's refusal of a pod whose containers leave out a resource the quota limits (a quota of
#: ``limits.cpu`` needs every container to set a CPU limit): ``failed quota: q: must specify limits.cpu``.
_QUOTA_MUST_SPECIFY = re.compile(r"failed quota: ([\w.-]+): must specify ([^;\n]+(?:; [^;\n]+)*)")
_QUOTA_AMOUNTS = re.compile(r"(requested|used|limited): ([^,]+(?:,[^,:]+=[^,]+)*)")


def api_message(exc: Any) -> str:
    """The API server's ``message`` of an ``ApiException`` (its reason phrase when the body has none)."""
    message = str(getattr(exc, "reason", "") or "")
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        message = str(json.loads(exc.body).get("message") or message)
    return message


def refusal(exc: Any, manifest: Mapping[str, Any]) -> ChildRefused | None:
    """The :class:`ChildRefused` (or :class:`ChildBlocked`) of an ``ApiException`` of a create, or None when
    it may simply be retried (the API server busy, a timeout)."""
    status = getattr(exc, "status", None)
    return classify(status, api_message(exc), manifest) if isinstance(status, int) else None


def classify(status: int, message: str, manifest: Mapping[str, Any]) -> ChildRefused | None:
    """The verdict on a create of ``manifest`` answered ``status`` with ``message`` (see the module)."""
    kind, name = str(manifest["kind"]), str(manifest["metadata"]["name"])
    namespace = str(manifest["metadata"].get("namespace") or "default")
    if status in REFUSED_STATUSES or (status == 403 and POD_SECURITY_REFUSAL in message):
        return ChildRefused(kind, name, status, message)
    if status != 403:
        return None
    if match := _SERVICE_ACCOUNT.search(message):
        account = match.group(1) or match.group(2).split("/", 1)[1]
        return ChildBlocked(
            kind,
            name,
            status,
            message,
            reason="ServiceAccountNotFound",
            blocker=f"ServiceAccount {namespace}/{account}",
            cause="does not exist",
        )
    if match := _PRIORITY_CLASS.search(message):
        return ChildBlocked(
            kind,
            name,
            status,
            message,
            reason="PriorityClassNotFound",
            blocker=f"PriorityClass {match.group(1)}",
            cause="does not exist",
        )
    if match := _QUOTA_MUST_SPECIFY.search(message):
        return ChildBlocked(
            kind,
            name,
            status,
            message,
            reason="PodsForbidden",
            blocker=f"ResourceQuota {namespace}/{match.group(1)}",
            cause=(
                f"requires every container to set what it limits ({match.group(2).strip()}), which the Ray "
                "pods' containers do not"
            ),
        )
    if match := _QUOTA.search(message):
        return ChildBlocked(
            kind,
            name,
            status,
            message,
            reason="QuotaExceeded",
            blocker=f"ResourceQuota {namespace}/{match.group(1)}",
            cause="is exceeded",
            transient=quota_fits_alone(message),
            limited=quota_amounts(message).get("limited"),
        )
    return ChildBlocked(
        kind,
        name,
        status,
        message,
        reason="PodsForbidden",
        blocker=f"{kind} {namespace}/{name}",
        cause="is forbidden",
    )


def _amounts(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(",") if "=" in part)


def quota_amounts(message: str) -> dict[str, dict[str, str]]:
    """``requested``, ``used`` and ``limited`` of an exceeded-quota message, each resource -> quantity."""
    return {
        m.group(1): {k.strip(): v.strip() for k, v in _amounts(m.group(2)).items()}
        for m in _QUOTA_AMOUNTS.finditer(message)
    }


def gpu_limit(limited: Mapping[str, str]) -> Decimal | None:
    """The GPUs an exceeded quota allows in all (its lowest GPU limit), None when it limits none."""
    values = []
    for key in GPU_QUOTA_KEYS:
        with contextlib.suppress(ValueError, ArithmeticError):
            if key in limited:
                values.append(parse_quantity(limited[key]))
    return min(values) if values else None


#: The quota keys that limit GPUs.
GPU_QUOTA_KEYS = ("requests.nvidia.com/gpu", "limits.nvidia.com/gpu", "nvidia.com/gpu")


def quota_fits_alone(message: str) -> bool:
    """An exceeded-quota message whose request fits every limit (only what others use now is in the way).

    The quota admission plugin answers ``exceeded quota: q, requested: requests.nvidia.com/gpu=8, used:
    requests.nvidia.com/gpu=4, limited: requests.nvidia.com/gpu=8``. A message it cannot read is not transient.
    """
    found = quota_amounts(message)
    requested, limited = found.get("requested"), found.get("limited")
    if not requested or not limited:
        return False
    try:
        return all(
            k in limited and parse_quantity(v) <= parse_quantity(limited[k]) for k, v in requested.items()
        )
    except (ValueError, ArithmeticError):
        return False


def owner_uids(obj: Mapping[str, Any]) -> set[str]:
    """The uids named by an object's ``ownerReferences``."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return {str(r.get("uid")) for r in refs if isinstance(r, Mapping) and r.get("uid")}


def name_taken(existing: Mapping[str, Any], manifest: Mapping[str, Any]) -> ChildBlocked | None:
    """None when ``existing`` (the object a create answered 409 for) is owned by the job that ``manifest``
    belongs to; else the :class:`ChildBlocked` that names it (the operator never adopts, overwrites or
    deletes it)."""
    mine = owner_uids(manifest)
    if mine and mine & owner_uids(existing):
        return None
    kind, name = str(manifest["kind"]), str(manifest["metadata"]["name"])
    namespace = str(manifest["metadata"].get("namespace") or "default")
    refs = (existing.get("metadata") or {}).get("ownerReferences") or []
    # A VerlJob of the same name: an earlier job deleted, its children not yet garbage-collected.
    owner = ", ".join(
        f"{r.get('kind')} {r.get('name')} (uid {r.get('uid')})" for r in refs if isinstance(r, Mapping)
    )
    return ChildBlocked(
        kind,
        name,
        409,
        f"{kind.lower()} {name!r} already exists, owned by {owner or 'nobody'}",
        reason="NameTaken",
        blocker=f"{kind} {namespace}/{name}",
        cause="exists and is not owned by the job",
    )
