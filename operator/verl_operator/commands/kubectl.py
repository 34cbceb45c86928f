"""``kubectl verl``: the kubectl plugin (``kubectl-verl`` on ``PATH``) against the current kubeconfig context.

``plan -f job.yaml`` (the context's live nodes), ``import SCRIPT``, ``status JOB``, ``logs JOB [-f]`` and
``top``, with kubectl's conventions: ``--kubeconfig`` (else ``$KUBECONFIG``, else ``~/.kube/config``),
``--context``, ``-n/--namespace`` (else the context's namespace, else ``default``), ``-A/--all-namespaces``
(``top``), ``-o table|json|yaml``. Exit codes: 0 done, 1 an error from the cluster (the job or its head pod
not found, the API server unreachable) or an infeasible plan, 2 bad usage or an unreadable file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

import yaml

from verl_operator.api.spec import GROUP, PLURAL, VERSION
from verl_operator.commands import import_script, kubectl_views
from verl_operator.commands.plan import (
    EXIT_FEASIBLE,
    EXIT_INFEASIBLE,
    EXIT_USAGE,
    InputError,
    list_nodes,
    load_job,
    write_result,
)
from verl_operator.manifests.children import CONTAINER
from verl_operator.manifests.names import LABEL_ATTEMPT, LABEL_JOB, LABEL_ROLE, ChildNames
from verl_operator.planner import plan_job
from verl_operator.scripts.importer import ScriptImportError

EXIT_OK = 0
#: kubectl's exit code for an error from the cluster.
EXIT_ERROR = 1


class PluginError(Exception):
    """An error from the cluster or the kubeconfig (exit 1), printed as kubectl prints its own."""


def _kube_flags(parser: argparse.ArgumentParser, output: bool = True, all_namespaces: bool = False) -> None:
    parser.add_argument(
        "--kubeconfig", help="Path to the kubeconfig file (default: $KUBECONFIG, ~/.kube/config)."
    )
    parser.add_argument("--context", help="The kubeconfig context to use (default: the current context).")
    parser.add_argument("-n", "--namespace", help="The namespace (default: the context's, else default).")
    if all_namespaces:
        parser.add_argument(
            "-A", "--all-namespaces", action="store_true", help="Every namespace (ignores --namespace)."
        )
    if output:
        parser.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")


def add_parser(subparsers: Any) -> None:
    """Register ``plan``, ``import``, ``status``, ``logs`` and ``top``."""
    plan = subparsers.add_parser(
        "plan",
        help="Plan a VerlJob on the context's live nodes (exit 0 feasible, 1 infeasible, 2 bad input).",
    )
    plan.add_argument("-f", "--filename", required=True, help="The VerlJob YAML file.")
    _kube_flags(plan)
    plan.set_defaults(func=run_plan)

    imported = subparsers.add_parser(
        "import", help="Write a VerlJob from a verl launch script (read, never run): verl-operator import."
    )
    import_script.add_import_arguments(imported)
    imported.add_argument(
        "-n", "--namespace", help="metadata.namespace (default: none, kubectl's namespace)."
    )
    imported.set_defaults(func=run_import)

    status = subparsers.add_parser("status", help="A job's phase, plan, placement, progress and advice.")
    status.add_argument("job", metavar="JOB")
    _kube_flags(status)
    status.set_defaults(func=run_status)

    logs = subparsers.add_parser("logs", help="verl's output on the job's head pod.")
    logs.add_argument("job", metavar="JOB")
    logs.add_argument("-f", "--follow", action="store_true", help="Stream the output as it is written.")
    logs.add_argument(
        "--tail", type=int, default=None, help="Lines of the recent output to show (default all)."
    )
    logs.add_argument("--all", action="store_true", help="Also the Ray head's own lines ([ray-head] ...).")
    _kube_flags(logs, output=False)
    logs.set_defaults(func=run_logs)

    top = subparsers.add_parser("top", help="Every job's step, step time, generation share and throughput.")
    _kube_flags(top, all_namespaces=True)
    top.set_defaults(func=run_top)


def connect(args: argparse.Namespace) -> tuple[Any, str]:
    """``(API client, namespace)`` of the kubeconfig context kubectl would use.

    Raises:
        PluginError: the kubeconfig cannot be loaded or has no such context.
    """
    from kubernetes import config

    try:
        contexts, current = config.list_kube_config_contexts(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
        api = config.new_client_from_config(config_file=args.kubeconfig, context=args.context)  # type: ignore[no-untyped-call]
    except Exception as exc:  # a missing file, bad YAML, an unknown context: kubectl says the same
        raise PluginError(f"error: cannot load the kubeconfig: {exc}") from exc
    context = next((c for c in contexts if c.get("name") == args.context), None) if args.context else current
    namespace = args.namespace or ((context or {}).get("context") or {}).get("namespace") or "default"
    return api, namespace


def _server_error(exc: Exception, what: str) -> PluginError:
    """kubectl's message for an API error: ``Error from server (NotFound): ...``."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        reason = exc.reason or "Error"
        try:
            message = json.loads(exc.body or "{}").get("message") or f"{what}: {reason}"
            reason = json.loads(exc.body or "{}").get("reason") or reason
        except (ValueError, AttributeError):
            message = f"{what}: {reason}"
        if what not in message:
            message = f"{message} ({what})"
        return PluginError(f"Error from server ({reason}): {message}")
    return PluginError(f"error: {what}: {exc}")


