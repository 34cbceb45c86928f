"""``kubectl verl``: the views of status, top and logs (pure), the plugin's parser and its kubeconfig handling.

The commands against a cluster: ``tests/cluster/test_kubectl_plugin.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from verl_operator.cli import build_kubectl_parser, kubectl_main
from verl_operator.commands import kubectl, kubectl_views

PROGRESS = {
    "step": 12,
    "totalSteps": 100,
    "stepSeconds": 184.5,
    "phases": {"generate": 112.0, "update_actor": 51.0},
    "generationShare": 0.607,
    "throughputPerGpu": 1523.4,
    "mfu": 0.412,
    "etaSeconds": 16236,
    "lastStepTime": "2026-12-06T03:00:00Z",
}


def job(name: str, namespace: str = "team", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {}, "status": status}


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        pytest.param(None, "-", id="absent"),
        pytest.param("12", "-", id="not-a-number"),
        pytest.param(True, "-", id="bool"),
        pytest.param(4.25, "4.2s", id="short"),
        pytest.param(42, "42s", id="seconds"),
        pytest.param(185, "3m05s", id="minutes"),
        pytest.param(7260, "2h01m", id="hours"),
        pytest.param(93600, "1d02h", id="days"),
    ],
)
def test_duration(seconds: Any, text: str) -> None:
    assert kubectl_views.duration(seconds) == text


@pytest.mark.parametrize(
    ("status", "row"),
    [
        pytest.param(
            {"phase": "Running", "progress": PROGRESS},
            ["a", "Running", "12/100", "3m04s", "61%", "1523", "41%", "4h30m"],
            id="all-fields",
        ),
        pytest.param({"phase": "Pending"}, ["a", "Pending", "-", "-", "-", "-", "-", "-"], id="no-progress"),
        pytest.param(
            {"phase": "Running", "progress": {"step": 3, "throughputPerGpu": 25000}},
            ["a", "Running", "3", "-", "-", "25.0k", "-", "-"],
            id="partial-progress",
        ),
        pytest.param({"progress": "garbage"}, ["a", "-", "-", "-", "-", "-", "-", "-"], id="not-a-mapping"),
    ],
)
def test_top_rows_read_progress_defensively(status: dict[str, Any], row: list[str]) -> None:
    assert kubectl_views.top_row(job("a", **status), with_namespace=False) == row


def test_top_table_aligns_columns_and_names_namespaces() -> None:
    text = kubectl_views.top_table(
        [job("short", phase="Running", progress=PROGRESS), job("a-much-longer-name", "ml")],
        with_namespace=True,
    )
    header, first, second = text.splitlines()
    assert header.split() == [
        "NAMESPACE",
        "NAME",
        "PHASE",
        "STEP",
        "STEP",
        "TIME",
        "GEN",
        "SHARE",
        *["TOKENS/S/GPU", "MFU", "ETA"],
    ]
    assert first.split()[:4] == ["team", "short", "Running", "12/100"]
    assert header.index("PHASE") == first.index("Running") == second.index("-   ")


def test_status_text_shows_plan_placement_progress_and_advice() -> None:
    obj = job(
        "grpo",
        phase="Running",
        reason="Started",
        attempt=1,
        restarts=1,
        mesh="dp16 sp1 rollout-tp2",
        plan={
            "nnodes": 2,
            "gpusPerNode": 8,
            "verlVersion": "0.9",
            "rollout": {"name": "vllm", "tensorParallelSize": 2, "replicas": 8},
            "batching": {"trainBatchSize": 256, "rolloutN": 8, "ppoMiniBatchSize": 64},
        },
        placement={"nodes": ["n0", "n1"], "domain": "rack-1", "message": "2 nodes of rack rack-1"},
        progress=PROGRESS,
        advice=["generation takes 61% of each step: raise rollout TP", {"message": "an object's message"}],
        conditions=[
            {"type": "Stalled", "status": "True", "reason": "NoStep", "message": "no step for 20m"},
            {"type": "Ready", "status": "True", "reason": "Placed", "message": ""},
        ],
    )
    obj["spec"] = {"verl": {"entrypoint": "verl.experimental.fully_async_policy.fully_async_main"}}
    text = kubectl_views.status_text(obj)
    for needle in (
        "Entrypoint:  verl.experimental.fully_async_policy.fully_async_main",
        "Phase:       Running (Started)",
        "Plan:        2 x 8 GPUs, verl 0.9, mesh dp16 sp1 rollout-tp2",
        "rollout:   vllm TP 2, 8 replicas",
        "Placement:   n0, n1 (domain rack-1)",
        "step 12/100, step time 3m04s, generation 61%, 1523 tokens/s per GPU, MFU 41%, ETA 4h30m",
        "phases:    generate 1m52s, update_actor 51s",
        "  - generation takes 61% of each step: raise rollout TP",
        "  - an object's message",
        "  - Stalled: no step for 20m",
    ):
        assert needle in text, (needle, text)


def test_status_text_of_a_job_without_status() -> None:
    text = kubectl_views.status_text({"metadata": {"name": "new", "namespace": "ns"}, "spec": {}})
    assert "Phase:       -" in text and "Progress:    -" in text and "Advice:      -" in text
    assert "Entrypoint:  verl.trainer.main_ppo" in text


def test_status_text_lists_violations() -> None:
    violation = {
        "field": "spec.data.trainBatchSize",
        "rule": "batch",
        "message": "100 x 1",
        "suggestions": ["96"],
    }
    text = kubectl_views.status_text(job("bad", phase="Invalid", violations=[violation]))
    assert "  x spec.data.trainBatchSize [batch]: 100 x 1\n      -> 96" in text


def test_log_lines_are_whole_lines_and_leave_out_the_ray_head() -> None:
    chunks = [b"step:1 - a", b":1\n[ray-head] started\nstep:2", " - b:2\n", b"tail without newline"]
    lines = list(kubectl_views.lines_of(chunks))
    assert lines == ["step:1 - a:1", "[ray-head] started", "step:2 - b:2", "tail without newline"]
    assert list(kubectl_views.verl_lines(lines)) == ["step:1 - a:1", "step:2 - b:2", "tail without newline"]
    assert list(kubectl_views.verl_lines(lines, everything=True)) == lines


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        pytest.param(["top", "-A", "-o", "json"], {"all_namespaces": True, "output": "json"}, id="top"),
        pytest.param(
            ["logs", "j", "-f", "--context", "c", "-n", "x"],
            {"follow": True, "context": "c", "namespace": "x"},
            id="logs",
        ),
        pytest.param(
            ["status", "j", "--kubeconfig", "k"],
            {"job": "j", "kubeconfig": "k", "output": "table"},
            id="status",
        ),
        pytest.param(["plan", "-f", "job.yaml"], {"filename": "job.yaml", "namespace": None}, id="plan"),
    ],
)
def test_kubectl_conventions(argv: list[str], expect: dict[str, Any]) -> None:
    args = build_kubectl_parser().parse_args(argv)
    assert {k: getattr(args, k) for k in expect} == expect


def _kubeconfig(path: Path, namespace: str | None) -> Path:
    context: dict[str, Any] = {"cluster": "c", "user": "u"}
    if namespace:
        context["namespace"] = namespace
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "main", "context": context},
                    {"name": "other", "context": {"cluster": "c", "user": "u", "namespace": "other-ns"}},
                ],
                "current-context": "main",
            }
        )
    )
    return path


@pytest.mark.parametrize(
    ("context_ns", "flags", "namespace"),
    [
        pytest.param("team", [], "team", id="the-contexts-namespace"),
        pytest.param(None, [], "default", id="default"),
        pytest.param("team", ["-n", "mine"], "mine", id="flag-wins"),
        pytest.param("team", ["--context", "other"], "other-ns", id="another-context"),
    ],
)
def test_the_namespace_comes_from_the_context(
    tmp_path: Path, context_ns: str | None, flags: list[str], namespace: str
) -> None:
    config = _kubeconfig(tmp_path / "config", context_ns)
    args = build_kubectl_parser().parse_args(["status", "j", "--kubeconfig", str(config), *flags])
    _, chosen = kubectl.connect(args)
    assert chosen == namespace


def test_errors_exit_as_kubectl_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert kubectl_main(["status", "j", "--kubeconfig", str(tmp_path / "missing")]) == 1
    assert "error: cannot load the kubeconfig" in capsys.readouterr().err
    config = _kubeconfig(tmp_path / "config", None)
    assert kubectl_main(["status", "j", "--kubeconfig", str(config), "--context", "nope"]) == 1
    with pytest.raises(SystemExit) as usage:
        kubectl_main(["status"])
    assert usage.value.code == 2
    assert kubectl_main(["plan", "-f", str(tmp_path / "missing.yaml"), "--kubeconfig", str(config)]) == 2


def test_import_through_the_plugin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "run.sh"
    script.write_text("python3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=4 trainer.nnodes=2 a.b=1\n")
    assert kubectl_main(["import", str(script), "--image", "verl:x", "-n", "team"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["metadata"] == {"name": "run", "namespace": "team"}
    assert doc["spec"]["resources"] == {"gpus": 8, "gpusPerNode": 4} and doc["spec"]["overrides"] == ["a.b=1"]
