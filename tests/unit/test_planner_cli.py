"""``verl-operator plan``: exit codes, the JSON contract and the table view."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import make_nodes

from verl_operator.commands import plan as plan_cmd


def run_plan(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="verl-operator")
    plan_cmd.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", *argv])
    code: int = args.func(args)
    return code


def job(tmp_path: Path, **spec: Any) -> str:
    doc = {
        "apiVersion": "verl-operator.io/v1alpha1",
        "kind": "VerlJob",
        "metadata": {"name": "grpo"},
        "spec": {
            "verl": {"image": "example.com/verl:0.9.1"},
            "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
            **spec,
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def node_list(tmp_path: Path, count: int = 1, multi_doc: bool = False) -> str:
    nodes = make_nodes(count)
    path = tmp_path / "nodes.yaml"
    if multi_doc:
        path.write_text(yaml.safe_dump_all(nodes))
    else:
        path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}))
    return str(path)


CONTRACT_PLAN_KEYS = {
    "verlVersion", "nodes", "nnodes", "gpusPerNode", "worldSize", "dataParallelSize", "sequenceParallelSize",
    "fsdpSize", "rollout", "batching", "memory", "overrides",
}  # fmt: skip
CONTRACT_ROLLOUT = {"mode", "tensorParallelSize", "replicas", "promptsPerReplica", "gpuMemoryUtilization"}
CONTRACT_BATCHING = {
    "trainBatchSize", "rolloutN", "ppoMiniBatchSize", "miniBatchPerGpu", "ppoMicroBatchSizePerGpu",
    "gradientAccumulationSteps", "logProbMicroBatchSizePerGpu", "logProbPassesPerGpu",
}  # fmt: skip
CONTRACT_MEMORY = {"gpuMemoryGiB", "rolloutPeakGiB", "trainPeakGiB", "logProbPeakGiB"}


def test_json_contract_feasible(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = run_plan(
        ["-f", job(tmp_path, resources={"gpus": 8}), "--nodes", node_list(tmp_path), "-o", "json"]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert {"feasible", "violations", "warnings", "plan"} <= set(out)
    assert out["feasible"] is True and out["violations"] == []
    plan = out["plan"]
    assert set(plan) >= CONTRACT_PLAN_KEYS
    assert set(plan["rollout"]) >= CONTRACT_ROLLOUT
    assert set(plan["batching"]) >= CONTRACT_BATCHING
    assert set(plan["memory"]) >= CONTRACT_MEMORY
    assert plan["worldSize"] == 8 and plan["nodes"] == ["gpu-0"]
    assert all(isinstance(o, str) and "=" in o for o in plan["overrides"])


def test_json_contract_infeasible(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = job(
        tmp_path, resources={"gpus": 6}, data={"trainBatchSize": 64}, rollout={"responsesPerPrompt": 1}
    )
    code = run_plan(["-f", path, "--nodes", node_list(tmp_path), "-o", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    assert out["feasible"] is False and out["plan"] is None
    [v] = out["violations"]
    assert set(v) == {"field", "rule", "message", "suggestions"}
    assert v["message"] == "64 x 1 = 64 trajectories per step is not divisible by 6 GPUs"
    assert v["suggestions"] == ["use trainBatchSize 60 or 66"]


def test_table_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = run_plan(
        ["-f", job(tmp_path, resources={"gpus": 16}), "--nodes", node_list(tmp_path, 2, multi_doc=True)]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("FEASIBLE")
    assert "2 x 8 GPUs" in out and "trainer.nnodes=2" in out


def test_table_output_of_a_megatron_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Megatron plan shows its mesh (TP x PP x CP, EP x ETP, VPP) and Megatron's DP instead of FSDP's."""
    path = job(
        tmp_path,
        resources={"gpus": 16},
        parallelism={"megatron": {"tensorParallelSize": 2, "pipelineParallelSize": 2}},
    )
    code = run_plan(["-f", path, "--nodes", node_list(tmp_path, 2)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert re.search(r"^  world / DP +16 / 4$", out, re.MULTILINE), out
    assert "TP 2 x PP 2 x CP 1, EP 1 x ETP 2, VPP" in out
    assert "fsdp" not in out.split("overrides:")[0]


def test_table_output_infeasible(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = job(
        tmp_path, resources={"gpus": 6}, data={"trainBatchSize": 64}, rollout={"responsesPerPrompt": 1}
    )
    code = run_plan(["-f", path, "--nodes", node_list(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "INFEASIBLE" in out and "spec.data.trainBatchSize" in out and "use trainBatchSize 60 or 66" in out


def test_yaml_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = run_plan(
        ["-f", job(tmp_path, resources={"gpus": 8}), "--nodes", node_list(tmp_path), "-o", "yaml"]
    )
    assert code == 0
    assert yaml.safe_load(capsys.readouterr().out)["plan"]["gpusPerNode"] == 8


@pytest.mark.parametrize(
    ("job_text", "message"),
    [
        pytest.param("spec: [", "not valid YAML", id="bad-yaml"),
        pytest.param("- 1\n- 2\n", "does not hold a VerlJob", id="not-a-mapping"),
        pytest.param(
            "apiVersion: verl-operator.io/v1alpha1\nkind: VerlJob\nspec:\n  verl: {image: x}\n"
            "  model: {path: m}\n  resources: {gpus: 0}\n",
            "spec.resources.gpus",
            id="invalid-field",
        ),
        pytest.param(
            "apiVersion: verl-operator.io/v1alpha1\nkind: VerlJob\nspec:\n  verl: {image: x}\n"
            "  model: {path: m}\n  resources: {gpus: 8}\n  bogus: 1\n",
            "spec.bogus",
            id="unknown-field",
        ),
    ],
)
def test_parse_errors_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], job_text: str, message: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(job_text)
    code = run_plan(["-f", str(path), "--nodes", node_list(tmp_path)])
    assert code == 2
    assert message in capsys.readouterr().err


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = run_plan(["-f", str(tmp_path / "absent.yaml"), "--nodes", node_list(tmp_path)])
    assert code == 2
    assert "cannot read" in capsys.readouterr().err


def test_nodes_file_of_wrong_kind_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}))
    assert run_plan(["-f", job(tmp_path, resources={"gpus": 8}), "--nodes", str(path)]) == 2
    assert "expected Node" in capsys.readouterr().err


def test_usage_error_exits_2(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        run_plan(["-f", job(tmp_path, resources={"gpus": 8})])  # neither --nodes nor --kubeconfig
    assert exc.value.code == 2


def test_unreachable_kubeconfig_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text("not: a kubeconfig\n")
    assert run_plan(["-f", job(tmp_path, resources={"gpus": 8}), "--kubeconfig", str(kubeconfig)]) == 2
    assert "cannot list nodes" in capsys.readouterr().err


def test_result_round_trips_through_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from verl_operator.api.plan import PlanResult

    run_plan(["-f", job(tmp_path, resources={"gpus": 8}), "--nodes", node_list(tmp_path), "-o", "json"])
    data = json.loads(capsys.readouterr().out)
    assert PlanResult.model_validate(data).to_json_dict() == data


PROFILES = Path(__file__).resolve().parents[2] / "examples" / "clusters"


@pytest.mark.parametrize(
    ("profile", "gpus", "product"),
    [
        pytest.param("dgx-h100", 16, "NVIDIA-H100-80GB-HBM3", id="dgx-16"),
        pytest.param("l40s", 8, "NVIDIA-L40S", id="l40s-8"),
    ],
)
def test_a_devcluster_profile_serves_as_the_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], profile: str, gpus: int, product: str
) -> None:
    """`plan --nodes examples/clusters/NAME.yaml` plans against the profile's simulated nodes."""
    argv = ["-f", job(tmp_path, resources={"gpus": gpus}), "--nodes", str(PROFILES / f"{profile}.yaml")]
    assert run_plan([*argv, "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["worldSize"] == gpus
    assert out["plan"]["nodePool"]["gpuProduct"] == product


def test_an_invalid_profile_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump({"name": "broken", "nodeGroups": [{"count": "two"}]}))
    assert run_plan(["-f", job(tmp_path, resources={"gpus": 8}), "--nodes", str(path)]) == 2
    assert "nodeGroups[0]" in capsys.readouterr().err  # names the bad field of the profile
