"""A two-pool job's split from a previous run's measured phase times (``advisor/balance.py``), checked against
the runs verl published (``docs/advance/fully_async.md``, ``docs/advance/one_step_off.md``; the rows of
``/work/shared/data/verl-measured-runs.csv`` kind ``measured``), the planner's use of it and ``verl-operator
plan --metrics``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml
from conftest import make_nodes

from verl_contract.verl_metrics import read_steps
from verl_operator.advisor.balance import BalanceError, Pools, measured_balance
from verl_operator.advisor.phases import RunPhases, analyse
from verl_operator.api.spec import VerlJob
from verl_operator.commands import plan as plan_cmd
from verl_operator.planner import plan_job
from verl_operator.planner.split_model import Measured, candidates

ROOT = Path(__file__).resolve().parents[2]
FULLY = ROOT / "examples" / "jobs" / "async-fully-qwen7b-dgx.yaml"


def console(phases: dict[str, float], steps: int = 3) -> list[str]:
    """verl's console lines of ``steps`` steps with these ``timing_s/*`` seconds."""
    fields = " - ".join(f"timing_s/{k}:{v}" for k, v in phases.items())
    return [f"step:{i} - {fields}" for i in range(1, steps + 1)]


def run_of(phases: dict[str, float]) -> RunPhases:
    return analyse(read_steps(console(phases)))


def whole_nodes(gpus: int, fraction: float) -> tuple[int, int]:
    """The planner's first split in nodes of 8: (rollout, trainer) GPUs."""
    trainer = candidates(gpus, 8, fraction)[0]
    return gpus - trainer, trainer


# verl docs/advance/fully_async.md: the colocated sync runs (H20) and the rollout:trainer split verl's authors
# ran fully_async with on the same GPUs.
COLOCATED = [
    pytest.param(
        32,
        {"step": 790.1, "gen": 357.41, "old_log_prob": 107.71, "update_actor": 269.8},
        (16, 16),
        id="7b-32",
    ),
    pytest.param(
        128,
        {"step": 356.3, "gen": 177.85, "old_log_prob": 53.92, "update_actor": 113.81},
        (64, 64),
        id="7b-128",
    ),
    pytest.param(
        128,
        {"step": 497.89, "gen": 348.05, "old_log_prob": 28.73, "ref": 20.86, "update_actor": 86.27},
        (96, 32),
        id="30b-a3b-128",
    ),
]


@pytest.mark.parametrize(("gpus", "phases", "published"), COLOCATED)
def test_a_colocated_run_gives_verls_published_split(
    gpus: int, phases: dict[str, float], published: tuple[int, int]
) -> None:
    measured = measured_balance(run_of(phases), "fully_async")
    assert measured.kind == "colocated"
    assert whole_nodes(gpus, measured.rollout_fraction) == published


def test_the_64_gpu_run_is_one_node_off() -> None:
    """fully_async.md's 64-GPU run: gen 150.72 s against 203.67 s of training gives rollout 42.5%, 24 : 40 in
    whole nodes where verl ran 32 : 32 (``docs/planner.md`` lists the miss)."""
    phases = {"step": 365.28, "gen": 150.72, "old_log_prob": 70.26, "update_actor": 133.41}
    measured = measured_balance(run_of(phases), "fully_async")
    assert measured.rollout_fraction == pytest.approx(150.72 / (150.72 + 203.67), abs=1e-4)
    assert whole_nodes(64, measured.rollout_fraction) == (24, 40)


@pytest.mark.parametrize(
    ("phases", "published_share", "error"),
    [
        # docs/advance/one_step_off.md, colocated sync on 16 H20; verl ran one_step_off with 4 rollout : 12.
        pytest.param({"step": 749, "gen": 321, "old_log_prob": 88, "update_actor": 286}, 0.25, 0.02, id="fsdp2"),
        pytest.param({"step": 699, "gen": 207, "old_log_prob": 119, "update_actor": 344}, 0.25, 0.12, id="megatron"),
    ],
)  # fmt: skip
def test_one_step_off_scales_a_colocated_measurement(
    phases: dict[str, float], published_share: float, error: float
) -> None:
    one_step = measured_balance(run_of(phases), "one_step_off").rollout_fraction
    streaming = measured_balance(run_of(phases), "fully_async").rollout_fraction
    assert one_step < streaming
    assert abs(one_step - published_share) <= error


