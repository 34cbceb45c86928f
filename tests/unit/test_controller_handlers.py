"""The kopf registrations' contract with the settings they run under, and the webhook's review glue."""

from __future__ import annotations

import ast
import inspect
from typing import Any

import kopf

from verl_operator.controller import handlers, metrics

#: kopf decorators whose handlers need kopf's diff base (change handlers) or would want it (daemons, timers).
_DIFF_HANDLERS = frozenset({"create", "update", "resume", "delete", "field", "daemon", "timer"})


def _kopf_decorators(source: str) -> list[str]:
    """The ``kopf.on.X``, ``kopf.index``, ``kopf.daemon`` and ``kopf.timer`` names used in ``source``."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        parent = node.value
        if isinstance(parent, ast.Attribute) and isinstance(parent.value, ast.Name):
            if (parent.value.id, parent.attr) == ("kopf", "on"):
                names.append(node.attr)
        elif (
            isinstance(parent, ast.Name) and parent.id == "kopf" and node.attr in ("daemon", "timer", "index")
        ):
            names.append(node.attr)
    return names


def test_no_change_handlers_so_no_diff_base_is_built() -> None:
    """NoDiffBase (no essence built per event) is only right while nothing registers on.create/update/
    resume/delete/field or a daemon or timer: such a handler needs kopf's diff base. Read from the source of
    the only kopf module with Python's own parser, not from kopf's internals."""
    used = _kopf_decorators(inspect.getsource(handlers))
    assert not _DIFF_HANDLERS & set(used), used
    assert used.count("index") >= 4 and "event" in used, used
    storage = handlers.NoDiffBase()
    body = kopf.Body({"metadata": {"name": "j"}, "spec": {"a": 1}})
    assert storage.build(body=body) == {} and storage.fetch(body=body) is None


def test_the_decorator_scan_sees_a_change_handler() -> None:
    source = "import kopf\n\n@kopf.on.update('v1', 'pods')\ndef f(**_): ...\n\n@kopf.timer('v1', 'pods')\ndef g(**_): ...\n"
    assert _kopf_decorators(source) == ["update", "timer"]


def _review(spec: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    obj = {
        "apiVersion": "verl-operator.io/v1alpha1",
        "kind": "VerlJob",
        "metadata": {"name": "j"},
        "spec": spec,
    }
    request = {"uid": "r-1", "operation": operation, "namespace": "team", "userInfo": {"username": "u"}}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {**request, "object": obj},
    }


def _count() -> float:
    samples = metrics.ADMISSION_SECONDS.collect()[0].samples
    return next(s.value for s in samples if s.name == "verl_operator_admission_seconds_count")


def test_review_job_denies_an_invalid_spec_naming_the_field_and_times_the_review() -> None:
    before = _count()
    answer = handlers.review_job(_review({"verl": {"image": "example.com/verl:0.9.1"}}))["response"]
    assert answer["uid"] == "r-1" and answer["allowed"] is False
    assert answer["status"]["code"] == 422
    assert answer["status"]["message"].startswith("VerlJob rejected:\n- spec.model")
    assert _count() == before + 1


def test_review_job_admits_an_unchanged_update_without_planning() -> None:
    spec = {"verl": {"image": "example.com/verl:0.9.1"}}
    review = _review(spec, "UPDATE")
    review["request"]["oldObject"] = review["request"]["object"]
    assert handlers.review_job(review)["response"]["allowed"] is True


def test_deleting_a_job_wakes_the_queue_even_when_its_status_never_showed_a_placement() -> None:
    """A job whose status write failed (too large for etcd) has no status, but this process may have held
    GPUs for it: its deletion wakes every waiting job all the same."""
    import asyncio

    from verl_operator.controller.runtime import RUNTIME

    waiting = {
        "metadata": {"name": "waits", "namespace": "team", "uid": "u-w", "resourceVersion": "5"},
        "spec": {},
        "status": {"phase": "Pending"},
    }
    RUNTIME.cache.put_job(waiting)
    RUNTIME.pending.discard(("team", "waits"))
    try:
        asyncio.run(handlers.job_event(type="DELETED", namespace="team", name="never-had-a-status"))
        assert ("team", "waits") in RUNTIME.pending
    finally:
        RUNTIME.cache.drop_job(("team", "waits"))
        RUNTIME.pending.clear()


def test_queue_name_needs_kueue_installed(monkeypatch: Any) -> None:
    from verl_operator.controller import kube

    served: dict[str, bool | None] = {"answer": False}
    monkeypatch.setattr(kube, "group_served", lambda api, group: served["answer"])
    denied = kube.kueue_problems(object(), "gpu-queue")  # type: ignore[arg-type]
    assert len(denied) == 1 and denied[0].startswith("spec.scheduling.queueName: 'gpu-queue'")
    assert "Kueue is not installed" in denied[0] and kube.KUEUE_GROUP in denied[0]
    assert kube.kueue_problems(object(), None) == []  # type: ignore[arg-type]
    for answer in (True, None):  # installed; discovery failed (admission does not deny for that)
        served["answer"] = answer
        assert kube.kueue_problems(object(), "gpu-queue") == []  # type: ignore[arg-type]
    # Looked up on a create that sets a queue and on an update that sets another one only.
    changed = handlers._queue_changed
    assert changed("q", None) and not changed(None, None)
    assert not changed("q", {"scheduling": {"queueName": "q"}}) and changed(
        "r", {"scheduling": {"queueName": "q"}}
    )
    assert changed("q", {"scheduling": "not a mapping"}) and not changed(
        None, {"scheduling": {"queueName": "q"}}
    )
