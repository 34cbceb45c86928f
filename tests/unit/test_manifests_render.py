"""``verl-operator render``: exit codes and the printed objects, from the example jobs and cluster profiles."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "examples" / "jobs"
CLUSTERS = ROOT / "examples" / "clusters"


def render(job: Path, nodes: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "verl_operator", "render", "-f", str(job), "--nodes", str(nodes)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_render_prints_every_child_pinned_to_one_rack() -> None:
    out = render(JOBS / "grpo-qwen7b-dgx.yaml", CLUSTERS / "dgx-h100.yaml")
    assert out.returncode == 0, out.stderr
    objects = list(yaml.safe_load_all(out.stdout))
    assert [o["kind"] for o in objects] == ["ServiceAccount", "ConfigMap", "Service", "Pod", "Pod"]
    pods = [o for o in objects if o["kind"] == "Pod"]
    assert [p["metadata"]["name"] for p in pods] == ["grpo-qwen7b-r0-head", "grpo-qwen7b-r0-worker-1"]
    nodes = [p["metadata"]["annotations"]["verl-operator.io/node"] for p in pods]
    # dgx-h100-0,1 share rack-a1 in the profile (racks fill in order).
    assert nodes == ["dgx-h100-0", "dgx-h100-1"]


@pytest.mark.parametrize(
    ("job", "cluster", "fragment"),
    [
        pytest.param("rejected-batch-size.yaml", "dgx-h100.yaml", "use trainBatchSize 96 or 112", id="batch"),
        pytest.param(
            "l40s-tp2-nvlink.yaml", "l40s.yaml", "spec.rollout.tensorParallelSize", id="l40s-nvlink"
        ),
    ],
)
def test_render_rejects_with_exit_1(job: str, cluster: str, fragment: str) -> None:
    out = render(JOBS / job, CLUSTERS / cluster)
    assert out.returncode == 1 and fragment in out.stderr and out.stdout == ""


def test_render_bad_input_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_text("- not a job\n")
    assert render(bad, CLUSTERS / "dgx-h100.yaml").returncode == 2
    assert render(tmp_path / "missing.yaml", CLUSTERS / "dgx-h100.yaml").returncode == 2