@pytest.mark.parametrize(
    ("gpus", "pools", "phases"),
    [
        # fully_async.md's fully_async runs: 0.6.1's trainer times its wait for samples as ``gen``.
        pytest.param(
            32,
            Pools(16, 16),
            {"step": 294.77, "gen": 21.26, "update_actor": 313.81, "param_sync": 5.0},
            id="7b-32",
        ),
        pytest.param(
            128,
            Pools(96, 32),
            {"step": 282.75, "gen": 22.06, "ref": 50.05, "update_actor": 206.63, "param_sync": 5.0},
            id="30b-a3b-128",
        ),
    ],
)
def test_a_two_pool_run_that_waits_for_rollout_keeps_its_split(
    gpus: int, pools: Pools, phases: dict[str, float]
) -> None:
    measured = measured_balance(run_of(phases), "fully_async", pools)
    assert measured.kind == "pools" and "the rollout pool is the bottleneck" in measured.basis
    assert whole_nodes(gpus, measured.rollout_fraction) == (pools.rollout_gpus, pools.trainer_gpus)


def test_one_step_offs_published_run_keeps_its_split() -> None:
    """one_step_off.md FSDP2: 4 rollout : 12 trainer GPUs, the trainer waited 45 s (wait_prev_gen) of 520 s."""
    run = run_of({"step": 520, "wait_prev_gen": 45, "old_log_prob": 108, "update_actor": 337})
    measured = measured_balance(run, "one_step_off", Pools(4, 12))
    assert measured.rollout_fraction == pytest.approx(0.2675, abs=1e-3)
    assert round(16 * measured.rollout_fraction) == 4


def test_idle_ratios_measure_both_pools() -> None:
    """A trainer idle half the time beside a rollouter never idle: rollout work is twice the training work."""
    lines = [
        f"step:{i} - timing_s/step:100 - timing_s/gen:50 - timing_s/param_sync:2 - "
        "trainer/idle_ratio:0.5 - rollouter/idle_ratio:0.0"
        for i in (1, 2, 3)
    ]
    measured = measured_balance(analyse(read_steps(lines)), "fully_async", Pools(16, 16))
    assert measured.rollout_fraction == pytest.approx(2 / 3, abs=1e-4)
    assert "idle rollouter 0%, trainer 50%" in measured.basis


def test_a_trainer_that_never_waits_keeps_the_runs_split() -> None:
    run = run_of({"step": 100, "wait_for_enough_samples": 0.5, "update_actor": 90})
    measured = measured_balance(run, "fully_async", Pools(8, 24))
    assert measured.rollout_fraction == pytest.approx(0.25)
    assert "never waited" in measured.basis


def test_what_does_not_measure_the_balance() -> None:
    with pytest.raises(BalanceError, match="two-pool run"):
        measured_balance(run_of({"step": 100, "wait_prev_gen": 10, "update_actor": 80}), "one_step_off")
    with pytest.raises(BalanceError, match="timing_s/gen"):
        measured_balance(run_of({"step": 100, "update_actor": 80}), "fully_async")
    with pytest.raises(BalanceError, match="ROLLOUT:TRAINER"):
        Pools.parse("16")
    assert Pools.parse("8:24") == Pools(8, 24)


def test_the_planner_splits_by_the_measured_balance() -> None:
    spec = VerlJob.model_validate(yaml.safe_load(FULLY.read_text())).spec
    spec = spec.model_copy(update={"resources": spec.resources.model_copy(update={"gpus": 32})})
    nodes = make_nodes(4, 8)
    model = plan_job(spec, nodes)
    assert model.plan is not None and model.plan.pools is not None
    assert model.plan.pools.split == "model"
    assert model.plan.pools.rollout is not None and model.plan.pools.rollout.gpus == 16
    measured = Measured(0.7192, "a 30B-like run", "colocated")
    result = plan_job(spec, nodes, measured=measured)
    assert result.plan is not None and result.plan.pools is not None
    p = result.plan.pools
    assert (p.split, p.measured_rollout_fraction, p.split_basis) == ("measured", 0.7192, "a 30B-like run")
    assert p.rollout is not None and (p.rollout.gpus, p.trainer.gpus) == (24, 8)
    assert "rollout.nnodes=3" in result.plan.overrides


def test_a_pinned_split_stays_and_warns_of_the_measured_one() -> None:
    spec = VerlJob.model_validate(yaml.safe_load(FULLY.read_text())).spec
    resources = spec.resources.model_copy(update={"gpus": 32, "rollout_gpus": 16})
    result = plan_job(spec.model_copy(update={"resources": resources}), make_nodes(4, 8),
                      measured=Measured(0.7192, "run", "colocated"))  # fmt: skip
    assert result.plan is not None and result.plan.pools is not None
    assert result.plan.pools.split == "pinned"
    assert any("would give 24 (spec.resources.rolloutGpus: 24)" in w for w in result.warnings)


def run_plan(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="verl-operator")
    plan_cmd.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", *argv])
    code: int = args.func(args)
    return code


