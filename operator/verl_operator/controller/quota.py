"""Whether the ResourceQuotas of a namespace can ever hold a whole job (pure).

The dry run of a job's pods judges each pod alone against the quotas; a quota that every pod fits may still be
below the job: ``pods: 1`` for two pods, ``requests.cpu: 64`` for two pods of 48 CPUs, 12 GPUs for two pods of
8. :func:`job_totals` adds up what the quota admission plugin would charge for all of the job's pods (a pod's
charge per resource: the larger of its containers' sum and its largest init container, as Kubernetes
computes a pod's effective request) and :func:`quota_problems` compares the totals with each quota's ``hard``
limits. Only a limit the job can never fit counts (its total is above the limit itself); what other pods use
now is left to the pods' creation, which waits for it (``QuotaExceeded``). A quota with scopes applies when
they select the job's pods (``PriorityClass`` by the job's class, ``NotTerminating``, ``NotBestEffort``); a
scope not understood leaves that quota to the dry run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from verl_operator.api.quantity import QuantityError, parse_quantity

GPU = "nvidia.com/gpu"
_NATIVE = ("cpu", "memory", "ephemeral-storage")


def _pod_charge(pod: Mapping[str, Any], kind: str) -> dict[str, Decimal]:
    """One pod's ``requests`` or ``limits`` as the quota plugin charges them (effective values)."""
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        for name, text in ((container.get("resources") or {}).get(kind) or {}).items():
            total[name] = total.get(name, Decimal(0)) + _q(text)
    for container in spec.get("initContainers") or []:
        for name, text in ((container.get("resources") or {}).get(kind) or {}).items():
            total[name] = max(total.get(name, Decimal(0)), _q(text))
    for name, text in (spec.get("overhead") or {}).items():
        total[name] = total.get(name, Decimal(0)) + _q(text)
    return total


def _q(text: Any) -> Decimal:
    try:
        return parse_quantity(str(text))
    except QuantityError:
        return Decimal(0)


def job_totals(pods: Sequence[Mapping[str, Any]]) -> dict[str, Decimal]:
    """What every quota key would charge for all of ``pods``: ``pods`` and ``count/pods``, ``requests.X``
    and ``limits.X`` for every resource, and ``cpu``/``memory``/``ephemeral-storage`` and an extended
    resource's bare name for its requests (the quota plugin's spellings).

    Example: two pods of 8 GPUs and 48 CPUs requested -> ``pods: 2, requests.cpu: 96, cpu: 96,
    requests.nvidia.com/gpu: 16, ...``.
    """
    out: dict[str, Decimal] = {"pods": Decimal(len(pods)), "count/pods": Decimal(len(pods))}
    for pod in pods:
        for kind in ("requests", "limits"):
            for name, value in _pod_charge(pod, kind).items():
                out[f"{kind}.{name}"] = out.get(f"{kind}.{name}", Decimal(0)) + value
                if kind == "requests":
                    out[name] = out.get(name, Decimal(0)) + value
    return out


def _selects(quota: Mapping[str, Any], priority_class: str | None) -> bool | None:
    """Whether the quota's scopes select the job's pods (True without scopes); None: a scope not understood."""
    spec = quota.get("spec") or {}
    scopes = list(spec.get("scopes") or [])
    selector = [dict(e) for e in ((spec.get("scopeSelector") or {}).get("matchExpressions") or [])]
    for scope in scopes:
        selector.append({"scopeName": scope, "operator": "Exists"})
    for expr in selector:
        name, op, values = expr.get("scopeName"), expr.get("operator"), list(expr.get("values") or [])
        if name in ("NotTerminating", "NotBestEffort"):
            continue  # the Ray pods have no activeDeadlineSeconds and request resources
        if name in ("Terminating", "BestEffort", "CrossNamespacePodAffinity"):
            return False
        if name != "PriorityClass":
            return None
        if op == "Exists":
            ok = priority_class is not None
        elif op == "DoesNotExist":
            ok = priority_class is None
        elif op == "In":
            ok = priority_class in values
        elif op == "NotIn":
            ok = priority_class is not None and priority_class not in values
        else:
            return None
        if not ok:
            return False
    return True


#: The spec field a limit's resource is set by, and the suggestion besides raising the quota.
_FIELDS: dict[str, tuple[str, str]] = {
    "pods": ("spec.resources.gpusPerNode", "use more GPUs per pod (fewer pods)"),
    "cpu": ("spec.resources.cpuPerNode", "lower spec.resources.cpuPerNode"),
    "memory": ("spec.resources.memoryPerNode", "lower spec.resources.memoryPerNode"),
    GPU: ("spec.resources.gpus", "lower spec.resources.gpus"),
}


def _resource(key: str) -> str:
    """``requests.cpu`` -> ``cpu``; ``count/pods`` -> ``pods``."""
    if key in ("pods", "count/pods"):
        return "pods"
    for prefix in ("requests.", "limits."):
        if key.startswith(prefix):
            return key[len(prefix) :]
    return key


def quota_problems(
    quotas: Iterable[Mapping[str, Any]],
    totals: Mapping[str, Decimal],
    pods: int,
    priority_class: str | None = None,
) -> list[str]:
    """One line per quota limit the job's ``totals`` exceed, naming the field, the totals and the quota.

    Example: ``pods: 1`` and a job of 2 pods -> ``spec.resources.gpusPerNode: the job's 2 Ray pods in all
    exceed ResourceQuota team/small (pods: 1 < 2); raise the quota or use more GPUs per pod (fewer pods)``.
    """
    out: list[str] = []
    for quota in sorted(quotas, key=lambda q: str((q.get("metadata") or {}).get("name", ""))):
        if _selects(quota, priority_class) is not True:
            continue
        meta = quota.get("metadata") or {}
        where = f"ResourceQuota {meta.get('namespace', '')}/{meta.get('name', '')}"
        for key, text in sorted(((quota.get("spec") or {}).get("hard") or {}).items()):
            need = totals.get(key)
            if need is None or need <= _q(text):
                continue
            resource = _resource(key)
            field, fix = _FIELDS.get(resource, ("spec.resources", "lower what the pods request"))
            shown = _shown(need, resource)
            if resource == "pods":
                what = f"{pods} Ray pods in all"
            elif resource == GPU:
                what = f"{shown} GPUs in all"
            else:
                what = f"{pods} Ray pods' {key} ({shown} in all)"
            out.append(
                f"{field}: the job's {what} exceed {where} ({key}: {text} < {shown}); raise the quota or {fix}"
            )
    return out


def _shown(value: Decimal, resource: str = "") -> str:
    """A total as a plain number (``96``, ``0.5``), memory and storage in Gi (``512Gi``)."""
    if resource in ("memory", "ephemeral-storage"):
        return f"{_shown(value / Decimal(2**30))}Gi"
    text = format(value.normalize(), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text
