"""The launch contract end to end: the operator fills the contract's model, the launcher reads it back as is."""

from __future__ import annotations

import json
from typing import Any

import pytest

from verl_contract.launch_spec import LAUNCH_KEY, LaunchSpec, unknown_fields
from verl_launcher.spec import parse_launch_spec
from verl_operator.api.spec import VerlJobSpec
from verl_operator.manifests import LaunchPlan, build_launch_configmap, build_launch_spec

JOB = {"metadata": {"name": "demo", "namespace": "default", "uid": "1234"}}
SPEC = VerlJobSpec.model_validate(
    {
        "verl": {"image": "i"},
        "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
        "resources": {"gpus": 16, "gpusPerNode": 8},
    }
)


def _plan(**changes: Any) -> LaunchPlan:
    base: dict[str, Any] = {
        "verl_version": "0.9",
        "nnodes": 2,
        "gpus_per_node": 8,
        "overrides": ("trainer.nnodes=2", "trainer.n_gpus_per_node=8", "trainer.total_epochs=1"),
        "nvlink_group_size": 2,
        "require_nvlink": True,
        "nodes": ("a", "b"),
    }
    return LaunchPlan(**{**base, **changes})


@pytest.mark.parametrize(
    ("checkpoint", "product", "memory"),
    [
        pytest.param({"dir": "/checkpoints/demo"}, "NVIDIA-H100-80GB-HBM3", 81559, id="all-known"),
        pytest.param({}, None, None, id="nulls-allowed"),
    ],
)
def test_the_launcher_reads_back_the_model_the_operator_wrote(
    checkpoint: dict[str, Any], product: str | None, memory: int | None
) -> None:
    spec = SPEC.model_copy(update={"checkpoint": SPEC.checkpoint.model_copy(update=checkpoint)})
    plan = _plan(gpu_product=product, gpu_memory_mib=memory)
    written = build_launch_spec(JOB, spec, plan)
    text = build_launch_configmap(JOB, spec, plan)["data"][LAUNCH_KEY]
    assert text == written.to_json()
    parsed = parse_launch_spec(json.loads(text))
    assert isinstance(parsed, LaunchSpec) and parsed == written
    assert (
        parsed.total_gpus == 16
        and parsed.expect.gpu_product == product
        and parsed.checkpoint.dir == (checkpoint.get("dir"))
    )
    assert unknown_fields(parsed) == []


def test_integral_deadlines_stay_integers_in_launch_json() -> None:
    """Unchanged bytes for unchanged jobs: ``600``, not ``600.0`` (a changed ConfigMap is rewritten)."""
    document = json.loads(build_launch_spec(JOB, SPEC, _plan()).to_json())
    assert document["timeouts"] == {"clusterReadySeconds": 600, "workerJoinSeconds": 600}
    assert (
        LaunchSpec.model_validate(
            {**document, "timeouts": {"clusterReadySeconds": 1.5}}
        ).timeouts.cluster_ready_seconds
        == 1.5
    )


def test_the_operator_cannot_write_what_the_launcher_would_refuse() -> None:
    """One model: a bad value fails where the spec is built, naming the field, not in the pod."""
    with pytest.raises(ValueError, match="nnodes"):
        build_launch_spec(JOB, SPEC, _plan(nnodes=0))
    with pytest.raises(ValueError, match="overrides"):
        build_launch_spec(JOB, SPEC, _plan(overrides=("not an override",)))


@pytest.mark.parametrize(
    ("spec_verl", "engine", "argv_head"),
    [
        pytest.param({}, "fsdp", ["python3", "-m", "verl.trainer.main_ppo"], id="default-module"),
        pytest.param(
            {"entrypoint": "verl.experimental.fully_async_policy.fully_async_main"},
            "fsdp",
            ["python3", "-m", "verl.experimental.fully_async_policy.fully_async_main"],
            id="spec-module",
        ),
        pytest.param(
            {"entrypoint": "recipe.one_step_off_policy.main_ppo"},
            "megatron",
            [
                "python3",
                "-m",
                "recipe.one_step_off_policy.main_ppo",
                "--config-name=one_step_off_ppo_megatron_trainer",
            ],
            id="spec-module-megatron",
        ),
    ],
)
def test_the_launcher_runs_the_spec_entrypoint(
    spec_verl: dict[str, Any], engine: str, argv_head: list[str]
) -> None:
    from verl_launcher.verl import build_argv

    spec = SPEC.model_copy(update={"verl": SPEC.verl.model_copy(update=spec_verl)})
    plan = _plan(training_engine=engine, module=spec.verl.entrypoint)
    parsed = parse_launch_spec(json.loads(build_launch_spec(JOB, spec, plan).to_json()))
    argv = build_argv(parsed, attempt=0)
    assert argv[: len(argv_head)] == argv_head
    assert argv[len(argv_head) : len(argv_head) + 3] == list(plan.overrides)
    assert parsed.module == spec.verl.entrypoint
