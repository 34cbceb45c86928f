"""``verl-operator import``: the script reader's placeholders, verl's own scripts imported, and the imported
job planned as the script's own overrides are.

The scripts under ``data/verl-scripts`` are verl's (each file's header names its commit and path).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import make_nodes

from verl_operator.api.spec import VerlJob, VerlJobSpec
from verl_operator.cli import main
from verl_operator.planner import plan_job
from verl_operator.scripts import launch
from verl_operator.scripts.importer import ScriptImportError, import_script, job_name
from verl_operator.scripts.shell import Shell, placeholders

SCRIPTS = Path(__file__).parent / "data" / "verl-scripts"
MAIN = "python3 -m verl.trainer.main_ppo"
#: What verl's example scripts read from their environment, as the fidelity corpus sets it.
ENVIRONMENT = {"HOME": "/home/user", "PWD": "/workspace"}


def _argv(script: str, environment: dict[str, str] | None = None) -> list[str]:
    (found,) = launch.invocations(script, Shell(environment or {}, placeholders=True))
    return [field.text for field in found.args]


@pytest.mark.parametrize(
    ("script", "argv"),
    [
        pytest.param(
            f"{MAIN} a=$X b=${{X}} c=${{X:-d}}", ["a=${X}", "b=${X}", "c=d"], id="unset-and-default"
        ),
        pytest.param(f"{MAIN} a=$1 b=${{2:-vllm}} $@", ["a=${1}", "b=vllm", "${@}"], id="arguments"),
        pytest.param(f'{MAIN} "$@"', ["${@}"], id="quoted-arguments"),
        pytest.param(
            f"{MAIN} a=$(hostname) n=$((NODES * 8))", ["a=$(hostname)", "n=$((NODES * 8))"], id="subst"
        ),
        pytest.param(
            f"A=(\n  a.x=1\n  'a.y=b c'\n)\nA+=(a.z=$HOME)\n{MAIN} \"${{A[@]}}\"",
            ["a.x=1", "a.y=b c", "a.z=${HOME}"],
            id="array-append",
        ),
        pytest.param(f'{MAIN} a=1 <<< "some input" b=2', ["a=1", "b=2"], id="here-string"),
        pytest.param(
            f"{MAIN} a=1 \\\n  b='x y' \\\n  c=\"$HOME/d\" # note",
            ["a=1", "b=x y", "c=${HOME}/d"],
            id="lines",
        ),
        pytest.param("python -m verl.trainer.main_ppo a=1", ["a=1"], id="python"),
        pytest.param(
            "ray job submit --address=http://h:8265 --runtime-env=r.yaml -- python3 -m verl.trainer.main_ppo a=1",
            ["a=1"],
            id="ray-job-submit",
        ),
        pytest.param(f"{MAIN} a='${{oc.env:HOME}}'", ["a=${oc.env:HOME}"], id="hydra-interpolation"),
    ],
)
def test_placeholders_name_what_the_script_leaves_open(script: str, argv: list[str]) -> None:
    assert _argv(script) == argv


def test_set_values_resolve_placeholders() -> None:
    assert _argv(f"{MAIN} a=$HOME/x b=$1", {"HOME": "/h", "1": "v"}) == ["a=/h/x", "b=v"]


def test_nothing_in_the_script_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = f"touch {marker}\nX=$(touch {marker})\n{MAIN} a=$X b=$((1 + 1))\nrm -rf {tmp_path}\n"
    imported = import_script(script, "s.sh", image="i")
    assert not marker.exists() and tmp_path.exists()
    assert f"a='$(touch {marker})'" in imported.job["spec"]["overrides"]  # quoted for Hydra, never run
    assert any(f"$(touch {marker})" in w and "not run" in w for w in imported.warnings)


def test_hydra_options_are_split_from_the_overrides() -> None:
    (found,) = launch.invocations(
        f"{MAIN} --config-path=config --config-name ppo_megatron_trainer -x a=1", Shell({})
    )
    split = launch.hydra_args(found.args)
    assert (split.config_path, split.config_name, split.options, split.overrides) == (
        "config",
        "ppo_megatron_trainer",
        ["-x"],
        ["a=1"],
    )


@pytest.mark.parametrize(
    ("script", "message"),
    [
        pytest.param("echo hello", "no `python3 -m MODULE` command", id="no-command"),
        pytest.param(f"for i in 1 2; do {MAIN} a=$i; done", "shell syntax", id="loop"),
        pytest.param(f"{MAIN} a=1\n{MAIN} a=2", None, id="two-commands"),
    ],
)
def test_scripts_that_cannot_be_imported_say_why(script: str, message: str | None) -> None:
    if message is None:
        imported = import_script(script, image="i")
        assert imported.job["spec"]["overrides"] == ["a=1"]
        assert any("runs 2 Python modules" in w for w in imported.warnings)
        with pytest.raises(ScriptImportError, match="--command 3: the script has 2"):
            import_script(script, command=3)
        assert import_script(script, image="i", command=2).job["spec"]["overrides"] == ["a=2"]
        return
    with pytest.raises(ScriptImportError, match=message):
        import_script(script)


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("run_qwen2-7b.sh", "run-qwen2-7b"),
        ("dir/Run_Qwen2.5_32B.sh", "run-qwen2-5-32b"),
        ("__.sh", "imported"),
    ],
)
def test_job_name(source: str, name: str) -> None:
    assert job_name(source) == name


def _script(name: str) -> str:
    return (SCRIPTS / name).read_text()


def test_every_stored_script_names_its_source() -> None:
    scripts = sorted(SCRIPTS.glob("*.sh"))
    assert len(scripts) >= 6
    for path in scripts:
        first, second = path.read_text().splitlines()[:2]
        assert first.startswith("# source: https://github.com/volcengine/verl/blob/"), path.name
        assert "verl commit" in second, path.name


@pytest.mark.parametrize(
    ("name", "expect"),
    [
        pytest.param(
            "grpo-run_qwen2-7b.sh",
            {"gpus": 8, "model": "Qwen/Qwen2-7B-Instruct", "algorithm": "grpo", "unresolved": {"HOME"}},
            id="grpo-qwen2-7b",
        ),
        pytest.param(
            "ppo-run_qwen2.5-32b.sh",
            {"gpus": 32, "model": "Qwen/Qwen2.5-32B-Instruct", "algorithm": None, "unresolved": {"HOME"}},
            id="ppo-qwen2.5-32b-4-nodes",
        ),
        pytest.param(
            "gspo-test_gspo_3b_math.sh",
            {
                "gpus": 8,
                "model": "Qwen/Qwen2.5-3B-Instruct",
                "algorithm": "grpo",
                "unresolved": {"SLURM_JOB_NUM_NODES"},
            },
            id="gspo-slurm-nodes-unresolved",
        ),
        pytest.param(
            "grpo-run_qwen2-7b_math_megatron_lora.sh",
            {"gpus": 8, "model": "Qwen/Qwen2-7B-Instruct", "algorithm": "grpo", "unresolved": {"HOME"}},
            id="megatron-lora-arrays",
        ),
        pytest.param(
            "fully_async-dapo_30b_a3b_base_math_fsdp.sh",
            {"gpus": None, "model": "${HOME}/verl/shared/models/Qwen3-30B-A3B-Base", "algorithm": "grpo"},
            id="fully-async-ray-job-submit",
        ),
    ],
)
def test_verl_scripts_import(name: str, expect: dict[str, Any]) -> None:
    imported = import_script(_script(name), name, image="verl:test")
    job = VerlJob.model_validate(imported.job)
    assert job.spec.model.path == expect["model"]
    if expect["gpus"] is not None:
        assert job.spec.resources.gpus == expect["gpus"]
    if expect["algorithm"] is not None:
        assert job.spec.algorithm.value == expect["algorithm"]
    for variable in expect.get("unresolved", ()):
        assert any(f"${{{variable}}}" in w for w in imported.warnings), imported.warnings
        assert f"${{{variable}}}" in imported.text.split("apiVersion:")[0]  # named in a header comment
    assert imported.text.startswith(f"# Imported from {name} line ")
    assert yaml.safe_load(imported.text) == imported.job


def test_the_fully_async_script_keeps_its_module_and_config() -> None:
    name = "fully_async-dapo_30b_a3b_base_math_fsdp.sh"
    imported = import_script(_script(name), name, image="verl:test", environment=ENVIRONMENT)
    spec = imported.job["spec"]
    assert spec["verl"]["entrypoint"] == "verl.experimental.fully_async_policy.fully_async_main"
    assert "--config-name=fully_async_dapo_trainer.yaml" in spec["overrides"]
    assert spec["model"]["path"] == "/home/user/verl/shared/models/Qwen3-30B-A3B-Base"
    assert {"name": "VLLM_USE_V1", "value": "1"} in spec["env"]
    # Both pools: trainer.nnodes 2 x trainer.n_gpus_per_node 8 + rollout.nnodes 2 x rollout.n_gpus_per_node 8.
    assert spec["resources"] == {"gpus": 32}
    assert {"trainer.nnodes=2", "trainer.n_gpus_per_node=8", "rollout.nnodes=2"} <= set(spec["overrides"])
    assert not any("rollout pool" in w for w in imported.warnings)
    assert not any("${HOME}" in w for w in imported.warnings)


def _baseline(imported: dict[str, Any], script: str) -> VerlJobSpec:
    """The script's own overrides planned directly: bash's reading of the command (unset variables empty and
    their ``key=`` dropped, as the fidelity corpus reads verl's scripts), GPUs from its trainer keys."""
    (found,) = [
        i
        for i in launch.invocations(script, Shell(ENVIRONMENT))
        if i.module == imported["spec"]["verl"]["entrypoint"]
    ]
    split = launch.hydra_args(found.args)
    overrides = ([f"--config-name={split.config_name}"] if split.config_name else []) + split.overrides

    def last(key: str) -> str | None:
        values = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").split("=", 1)[0] == key]
        return values[-1] if values else None

    nnodes, per_node = int(last("trainer.nnodes") or 1), int(last("trainer.n_gpus_per_node") or 8)
    rollout = 0  # the recipes' standalone rollout pool (verl's fully_async / one_step_off configs: rollout.*)
    if imported["spec"]["verl"]["entrypoint"] != "verl.trainer.main_ppo":
        rollout = int(last("rollout.nnodes") or 0) * int(last("rollout.n_gpus_per_node") or per_node)
    return VerlJobSpec.model_validate(
        {
            "verl": imported["spec"]["verl"],
            "model": {"path": last("actor_rollout_ref.model.path")},
            "resources": {"gpus": nnodes * per_node + rollout},
            "overrides": overrides,
        }
    )


def _violations(result: Any) -> list[tuple[str, str]]:
    """``(field, rule)`` of each violation, the override's position left out (the import moves keys to fields)."""
    return [(re.sub(r"\[\d+\]", "", v.field), v.rule) for v in result.violations]


def _same_value(override: str) -> str:
    """An override as verl reads it: a single data file is a list of one (verl's RLHFDataset wraps a string
    in a list), and a command substitution, which bash runs and the import leaves as written (quoted for
    Hydra where its grammar needs it), is empty."""
    key, _, value = override.partition("=")
    if len(value) > 1 and value[0] == value[-1] == "'":  # quoted for Hydra by the import: the same string
        value = value[1:-1]
    if key in ("data.train_files", "data.val_files") and not value.startswith("["):
        value = f"[{value}]"
    return f"{key}={re.sub(r'[$][(][^)]*[)]', '', value)}"


@pytest.mark.parametrize(
    ("name", "verl_version"),
    [
        pytest.param("grpo-run_qwen2-7b.sh", "0.9", id="grpo-qwen2-7b"),
        pytest.param("ppo-run_qwen2.5-32b.sh", "0.9", id="ppo-qwen2.5-32b"),
        pytest.param("tuning-qwen2-70b_grpo_32_h800_fsdp_vllm.sh", "0.9", id="qwen2-70b-32-gpus"),
        pytest.param("grpo-run_qwen2-7b_math_megatron_lora.sh", "0.9", id="megatron-lora"),
        pytest.param("v0.6.1-ppo-run_gemma.sh", "0.6", id="v0.6.1-gemma"),
        pytest.param("gspo-test_gspo_3b_math.sh", "0.9", id="gspo-with-nodes-set"),
        pytest.param("fully_async-dapo_30b_a3b_base_math_fsdp.sh", "0.9", id="fully-async-two-pools"),
        pytest.param("one_step_off-grpo_3b_gsm8k_fsdp2_2_6.sh", "0.9", id="one-step-off-pools-on-one-node"),
    ],
)
def test_the_imported_job_plans_as_the_scripts_overrides(name: str, verl_version: str) -> None:
    script = _script(name)
    environment = {**ENVIRONMENT, "SLURM_JOB_NUM_NODES": "1"}
    imported = import_script(
        script, name, image="verl:test", verl_version=verl_version, environment=environment
    )
    spec = VerlJob.model_validate(imported.job).spec
    baseline = _baseline(imported.job, script.replace("${SLURM_JOB_NUM_NODES}", "1"))
    assert spec.resources.gpus == baseline.resources.gpus
    nodes = make_nodes(
        max(1, spec.resources.gpus // (spec.resources.gpus_per_node or 8)),
        gpus=spec.resources.gpus_per_node or 8,
    )
    ours, theirs = plan_job(spec, nodes), plan_job(baseline, nodes)
    assert _violations(ours) == _violations(theirs)
    assert ours.feasible == theirs.feasible
    if theirs.plan is not None and ours.plan is not None:
        assert sorted(map(_same_value, ours.plan.overrides)) == sorted(
            map(_same_value, theirs.plan.overrides)
        )
        assert ours.plan.batching == theirs.plan.batching
        assert (ours.plan.nnodes, ours.plan.gpus_per_node) == (theirs.plan.nnodes, theirs.plan.gpus_per_node)
        assert ours.plan.pools == theirs.plan.pools


def test_the_command_line_writes_yaml_and_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "run_grpo.sh"
    script.write_text(
        f"export NCCL_DEBUG=INFO\nN=${{NODES:-2}}\n{MAIN} trainer.nnodes=$N data.train_files=$DATA/t.parquet $@\n"
    )
    assert main(["import", str(script), "--image", "verl:test", "--set", "DATA=/d", "-n", "team"]) == 0
    out, err = capsys.readouterr()
    job = VerlJob.model_validate(yaml.safe_load(out))
    assert job.metadata == {"name": "run-grpo", "namespace": "team"}
    assert job.spec.resources.gpus == 16 and job.spec.data.train_files == ["/d/t.parquet"]
    assert [e.name for e in job.spec.env] == ["NCCL_DEBUG"]
    assert "warning: $@: the script passes its own arguments" in err
    assert "Defaults the script took: NODES=2" in out
    assert main(["import", str(tmp_path / "missing.sh")]) == 2
    assert main(["import", str(script), "--set", "not a name"]) == 2
    assert "--set 'not a name'" in capsys.readouterr().err


def test_hydra_interpolations_are_not_placeholders() -> None:
    assert placeholders("a=${oc.env:HOME}/${data.x}/${X}/${1}/$(cmd arg)/$((N * 2))") == [
        "X",
        "1",
        "$(cmd arg)",
        "$((N * 2))",
    ]
