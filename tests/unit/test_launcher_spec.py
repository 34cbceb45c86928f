"""Launch spec parsing: the contract's example, every field error named, unknown keys tolerated."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from verl_contract.launch_spec import unknown_fields
from verl_launcher.exits import ExitCode, LauncherError
from verl_launcher.spec import load_launch_spec, parse_launch_spec

CONTRACT_EXAMPLE: dict[str, Any] = {
    "apiVersion": "verl-operator.io/v1alpha1",
    "kind": "LaunchSpec",
    "job": {"name": "demo", "namespace": "default", "uid": "1234"},
    "verlVersion": "0.9",
    "nnodes": 2,
    "gpusPerNode": 8,
    "head": {"host": "demo-head-0.demo-ray.default.svc", "port": 6379, "dashboardPort": 8265},
    "entrypoint": ["python3", "-m", "verl.trainer.main_ppo"],
    "overrides": ["algorithm.adv_estimator=grpo", "trainer.nnodes=2"],
    "env": {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"},
    "expect": {
        "gpuProduct": "NVIDIA-H100-80GB-HBM3",
        "gpuMemoryMiB": 81559,
        "requireNvlink": True,
        "nvlinkGroupSize": 2,
    },
    "checkpoint": {"dir": "/checkpoints/demo", "resume": True},
    "timeouts": {"clusterReadySeconds": 600, "workerJoinSeconds": 600},
}


def with_change(path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(CONTRACT_EXAMPLE)
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node[key]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return doc


def test_contract_example_parses() -> None:
    spec = parse_launch_spec(CONTRACT_EXAMPLE)
    assert spec.job.name == "demo" and spec.nnodes == 2 and spec.gpus_per_node == 8
    assert spec.total_gpus == 16
    assert spec.head.dashboard_port == 8265
    assert spec.expect.gpu_memory_mib == 81559 and spec.expect.nvlink_group_size == 2
    assert spec.checkpoint.dir == "/checkpoints/demo" and spec.checkpoint.resume
    assert spec.timeouts.worker_join_seconds == 600
    assert unknown_fields(spec) == []


@pytest.mark.parametrize(
    ("entrypoint", "module"),
    [
        pytest.param(["python3", "-m", "verl.trainer.main_ppo"], "verl.trainer.main_ppo", id="main-ppo"),
        pytest.param(
            ["python3", "-m", "recipe.one_step_off_policy.main_ppo", "--config-name=x"],
            "recipe.one_step_off_policy.main_ppo",
            id="recipe-with-config",
        ),
        pytest.param(["python3", "fake_verl.py"], None, id="a-script"),
    ],
)
def test_the_module_is_the_item_after_dash_m(entrypoint: list[str], module: str | None) -> None:
    assert parse_launch_spec(with_change("entrypoint", entrypoint)).module == module


def test_nullable_fields() -> None:
    doc = with_change(
        "expect", {"gpuProduct": None, "gpuMemoryMiB": None, "requireNvlink": False, "nvlinkGroupSize": 1}
    )
    doc["checkpoint"] = {"dir": None, "resume": False}
    spec = parse_launch_spec(doc)
    assert spec.expect.gpu_product is None and spec.checkpoint.dir is None


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        pytest.param("nnodes", 0, "`nnodes`", id="nnodes-zero"),
        pytest.param("gpusPerNode", "eight", "`gpusPerNode`", id="gpus-not-int"),
        pytest.param("kind", "VerlJob", "`kind`", id="kind"),
        pytest.param("apiVersion", "v1", "`apiVersion`", id="api-version"),
        pytest.param("head.port", 70000, "`head.port`", id="head-port"),
        pytest.param("head.host", "", "`head.host`", id="head-host-empty"),
        pytest.param("head", KeyError, "`head`", id="head-missing"),
        pytest.param("entrypoint", [], "`entrypoint`", id="entrypoint-empty"),
        pytest.param(
            "entrypoint", ["python3", "-m", "verl;rm -rf /"], "`entrypoint`", id="module-not-dotted"
        ),
        pytest.param("entrypoint", ["python3", "-m", "verl..main"], "`entrypoint`", id="module-empty-part"),
        pytest.param("overrides", ["trainer.nnodes"], "`overrides`", id="override-without-equals"),
        pytest.param("overrides", ["a=1", "; rm -rf /"], "`overrides`", id="override-not-hydra"),
        pytest.param("env", {"BAD-NAME": "x"}, "`env`", id="env-name"),
        pytest.param("expect.gpuMemoryMiB", -1, "`expect.gpuMemoryMiB`", id="memory-negative"),
        pytest.param("expect.nvlinkGroupSize", 0, "`expect.nvlinkGroupSize`", id="group-zero"),
        pytest.param("checkpoint.dir", " ", "`checkpoint.dir`", id="checkpoint-empty"),
        pytest.param("timeouts.clusterReadySeconds", 0, "`timeouts.clusterReadySeconds`", id="timeout-zero"),
        pytest.param("verlVersion", "latest", "`verlVersion`", id="verl-version"),
    ],
)
def test_errors_name_the_field(path: str, value: Any, field: str) -> None:
    with pytest.raises(LauncherError) as caught:
        parse_launch_spec(with_change(path, value), "spec.json")
    assert caught.value.code is ExitCode.INVALID_LAUNCH_SPEC
    assert caught.value.reason == "InvalidLaunchSpec"
    assert field in caught.value.message
    assert caught.value.message.startswith("invalid launch spec spec.json:")


def test_every_bad_field_is_listed() -> None:
    doc = with_change("nnodes", -1)
    doc["gpusPerNode"] = 0
    with pytest.raises(LauncherError) as caught:
        parse_launch_spec(doc)
    assert "`nnodes`" in caught.value.message and "`gpusPerNode`" in caught.value.message


def test_unknown_keys_are_tolerated_and_listed() -> None:
    doc = with_change("expect.futureKnob", 3)
    doc["placementHint"] = "x"
    spec = parse_launch_spec(doc)
    assert unknown_fields(spec) == ["expect.futureKnob", "placementHint"]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        pytest.param(None, "cannot read the launch spec", id="missing"),
        pytest.param("{not json", "not JSON (line 1", id="not-json"),
        pytest.param("[1, 2]", "must be a JSON object, got list", id="not-object"),
    ],
)
def test_file_errors(tmp_path: Path, content: str | None, needle: str) -> None:
    path = tmp_path / "launch.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(LauncherError) as caught:
        load_launch_spec(path)
    assert caught.value.code is ExitCode.INVALID_LAUNCH_SPEC
    assert needle in caught.value.message and str(path) in caught.value.message


def test_load_from_file(tmp_path: Path) -> None:
    path = tmp_path / "launch.json"
    path.write_text(json.dumps(CONTRACT_EXAMPLE))
    assert load_launch_spec(path).overrides == ("algorithm.adv_estimator=grpo", "trainer.nnodes=2")
