"""Admission's server-side dry run: the Ray pods the job would get, checked by the API server itself.

The webhook builds the job's head pod from the plan (the worker pods differ only in their role, name and
ports) and creates it with ``dryRun=All`` in the job's namespace: the API server's schema validation, Pod
Security admission, quotas and admission plugins judge the pass-through fields (``cpuPerNode``, volumes,
mounts, security contexts) at ``kubectl apply``, with their own message, instead of at pod creation.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from verl_operator.api.spec import VerlJobSpec
from verl_operator.controller.kube import drained
from verl_operator.controller.refused import refusal
from verl_operator.manifests import LaunchPlan, build_children

LOG = logging.getLogger(__name__)
#: The uid of the job in the dry-run manifests (a job being created has none yet).
DRY_RUN_UID = "00000000-0000-0000-0000-000000000000"


def dry_run_pod(
    name: str, namespace: str, spec: VerlJobSpec, plan: Mapping[str, Any], launcher_image: str | None
) -> dict[str, Any]:
    """The head pod of the job for a dry run: without owner references (the job may not exist yet) and, when
    the operator would create the job's ServiceAccount, with the namespace's default one (a dry run creates
    nothing the pod could refer to; Pod Security does not look at the ServiceAccount)."""
    job = {"metadata": {"name": name, "namespace": namespace, "uid": DRY_RUN_UID}}
    launch = LaunchPlan.from_plan_json(plan, spec, launcher_image=launcher_image)
    pod = next(c for c in build_children(job, spec, launch, 0) if c["kind"] == "Pod")
    pod["metadata"].pop("ownerReferences", None)
    if spec.security.service_account_name is None:
        pod["spec"].pop("serviceAccountName", None)
    return pod


def dry_run_problems(api: Any, pod: Mapping[str, Any]) -> list[str]:
    """Empty when the API server would create ``pod``; else its refusal as a problem line. An API error
    that is not a refusal (the API server busy) does not deny the job: pod creation will report it."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    body: Any = dict(pod)
    try:
        drained(
            client.CoreV1Api(api).create_namespaced_pod(
                pod["metadata"]["namespace"], body, dry_run="All", _preload_content=False
            )
        )
    except ApiException as exc:
        refused = refusal(exc, pod)
        if refused is None:
            LOG.warning("dry run of %s failed: %s", pod["metadata"]["name"], exc)
            return []
        return [f"spec: the API server refuses the job's Ray pods: {refused.api_message}"]
    return []