def get_job(api: Any, namespace: str, name: str) -> dict[str, Any]:
    """The VerlJob object.

    Raises:
        PluginError: not found, or the API server's error.
    """
    from kubernetes import client

    try:
        obj: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name
        )
    except Exception as exc:
        raise _server_error(exc, f'verljobs.{GROUP} "{name}"') from exc
    return dict(obj)


def _dump(obj: Any, fmt: str) -> str:
    return json.dumps(obj, indent=2) + "\n" if fmt == "json" else yaml.safe_dump(obj, sort_keys=False)


def run_plan(args: argparse.Namespace) -> int:
    """``kubectl verl plan -f job.yaml``."""
    try:
        job = load_job(args.filename)
    except InputError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE
    api, _ = connect(args)
    try:
        nodes = list_nodes(api, f"context {args.context or 'current'}")
    except InputError as exc:
        raise PluginError(f"error: {exc}") from exc
    result = plan_job(job.spec, nodes)
    write_result(result, args.output, sys.stdout)
    return EXIT_FEASIBLE if result.feasible else EXIT_INFEASIBLE


def run_import(args: argparse.Namespace) -> int:
    """``kubectl verl import SCRIPT``."""
    try:
        sys.stdout.write(import_script.import_to_text(args, args.namespace))
    except ScriptImportError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE
    return EXIT_OK


def run_status(args: argparse.Namespace) -> int:
    """``kubectl verl status JOB``."""
    api, namespace = connect(args)
    job = get_job(api, namespace, args.job)
    sys.stdout.write(_dump(job, args.output) if args.output != "table" else kubectl_views.status_text(job))
    return EXIT_OK


def head_pod(api: Any, namespace: str, job: Mapping[str, Any]) -> str:
    """The head pod of the job's current Ray cluster: the labelled head of the highest attempt, else the
    name the operator gives it (``<job>-r<attempt>-head``)."""
    from kubernetes import client

    name = str(job["metadata"]["name"])
    try:
        pods = client.CoreV1Api(api).list_namespaced_pod(
            namespace, label_selector=f"{LABEL_JOB}={name},{LABEL_ROLE}=head"
        )
    except Exception as exc:
        raise _server_error(exc, f"the head pod of {name}") from exc
    labelled: list[tuple[int, str]] = []
    for pod in pods.items:
        meta: Any = pod.metadata
        attempt_label = str((meta.labels or {}).get(LABEL_ATTEMPT, "0"))
        if attempt_label.isdigit():
            labelled.append((int(attempt_label), str(meta.name)))
    if labelled:
        return max(labelled)[1]
    attempt = kubectl_views.dig(job, "status", "attempt")
    return ChildNames(name, namespace).pod(attempt if isinstance(attempt, int) else 0, 0)


def run_logs(args: argparse.Namespace) -> int:
    """``kubectl verl logs JOB [-f]``."""
    from kubernetes import client

    api, namespace = connect(args)
    job = get_job(api, namespace, args.job)
    pod = head_pod(api, namespace, job)
    try:
        response: Any = client.CoreV1Api(api).read_namespaced_pod_log(
            pod,
            namespace,
            container=CONTAINER,
            follow=args.follow,
            tail_lines=args.tail,
            _preload_content=False,
        )
        chunks = response.stream(amt=4096, decode_content=True)
        for line in kubectl_views.verl_lines(kubectl_views.lines_of(chunks), everything=args.all):
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
    except KeyboardInterrupt:
        return EXIT_OK
    except Exception as exc:
        raise _server_error(exc, f"the log of pod {pod} (the head of {args.job})") from exc
    return EXIT_OK


def run_top(args: argparse.Namespace) -> int:
    """``kubectl verl top [-A]``."""
    from kubernetes import client

    api, namespace = connect(args)
    custom = client.CustomObjectsApi(api)
    try:
        if args.all_namespaces:
            listed: Any = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        else:
            listed = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    except Exception as exc:
        raise _server_error(exc, f"verljobs.{GROUP}") from exc
    jobs = sorted(
        (j for j in listed.get("items") or [] if isinstance(j, dict)),
        key=lambda j: (j["metadata"].get("namespace", ""), j["metadata"]["name"]),
    )
    if args.output != "table":
        rows = [
            {
                "namespace": j["metadata"].get("namespace"),
                "name": j["metadata"]["name"],
                "phase": kubectl_views.dig(j, "status", "phase"),
                "progress": kubectl_views.dig(j, "status", "progress"),
            }
            for j in jobs
        ]
        sys.stdout.write(_dump(rows, args.output))
    elif not jobs:
        where = "any namespace" if args.all_namespaces else f"{namespace} namespace"
        sys.stderr.write(f"No resources found in {where}.\n")
    else:
        sys.stdout.write(kubectl_views.top_table(jobs, args.all_namespaces))
    return EXIT_OK


def call(args: argparse.Namespace) -> int:
    """Run the chosen subcommand; an error from the cluster is printed as kubectl prints it (exit 1)."""
    try:
        code: int = args.func(args)
    except PluginError as exc:
        sys.stderr.write(f"{exc}\n")
        return EXIT_ERROR
    return code
