"""The chart's Grafana dashboard: every PromQL query names only metrics the operator exports (read from the
operator's Prometheus registry, ``controller/metrics.py``), and the chart ships it as a ConfigMap with the
sidecar's label when enabled (rendered by the real ``helm``)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_chart_render import by_kind, one, render

import verl_operator.controller.metrics as operator_metrics

CHART = Path(__file__).resolve().parents[2] / "charts" / "verl-operator"
DASHBOARD = CHART / "dashboards" / "verl-operator.json"
#: The operator's metrics share this prefix; a name in a query that has it must be one the operator exports.
PREFIX = "verl_operator_"
_METRIC = re.compile(r"\b(verl_operator_[a-z0-9_]+)\b")
#: The series each Prometheus metric type exposes, after its family name (prometheus_client's exposition).
_SERIES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
}


def exported_series() -> set[str]:
    """Every series name the operator's metrics module registers (families of ``controller/metrics.py``)."""
    names: set[str] = set()
    module_metrics = [
        v for v in vars(operator_metrics).values() if hasattr(v, "describe") and hasattr(v, "_name")
    ]
    assert module_metrics, "controller/metrics.py defines no metrics"
    for metric in module_metrics:
        for family in metric.describe():
            names.update(family.name + suffix for suffix in _SERIES[family.type])
    return names


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """``(where, PromQL)`` of every panel target and templating variable query."""
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            yield f"variable {variable['name']}", query["query"]


def unknown_metrics(dashboard: dict[str, Any], exported: set[str]) -> list[str]:
    return [
        f"{where}: {name}"
        for where, expr in queries(dashboard)
        for name in _METRIC.findall(expr)
        if name not in exported
    ]


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def test_the_exported_names_come_from_the_metrics_module() -> None:
    exported = exported_series()
    assert {
        "verl_operator_reconciles_total",
        "verl_operator_planning_seconds_bucket",
        "verl_operator_jobs",
    } <= exported
    assert (
        "verl_operator_reconciles_total_total" not in exported and "verl_operator_jobs_total" not in exported
    )


def test_every_query_names_only_exported_metrics(dashboard: dict[str, Any]) -> None:
    assert unknown_metrics(dashboard, exported_series()) == []


def test_every_panel_queries_an_operator_metric(dashboard: dict[str, Any]) -> None:
    for panel in dashboard["panels"]:
        names = {n for t in panel["targets"] for n in _METRIC.findall(t["expr"])}
        assert names, f"panel {panel['title']!r} names no verl_operator_ metric"


def test_every_exported_family_has_a_panel(dashboard: dict[str, Any]) -> None:
    used = {n for _, expr in queries(dashboard) for n in _METRIC.findall(expr)}
    families = {f.name for m in vars(operator_metrics).values() if hasattr(m, "_name") for f in m.describe()}
    assert {f for f in families if not any(u.startswith(f) for u in used)} == set()


def test_a_misspelt_metric_is_caught(dashboard: dict[str, Any]) -> None:
    broken = json.loads(json.dumps(dashboard))
    broken["panels"][0]["targets"][0]["expr"] = "sum(rate(verl_operator_reconcile_total[5m]))"
    assert unknown_metrics(broken, exported_series()) == [
        f"panel {broken['panels'][0]['title']!r} A: verl_operator_reconcile_total"
    ]


def test_panels_have_unique_ids_and_a_datasource_variable(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert "datasource" in {v["name"] for v in dashboard["templating"]["list"]}
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"])


def test_disabled_by_default(helm: str) -> None:
    assert [
        o for o in by_kind(render(helm), "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")
    ] == []


def test_enabled_ships_the_dashboard_for_the_sidecar(helm: str) -> None:
    objects = render(
        helm,
        "metrics.grafanaDashboard.enabled=true",
        "metrics.grafanaDashboard.namespace=monitoring",
        "metrics.grafanaDashboard.annotations.grafana_folder=verl",
    )
    (config_map,) = [o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "verl"}
    assert json.loads(config_map["data"]["verl-operator.json"]) == json.loads(DASHBOARD.read_text())
    assert one(objects, "Deployment")  # the rest of the chart is unchanged by the switch
