"""The Argo CD health check (docs/argocd-health.lua) run by a real Lua 5.1 interpreter, as Argo CD runs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lupa.lua51 as lua51
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

DOCS = Path(__file__).resolve().parents[2] / "docs"
SCRIPT = (DOCS / "argocd-health.lua").read_text()

#: The health statuses Argo CD understands (gitops-engine ``health.HealthStatusCode``).
ARGO_STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}

#: kstatus summary conditions per phase, as docs/operator.md specifies them: (Ready, Reconciling, Stalled).
SUMMARY = {
    "Invalid": (False, False, True),
    "Pending": (False, True, False),
    "Starting": (False, True, False),
    "Running": (True, False, False),
    "Succeeded": (True, False, False),
    "Failed": (False, False, True),
    "Suspended": (False, False, False),
}


def to_lua(runtime: Any, value: Any) -> Any:
    if isinstance(value, dict):
        return runtime.table_from({k: to_lua(runtime, v) for k, v in value.items()})
    if isinstance(value, list):
        return runtime.table_from([to_lua(runtime, v) for v in value])
    return value


def health(obj: dict[str, Any]) -> tuple[str, str]:
    """Run the script the way Argo CD does: ``obj`` is a global, the chunk returns ``hs``.

    Argo CD's interpreter has no ``os``, ``io`` or module loading, so neither has this one.
    """
    runtime = lua51.LuaRuntime(unpack_returned_tuples=True)
    g = runtime.globals()
    for unsafe in ("os", "io", "require", "dofile", "loadfile", "package", "debug"):
        g[unsafe] = None
    g.obj = to_lua(runtime, obj)
    hs = runtime.execute(SCRIPT)
    return str(hs["status"]), str(hs["message"])


def conditions(phase: str, reason: str, message: str, generation: int) -> list[dict[str, Any]]:
    ready, reconciling, stalled = SUMMARY[phase]
    return [
        {
            "type": kind,
            "status": "True" if value else "False",
            "observedGeneration": generation,
            "lastTransitionTime": "2026-01-01T00:00:00Z",
            "reason": reason if value else phase,
            "message": message,
        }
        for kind, value in (("Ready", ready), ("Reconciling", reconciling), ("Stalled", stalled))
    ]


def job(
    phase: str | None, reason: str = "", message: str = "", generation: int = 2, observed: int = 2
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "verl-operator.io/v1alpha1",
        "kind": "VerlJob",
        "metadata": {"name": "grpo", "namespace": "ml", "generation": generation},
        "spec": {"resources": {"gpus": 16}},
    }
    if phase is not None:
        obj["status"] = {
            "phase": phase,
            "reason": reason,
            "message": message,
            "observedGeneration": observed,
            "mesh": "dp16 sp1 tp2",
            "conditions": conditions(phase, reason, message, observed),
        }
    return obj


@pytest.mark.parametrize(
    ("phase", "reason", "message", "expected"),
    [
        pytest.param("Running", "AllPodsRunning", "3 pods running", "Healthy", id="running"),
        pytest.param("Succeeded", "Succeeded", "the head pod exited 0", "Healthy", id="succeeded"),
        pytest.param(
            "Pending", "InsufficientCapacity", "needs 2 nodes with 8 free GPUs", "Progressing", id="pending"
        ),
        pytest.param("Starting", "PodsStarting", "1 of 3 pods running", "Progressing", id="starting"),
        pytest.param(
            "Invalid",
            "PlanInfeasible",
            "spec.data.trainBatchSize: 64 is not divisible",
            "Degraded",
            id="invalid",
        ),
        pytest.param(
            "Failed", "BackoffLimitExceeded", "pod grpo-r1-head exited with code 10", "Degraded", id="failed"
        ),
        pytest.param("Suspended", "Suspended", "spec.suspend is true", "Suspended", id="suspended"),
    ],
)
def test_each_phase_maps_to_its_health(phase: str, reason: str, message: str, expected: str) -> None:
    status, text = health(job(phase, reason, message))
    assert status == expected
    assert phase in text
    assert message in text


def test_reason_is_shown_when_it_adds_information() -> None:
    _, text = health(job("Failed", "DeadlineExceeded", "ran longer than 3600s"))
    assert text == "Failed (DeadlineExceeded): ran longer than 3600s"
    _, text = health(job("Succeeded", "Succeeded", ""))
    assert text == "Succeeded"


def test_no_status_yet_is_progressing() -> None:
    assert health(job(None)) == ("Progressing", "Waiting for the operator to reconcile the job")


def test_a_status_of_an_older_generation_is_progressing() -> None:
    status, text = health(job("Running", "AllPodsRunning", "ok", generation=3, observed=2))
    assert status == "Progressing"
    assert "generation 3" in text


@pytest.mark.parametrize(
    ("conds", "expected"),
    [
        pytest.param({"Stalled": "True", "Ready": "False"}, "Degraded", id="stalled"),
        pytest.param({"Ready": "True", "Stalled": "False"}, "Healthy", id="ready"),
        pytest.param({"Reconciling": "True", "Ready": "False"}, "Progressing", id="reconciling"),
        pytest.param({}, "Progressing", id="nothing-yet"),
    ],
)
def test_without_a_phase_the_kstatus_conditions_decide(conds: dict[str, str], expected: str) -> None:
    obj = job(None)
    obj["status"] = {
        "observedGeneration": 2,
        "conditions": [
            {"type": t, "status": s, "reason": t, "message": f"{t} says {s}"} for t, s in conds.items()
        ],
    }
    assert health(obj)[0] == expected


def test_an_unknown_phase_without_conditions_is_unknown() -> None:
    obj = job(None)
    obj["status"] = {"phase": "Exploded"}
    assert health(obj) == ("Unknown", "Unknown phase Exploded")


def documented_health() -> dict[str, str]:
    """Phase -> Argo CD health from the "Phase -> health" table of docs/operator.md (the operator's contract)."""
    text = (DOCS / "operator.md").read_text()
    table = text[text.index("Phase -> health") :]
    mapping: dict[str, str] = {}
    for line in table.splitlines()[1:]:
        if mapping and not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`"):
            mapping[cells[0].strip("`")] = cells[-1]
    return mapping


def test_the_documented_phase_table_is_what_the_script_does() -> None:
    mapping = documented_health()
    assert set(mapping) == set(SUMMARY), "docs/operator.md lists other phases than the tests know"
    for phase, expected in mapping.items():
        assert health(job(phase, phase, "m"))[0] == expected, phase


_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=20)