def _files(tmp_path: Path, phases: dict[str, float]) -> tuple[str, str, str]:
    doc = yaml.safe_load(FULLY.read_text())
    doc["spec"]["resources"]["gpus"] = 32
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": make_nodes(4, 8)}))
    metrics = tmp_path / "run.log"
    metrics.write_text("\n".join(console(phases)) + "\n")
    return str(job), str(nodes), str(metrics)


THIRTY_B = {"step": 497.89, "gen": 348.05, "old_log_prob": 28.73, "ref": 20.86, "update_actor": 86.27}


def test_plan_metrics_shows_the_split_and_its_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job, nodes, metrics = _files(tmp_path, THIRTY_B)
    assert run_plan(["-f", job, "--nodes", nodes, "--metrics", metrics, "-o", "json"]) == 0
    pools = json.loads(capsys.readouterr().out)["plan"]["pools"]
    assert (pools["split"], pools["rollout"]["gpus"], pools["trainer"]["gpus"]) == ("measured", 24, 8)
    assert pools["measuredRolloutFraction"] == pytest.approx(0.7192, abs=1e-4)
    assert pools["splitBasis"].startswith("run.log: colocated, gen 348.1 s vs training 135.9 s per step")
    assert run_plan(["-f", job, "--nodes", nodes, "--metrics", metrics]) == 0
    table = capsys.readouterr().out
    assert "split                   measured 72% rollout (model 46%); 4 nodes" in table
    assert "measured                run.log: colocated" in table


def test_plan_metrics_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job, nodes, metrics = _files(tmp_path, {"step": 100, "wait_prev_gen": 10, "update_actor": 80})
    assert run_plan(["-f", job, "--nodes", nodes, "--metrics", metrics]) == 2
    assert "give its pools" in capsys.readouterr().err
    assert run_plan(["-f", job, "--nodes", nodes, "--measured-pools", "8:24"]) == 2
    assert "--measured-pools goes with --metrics" in capsys.readouterr().err
    assert run_plan(["-f", job, "--nodes", nodes, "--metrics", metrics, "--measured-pools", "8:24"]) == 0


def _with_status(tmp_path: Path, status: dict[str, object] | None) -> tuple[str, str]:
    doc = yaml.safe_load(FULLY.read_text())
    doc["spec"]["resources"]["gpus"] = 32
    if status is not None:
        doc["status"] = status
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": make_nodes(4, 8)}))
    return str(job), str(nodes)


def test_plan_from_the_jobs_own_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A colocated last run (no rollout pool in status.plan): fully_async.md's 30B-A3B step as the progress."""
    phases = {k: v for k, v in THIRTY_B.items() if k != "step"}
    progress = {"step": 12, "stepSeconds": THIRTY_B["step"], "phases": phases}
    job, nodes = _with_status(tmp_path, {"phase": "Succeeded", "progress": progress})
    assert run_plan(["-f", job, "--nodes", nodes, "--from-status", "-o", "json"]) == 0
    pools = json.loads(capsys.readouterr().out)["plan"]["pools"]
    assert (pools["split"], pools["rollout"]["gpus"], pools["trainer"]["gpus"]) == ("measured", 24, 8)
    assert pools["splitBasis"].startswith("status.progress (step 12): colocated, gen 348.1 s")


def test_a_two_pool_status_is_read_on_its_own_pools(tmp_path: Path) -> None:
    """fully_async.md's 7B fully_async run (16 : 16, the trainer waited 21.26 s of 294.77) as the last run."""
    status = {
        "progress": {"step": 40, "stepSeconds": 294.77, "phases": {"gen": 21.26, "update_actor": 313.81, "param_sync": 5.0}},
        "plan": {"pools": {"split": "model", "trainer": {"gpus": 16}, "rollout": {"gpus": 16}}},
    }  # fmt: skip
    from verl_operator.advisor.balance import balance_from_status

    measured = balance_from_status(status, "fully_async")
    assert measured.kind == "pools" and "16 rollout : 16 trainer GPUs" in measured.basis
    assert whole_nodes(32, measured.rollout_fraction) == (16, 16)


def test_from_status_needs_a_logged_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job, nodes = _with_status(tmp_path, {"phase": "Running", "progress": {"step": 0}})
    assert run_plan(["-f", job, "--nodes", nodes, "--from-status"]) == 2
    assert "has not logged a step yet" in capsys.readouterr().err
    job, nodes = _with_status(tmp_path, None)
    assert run_plan(["-f", job, "--nodes", nodes, "--from-status"]) == 2
    metrics = tmp_path / "run.log"
    metrics.write_text("\n".join(console(THIRTY_B)) + "\n")
    assert run_plan(["-f", job, "--nodes", nodes, "--from-status", "--metrics", str(metrics)]) == 2
    assert "give one" in capsys.readouterr().err
