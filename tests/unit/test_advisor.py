"""The advisor on verl's own published step output (tests/unit/data/verl-output/README.md names the sources)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_contract.verl_metrics import StepRecord, read_steps
from verl_operator.advisor import NoStepsError, advise, analyse
from verl_operator.advisor.advise import _refusal
from verl_operator.advisor.replan import Change, apply_change, replan
from verl_operator.cli import main
from verl_operator.commands.plan import load_job, load_nodes

DATA = Path(__file__).parent / "data"
OUTPUT = DATA / "verl-output"
JOB = DATA / "advisor" / "qwen3-8b-megatron.yaml"
NODES = Path(__file__).parents[2] / "examples" / "clusters" / "h20.yaml"


def records(name: str) -> list[StepRecord]:
    return list(read_steps((OUTPUT / name).read_text(encoding="utf-8").splitlines()))


def as_file_logger(recs: list[StepRecord]) -> list[str]:
    """The same steps as verl's FileLogger writes them: json.dumps({"step": N, "data": metrics}) per line
    (verl/utils/tracking.py FileLogger.log, 0.6.1 :227-246)."""
    return [json.dumps({"step": r.step, "data": r.metrics}) for r in recs]


@pytest.mark.parametrize(
    ("name", "step", "seconds", "bottleneck", "gen_share"),
    [
        pytest.param("qwen3-8b-megatron-before.log", 3, 1268.488, "gen", 0.551, id="qwen3-8b-before"),
        pytest.param("qwen3-8b-megatron-after.log", 3, 927.681, "gen", 0.536, id="qwen3-8b-after"),
        pytest.param("gsm8k-vllm-ray-wrapped.log", 1, 93.524, "update_actor", 0.262, id="gsm8k-ray-wrapped"),
    ],
)
def test_console_output_phases(
    name: str, step: int, seconds: float, bottleneck: str, gen_share: float
) -> None:
    recs = records(name)
    assert [r.step for r in recs] == [step]
    run = analyse(recs)
    assert run.step_seconds == pytest.approx(seconds, abs=1e-3)
    assert run.bottleneck == bottleneck
    assert run.generation_share == pytest.approx(gen_share, abs=1e-3)
    # Sub-timings of gen and the timers outside the step are not phases; shares are seconds over the step.
    assert not any(
        n.startswith("agent_loop") or n in ("step", "start_profile", "stop_profile") for n in run.phases
    )
    for phase in run.phases.values():
        assert phase.share == pytest.approx(phase.seconds / run.step_seconds)


def test_file_logger_reads_as_the_console() -> None:
    recs = records("gsm8k-vllm-ray-wrapped.log") + records("qwen3-8b-megatron-after.log")
    recs[1] = StepRecord(step=2, metrics=recs[1].metrics)
    console = analyse(recs)
    jsonl = analyse(read_steps(as_file_logger(recs)))
    assert jsonl.phases == console.phases
    assert jsonl.step_seconds == console.step_seconds


def test_release_0_4_values_and_validation_step() -> None:
    recs = records("issue-2060-v0.4.log")
    assert [r.step for r in recs] == [0, 1]
    assert recs[0].metrics["val-core/openai/gsm8k/acc/mean@1"] == 0.508
    assert recs[1].metrics["actor/ppo_kl"] == -0.0
    assert recs[1].metrics["training/global_step"] == 1.0
    with pytest.raises(NoStepsError, match="timing_s/step"):
        analyse(recs)


def test_early_timing_names_read_as_timing_s() -> None:
    recs = records("quickstart-timing.log")
    assert recs[1].metrics["timing_s/gen"] == 23.020
    assert "timing/gen" not in recs[1].metrics


@pytest.mark.parametrize(
    ("gens", "warmup", "gen_seconds"),
    [
        pytest.param([9.0, 5.0, 6.0], 1, 5.5, id="3-steps-1-warmup"),
        pytest.param([9.0, 8.0, 5.0, 6.0, 4.0, 5.0], 2, 5.0, id="6-steps-2-warmup"),
        pytest.param([9.0, 5.0], 0, 7.0, id="2-steps-no-warmup"),
    ],
)
def test_median_after_warmup(gens: list[float], warmup: int, gen_seconds: float) -> None:
    recs = [
        StepRecord(i + 1, {"timing_s/step": 10.0, "timing_s/gen": g, "timing_s/update_actor": 3.0})
        for i, g in enumerate(gens)
    ]
    run = analyse(recs)
    assert run.warmup == warmup
    assert run.phases["gen"].seconds == gen_seconds
    assert run.phases["gen"].share == gen_seconds / 10.0


def test_a_restarted_step_keeps_its_last_record() -> None:
    recs = [
        StepRecord(1, {"timing_s/step": 10.0, "timing_s/gen": 9.0}),
        StepRecord(1, {"timing_s/step": 4.0}),
    ]
    assert analyse(recs).step_seconds == 4.0


@pytest.mark.parametrize(
    ("gpus", "gen", "step", "split"),
    [
        # verl docs/advance/fully_async.md, Qwen2.5-7B colocate sync rows on H20 (gen, step) and the split verl ran.
        pytest.param(32, 357.41, 790.10, (16, 16), id="7b-32-h20-16-16"),
        pytest.param(128, 177.85, 356.30, (64, 64), id="7b-128-h20-64-64"),
    ],
)
def test_async_split_from_measured_phases(gpus: int, gen: float, step: int, split: tuple[int, int]) -> None:
    run = analyse(
        [StepRecord(1, {"timing_s/step": step, "timing_s/gen": gen, "timing_s/update_actor": step - gen})]
    )
    report = advise(run, gpus=gpus)
    assert report.async_split is not None
    assert (report.async_split.rollout_gpus, report.async_split.trainer_gpus) == split
    item = report.advice[0]
    assert (item.rule, item.setting, item.value, item.checked) == (
        "async-trainer",
        "rollout.nnodes",
        split[0] // 8,
        False,
    )


def test_an_asynchronous_run_gets_no_async_advice() -> None:
    run = analyse(
        [StepRecord(1, {"timing_s/step": 10.0, "timing_s/gen": 8.0, "timing_s/wait_prev_gen": 1.0})]
    )
    assert all(a.rule != "async-trainer" for a in advise(run, gpus=16).advice)


@pytest.fixture(scope="module")
def job_and_nodes():  # type: ignore[no-untyped-def]
    return load_job(str(JOB)), load_nodes(str(NODES))


def test_advice_for_the_qwen3_8b_run_is_replanned(job_and_nodes) -> None:  # type: ignore[no-untyped-def]
    job, nodes = job_and_nodes
    from verl_operator.planner import plan_job

    plan = plan_job(job.spec, nodes).plan
    report = advise(analyse(records("qwen3-8b-megatron-before.log")), spec=job.spec, plan=plan, nodes=nodes)
    got = {a.rule: (a.setting, a.value) for a in report.advice}
    assert got == {
        "async-trainer": ("rollout.n_gpus_per_node", 4),
        "rollout-tp": ("spec.rollout.tensorParallelSize", 2),
        "response-length": ("spec.data.maxResponseLength", 8192),
        "gpu-memory-utilization": ("spec.rollout.gpuMemoryUtilization", 0.9),
        "log-prob-micro-batch": ("spec.batching.logProbMicroBatchSizePerGpu", 32),
    }
    assert report.advice[0].rule == "async-trainer"
    assert all(a.checked for a in report.advice)
    # Every piece of advice plans and fits the GPU when applied.
    for item in report.advice:
        if item.rule == "async-trainer":
            continue
        path = item.setting.removeprefix("spec.")
        result = plan_job(apply_change(job.spec, Change("spec." + path, item.value)), nodes)
        assert _refusal(result) is None, item
    log_prob = next(a for a in report.advice if a.rule == "log-prob-micro-batch")
    assert "241.5 s (19% of the step) in 640 forward passes" in log_prob.reason


def test_a_change_estimated_over_the_gpu_is_refused(job_and_nodes) -> None:  # type: ignore[no-untyped-def]
    job, nodes = job_and_nodes
    result = replan(job.spec, nodes, Change("log_prob_micro_batch_size_per_gpu", 64))
    assert result.feasible  # the planner accepts a pinned value it estimates over, with a warning
    assert _refusal(result) == "the log-prob peak is estimated at 138.8 GiB of 95.6 GiB"


def test_apply_change_replaces_the_overrides_that_pinned_it(job_and_nodes) -> None:  # type: ignore[no-untyped-def]
    job, _ = job_and_nodes
    pinned = job.spec.model_copy(
        update={"overrides": [*job.spec.overrides, "actor_rollout_ref.rollout.tensor_model_parallel_size=4"]}
    )
    changed = apply_change(pinned, Change("rollout_tp", 2))
    assert changed.rollout.tensor_parallel_size == 2
    assert not any("tensor_model_parallel_size" in o and "rollout" in o for o in changed.overrides)
    bucket = apply_change(
        job.spec, Change("actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes", 4096)
    )
    assert (
        bucket.overrides[-1]
        == "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=4096"
    )


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "advise",
            "--metrics",
            str(OUTPUT / "qwen3-8b-megatron-before.log"),
            "-f",
            str(JOB),
            "--nodes",
            str(NODES),
            "-o",
            "json",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert {"phases", "bottleneck", "advice", "asyncSplit"} <= out.keys()
    assert out["phases"]["gen"] == {"seconds": 698.88, "share": 0.551}
    assert out["asyncSplit"] == {"rolloutGpus": 4, "trainerGpus": 4}
    assert all({"setting", "value", "reason"} <= a.keys() for a in out["advice"])


def test_cli_weight_sync_and_clip_on_the_ray_console(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "--metrics", str(OUTPUT / "gsm8k-vllm-ray-wrapped.log"), "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "asyncSplit" not in out
    settings = {a["setting"]: a["value"] for a in out["advice"]}
    assert settings["actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"] == 4096
    assert settings["spec.data.maxResponseLength"] == 2048
    assert not any(a["checked"] for a in out["advice"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--metrics", str(OUTPUT / "issue-2060-v0.4.log")],
            "no step record with timing_s/step",
            id="no-step-time",
        ),
        pytest.param(
            ["--metrics", str(OUTPUT / "qwen3-8b-megatron-before.log"), "-f", str(JOB)],
            "go together",
            id="job-without-nodes",
        ),
        pytest.param(["--metrics", "/nonexistent/run.log"], "cannot read", id="unreadable"),
    ],
)
def test_cli_errors(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", *args]) == 2
    assert message in capsys.readouterr().err