@settings(max_examples=150, deadline=None)
@given(
    phase=st.one_of(st.none(), st.sampled_from(sorted(SUMMARY)), _text),
    generation=st.one_of(st.none(), st.integers(min_value=1, max_value=10)),
    observed=st.one_of(st.none(), st.integers(min_value=0, max_value=10)),
    conds=st.lists(
        st.fixed_dictionaries(
            {
                "type": st.sampled_from(["Ready", "Reconciling", "Stalled", "Valid"]),
                "status": st.sampled_from(["True", "False", "Unknown"]),
            },
            optional={"message": _text, "reason": _text},
        ),
        max_size=4,
    ),
    message=st.one_of(st.none(), _text),
)
def test_any_status_gives_a_valid_health_and_a_message(
    phase: str | None,
    generation: int | None,
    observed: int | None,
    conds: list[dict[str, Any]],
    message: str | None,
) -> None:
    status: dict[str, Any] = {"conditions": conds}
    for key, value in (("phase", phase), ("observedGeneration", observed), ("message", message)):
        if value is not None:
            status[key] = value
    obj: dict[str, Any] = {"metadata": {"name": "x"}, "status": status}
    if generation is not None:
        obj["metadata"]["generation"] = generation
    result, text = health(obj)
    assert result in ARGO_STATUSES
    assert text
    stale = generation is not None and observed is not None and observed < generation
    if phase in SUMMARY and not stale:
        assert (result, phase in text) == (documented_health()[phase], True)
    if stale:
        assert result == "Progressing"
