"""Admission's server-side dry run: the children the job would get, checked by the API server itself.

The webhook builds every child the operator will create from the plan (the ServiceAccount when the operator
creates it, the launch ConfigMap, the headless Service, the head pod and one worker pod: the other workers
differ from it only in their index) and creates each with ``dryRun=All`` in the job's namespace: the API
server's schema validation (names included), Pod Security admission, quotas and admission plugins judge the
pass-through fields (``cpuPerNode``, volumes, mounts, security contexts) at ``kubectl apply``, with their own
message, instead of at creation. A Volcano PodGroup is not dry-run (its CRD may be absent where the job is
checked; it carries no user input).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from typing import Any

from verl_operator.api.spec import VerlJobSpec
from verl_operator.controller.kube import CORE_PLURALS
from verl_operator.controller.rawapi import RawAPI, core_path
from verl_operator.controller.refused import refusal
from verl_operator.manifests import LaunchPlan, build_children

LOG = logging.getLogger(__name__)
#: The uid of the job in the dry-run manifests (a job being created has none yet).
DRY_RUN_UID = "00000000-0000-0000-0000-000000000000"
#: The kinds dry-run (core/v1, each created by a POST to its plural).
CREATE = tuple(CORE_PLURALS)


def dry_run_children(
    name: str, namespace: str, spec: VerlJobSpec, plan: Mapping[str, Any], launcher_image: str | None
) -> list[dict[str, Any]]:
    """The children of the job for a dry run, in creation order: without owner references (the job may not
    exist yet), the pods but the head and the first worker left out and, when the operator would create the
    job's ServiceAccount, the pods with the namespace's default one (a dry run creates nothing the pods could
    refer to; Pod Security does not look at the ServiceAccount)."""
    job = {"metadata": {"name": name, "namespace": namespace, "uid": DRY_RUN_UID}}
    launch = LaunchPlan.from_plan_json(plan, spec, launcher_image=launcher_image)
    out: list[dict[str, Any]] = []
    pods = 0
    for child in build_children(job, spec, launch, 0):
        if child["kind"] not in CREATE or (child["kind"] == "Pod" and pods == 2):
            continue
        child["metadata"].pop("ownerReferences", None)
        if child["kind"] == "Pod":
            pods += 1
            if spec.security.service_account_name is None:
                child["spec"].pop("serviceAccountName", None)
        out.append(child)
    return out


def job_pods(
    name: str, namespace: str, spec: VerlJobSpec, plan: Mapping[str, Any], launcher_image: str | None
) -> list[dict[str, Any]]:
    """Every Ray pod of the job's first attempt, as the operator would create them (for the quota totals)."""
    job = {"metadata": {"name": name, "namespace": namespace, "uid": DRY_RUN_UID}}
    launch = LaunchPlan.from_plan_json(plan, spec, launcher_image=launcher_image)
    return [c for c in build_children(job, spec, launch, 0) if c["kind"] == "Pod"]


def dry_run_pod(
    name: str, namespace: str, spec: VerlJobSpec, plan: Mapping[str, Any], launcher_image: str | None
) -> dict[str, Any]:
    """The head pod of :func:`dry_run_children`."""
    return next(
        c for c in dry_run_children(name, namespace, spec, plan, launcher_image) if c["kind"] == "Pod"
    )


def dry_run_problems(
    api: Any,
    children: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    calls: Executor | None = None,
) -> list[str]:
    """Empty when the API server would create every child; else one problem line per refused child (the
    first refused pod only: the worker pod would repeat the head pod's refusal). An API error that is not a
    refusal (the API server busy, a name already taken) does not deny the job: creation will report it.

    With ``calls`` the children are dry-run at once on it (each is its own API request; the review waits for
    the slowest one, not for their sum); the problems are the same and in the same order."""
    core = RawAPI(api)
    items = [children] if isinstance(children, Mapping) else list(children)
    if calls is None or len(items) < 2:
        refused = [_dry_run_one(core, child) for child in items]
    else:
        futures = [calls.submit(_dry_run_one, core, child) for child in items]
        refused = [f.result() for f in futures]
    out: list[str] = []
    for child, problem in zip(items, refused, strict=True):
        if problem is None:
            continue
        out.append(problem)
        if child["kind"] == "Pod":
            break
    return out


def _dry_run_one(core: RawAPI, child: Mapping[str, Any]) -> str | None:
    """The problem line of one child's dry run, or None when the API server would create it (or answered
    with an error that is not a refusal, logged)."""
    from kubernetes.client.exceptions import ApiException

    meta = child["metadata"]
    try:
        path = core_path(str(meta["namespace"]), CORE_PLURALS[str(child["kind"])])
        core.request("POST", path, dict(child), query={"dryRun": "All"}, decode=False)
    except ApiException as exc:
        refused = refusal(exc, child)
        if refused is None or not refused.denies_admission:  # busy, or a quota others use now
            LOG.warning("dry run of %s %s failed: %s", child["kind"], meta["name"], exc)
            return None
        what = "the job's Ray pods" if child["kind"] == "Pod" else f"the job's {child['kind']} {meta['name']}"
        return f"spec: the API server refuses {what}: {refused.api_message}"
    return None
