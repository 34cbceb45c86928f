"""verl 0.6.1's own trainer runs planned jobs through the launcher on a real two-node Ray, on CPU.

Each job is planned by the planner on two one-GPU nodes, turned into ``launch.json`` by the operator's
builder and run by ``verl-launcher head`` and ``worker`` with verl's unmodified ``main_ppo``: HF rollout
(the CPU shim's stand-in for vLLM's sync rollout), old and reference log-probs, the actor update and, for
PPO, the critic, two real steps each. The assertions read what verl printed, as the launcher parsed it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from realverl_job import LocalJob, job_spec, plan, run_two_nodes

# The first test may build the environment (minutes of downloads) when `make test-realverl` has not.
pytestmark = [pytest.mark.realverl, pytest.mark.timeout(1500)]

#: The phases verl 0.6.1 times in every step (ray_trainer.py 1036-1213); the test adds each job's own.
COMMON_PHASES = (
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/old_log_prob",
    "timing_s/adv",
    "timing_s/update_actor",
)
JOB_SECONDS = 420  # a job takes 30-60 s on an idle 2-core machine; a busy shared one is several times slower


@pytest.mark.parametrize(
    ("algorithm", "phases"),
    [
        pytest.param("grpo", ("timing_s/ref",), id="grpo-reference-kl"),
        pytest.param("ppo", ("timing_s/values", "timing_s/update_critic"), id="ppo-critic"),
    ],
)
def test_verl_trains_two_steps_through_the_launcher(
    assets: Path, local_job: LocalJob, algorithm: str, phases: tuple[str, ...]
) -> None:
    spec = plan(f"cpu-{algorithm}", job_spec(assets, algorithm))
    # The planner's argv, unchanged: the launcher runs what the operator would write into launch.json.
    assert spec.nnodes == 2 and spec.gpus_per_node == 1
    assert spec.entrypoint == ("python3", "-m", "verl.trainer.main_ppo")
    assert "actor_rollout_ref.rollout.name=vllm" in spec.overrides
    started = time.monotonic()
    head, worker = run_two_nodes(local_job, spec, JOB_SECONDS)
    elapsed = time.monotonic() - started
    output = head.output()
    assert head.proc.returncode == 0, output[-6000:]
    assert head.termination() == {"reason": "Succeeded", "message": "verl finished at step 2 of 2"}
    # verl's own lines, as its console logger printed them through Ray's driver.
    assert "(TaskRunner pid=" in output and "step:2 - " in output
    progress = local_job.progress
    assert progress["step"] == 2 and progress["totalSteps"] == 2
    metrics = progress["metrics"]
    missing = [key for key in (*COMMON_PHASES, *phases, "timing_s/step") if key not in metrics]
    assert not missing, f"phases missing from verl's step line: {missing}; got {sorted(metrics)}"
    assert metrics["timing_s/step"] > 0 and progress["stepSeconds"] == metrics["timing_s/step"]
    assert metrics["training/global_step"] == 2
    # A real update: the reward varies between responses, so the actor's gradient is not zero.
    assert metrics["actor/grad_norm"] > 0
    if algorithm == "ppo":
        assert metrics["critic/grad_norm"] > 0 and "critic/vf_loss" in metrics
    else:
        assert "actor/kl_loss" in metrics and "timing_s/values" not in metrics
    # verl's workers spanned both Ray nodes: the worker's launcher left with the cluster, as in a pod.
    assert worker.proc.wait(60) == 0, worker.output()[-4000:]
    print(f"{algorithm}: 2 verl steps in {elapsed:.0f}s, step 2 took {metrics['timing_s/step']:.2f}s")


def test_a_job_verl_refuses_at_run_time_fails_with_verls_error(assets: Path, local_job: LocalJob) -> None:
    """The planner cannot know the data file is missing; verl's own dataset loader refuses it."""
    missing = assets / "data" / "absent.parquet"
    spec = plan("cpu-missing-data", job_spec(assets, "grpo", train_file=missing))
    head, _ = run_two_nodes(local_job, spec, JOB_SECONDS)
    assert head.proc.returncode == 10, head.output()[-6000:]
    termination = head.termination()
    assert termination["reason"] == "VerlFailed"
    message = termination["message"]
    # The exception verl raised, not the hint Hydra prints after it.
    assert message == f"verl exited with code 1 at step 0: FileNotFoundError: Unable to find '{missing}'"
