"""Passed API checks that a later admission review may reuse for a while.

A review of a VerlJob asks the API server up to three things besides the planner's verdict: whether the author
may create pods in the namespace (a SubjectAccessReview), whether the job's children would be created (their
dry runs) and whether a ResourceQuota can never hold all of the job's GPUs (a dry-run pod). Two reviews that
would send the same requests get the same answers as long as nothing in the namespace's admission (RBAC, Pod
Security labels, LimitRanges, quotas' limits, other admission webhooks) changed in between. A batch of jobs
from one template differs only in the jobs' names, so after the first review the rest would pay the same
round trips for the same answers.

``Proofs`` keeps the keys of checks that passed (never of a refusal: a corrected spec or namespace is seen at
once) for ``seconds``, at most ``size`` of them (the oldest go first). The window is the price: a namespace
made stricter within it admits a job that a fresh check would deny; creating its children then refuses them
and the job reports it (``controller/refused.py``), and :meth:`forget` drops the namespace's proofs so the next
review asks again. The operator also forgets a namespace's proofs when it sees one of its ResourceQuotas or
LimitRanges change, or the namespace itself (its Pod Security labels), and every proof when a PriorityClass
is deleted (``controller/handlers.py``): a change the watches deliver before the next review is never reused
over. The administrator sets the window with the admission policy's ``reuseVerdictSeconds``
(0: every review asks).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from decimal import Decimal
from typing import Any

from verl_operator.manifests import LaunchPlan
from verl_operator.manifests.names import dns_stem

#: Proofs kept at most (a few hundred bytes each).
DEFAULT_SIZE = 4096


class Proofs:
    """Keys of passed checks with the time they passed; thread-safe (the webhook answers on many threads)."""

    def __init__(self, size: int = DEFAULT_SIZE, clock: Callable[[], float] = time.monotonic) -> None:
        self._size = size
        self._clock = clock
        self._lock = threading.Lock()
        self._passed: OrderedDict[tuple[str, Hashable], float] = OrderedDict()

    def proved(self, namespace: str, key: Hashable, seconds: float) -> bool:
        """A check with this key passed in ``namespace`` less than ``seconds`` ago."""
        if seconds <= 0:
            return False
        with self._lock:
            at = self._passed.get((namespace, key))
            if at is None:
                return False
            if self._clock() - at >= seconds:
                del self._passed[(namespace, key)]
                return False
            return True

    def passed(self, namespace: str, key: Hashable, seconds: float) -> None:
        """Record that the check ``key`` passed in ``namespace`` now (nothing when reuse is off)."""
        if seconds <= 0:
            return
        with self._lock:
            self._passed[(namespace, key)] = self._clock()
            self._passed.move_to_end((namespace, key))
            while len(self._passed) > self._size:
                self._passed.popitem(last=False)

    def forget(self, namespace: str) -> None:
        """Drop every proof of ``namespace`` (its admission refused something the proofs let through)."""
        with self._lock:
            for key in [k for k in self._passed if k[0] == namespace]:
                del self._passed[key]

    def clear(self) -> None:
        """Drop every proof (a change that may refuse children in any namespace)."""
        with self._lock:
            self._passed.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._passed)


#: The proofs of this process's webhook.
PROOFS = Proofs()


def permission_key(user: Mapping[str, Any]) -> tuple[str, ...]:
    """The key of a pod-create permission check: who asks (name, uid, groups and extra, as the
    SubjectAccessReview sends them)."""
    extra = user.get("extra") or {}
    return (
        "permission",
        str(user.get("username") or ""),
        str(user.get("uid") or ""),
        json.dumps(sorted(user.get("groups") or []), separators=(",", ":")),
        json.dumps(extra, sort_keys=True, separators=(",", ":"), default=str),
    )


def children_key(name: str, spec: Mapping[str, Any], launch: LaunchPlan) -> str:
    """The key of a children's dry run: what the children are built from (the spec and the launch plan, which
    holds the launcher image and none of the plan's node counts or samples: a wave of node heartbeats does
    not make a new key) and the shape of the job's name, which the children carry in their names: its length
    and its DNS stem's (the API server's rules on a name are on its length and its characters; the name is a
    DNS subdomain, and where a child needs a DNS label the stem is one, ``manifests/names.py``)."""
    stem = dns_stem(name)
    doc = {
        "spec": spec,
        "launch": dataclasses.asdict(launch),
        "name": [len(name), len(stem), stem == name],
    }
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    return "children:" + hashlib.sha256(blob.encode()).hexdigest()


def quota_key(totals: Mapping[str, Decimal], priority_class: str | None) -> str:
    """The key of a job-wide quota check of a job's ``totals`` (:func:`~verl_operator.controller.quota.job_totals`)
    under ``priority_class`` (quotas may be scoped by it)."""
    text = ",".join(f"{k}={v}" for k, v in sorted(totals.items()))
    return f"quota:{priority_class or ''}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"
