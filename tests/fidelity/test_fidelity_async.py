"""verl's asynchronous trainer modes judged by verl 0.9.1's own code (``verl_runner_async.py``) and by the
planner: verl's own fully_async and one_step_off scripts, the shipped example of each mode, and one-change
variants verl refuses.

The verdicts compared: a job the planner accepts must launch (the plan's override list passes verl's compose
and the mode's checks: no false acceptance); a job the planner refuses for one of the mode's rules must be one
verl refuses as written (no false rejection); a script verl refuses must be refused by the planner, or
launched with the keys the plan sets (the planner emits ``hybrid_engine=False`` and the NCCL checkpoint engine
where they are unset, which verl's defaults get wrong for these modes).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from verl_envs import VerlEnv, ensure_env

planner = pytest.importorskip("verl_operator.planner", reason="verl_operator.planner cannot be imported")

from verl_operator.api.spec import VerlJob, VerlJobSpec  # noqa: E402
from verl_operator.planner.pools import ENTRYPOINTS  # noqa: E402

HERE = Path(__file__).parent
RUNNER = HERE / "verl_runner_async.py"
SCRIPTS = json.loads((HERE / "data" / "verl-async-scripts.json").read_text())["scripts"]
EXAMPLES = HERE.parents[1] / "examples" / "jobs"
#: The planner's rules for the modes (a refusal by one of them must be verl's).
MODE_RULES = frozenset(
    {
        "separate-async-batch",
        "async-checkpoint-engine",
        "async-reward-model",
        "async-switch-disaggregation",
        "fully-async-batch",
        "fully-async-log-probs",
        "async-hybrid-engine",
        "override-unknown-key",
        "pool-size",
    }
)
SEP = ["trainer.use_v1=True", "trainer.v1.trainer_mode=separate_async", "trainer.nnodes=1"]
SEP_OK = [*SEP, "actor_rollout_ref.rollout.nnodes=1", "data.train_batch_size=256"]
MODES = {module: mode for module, mode in ENTRYPOINTS["0.9"].items() if mode is not None}


def _node(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": f"gpu-{i}",
            "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"},
        },
        "spec": {},
        "status": {
            "allocatable": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


NODES = [_node(i) for i in range(4)]


def _pools(overrides: list[str]) -> int:
    """GPUs of both pools as a script sets them (verl's defaults where unset)."""
    values = dict(o.split("=", 1) for o in overrides if "=" in o)
    trainer = int(values.get("trainer.nnodes", 1)) * int(values.get("trainer.n_gpus_per_node", 8))
    return trainer + int(values.get("rollout.nnodes", 1)) * int(values.get("rollout.n_gpus_per_node", 8))


def _script_spec(row: dict[str, Any], change: tuple[str, ...] = ()) -> VerlJobSpec:
    overrides = [o for o in row["overrides"] if not o.startswith("actor_rollout_ref.model.path=")]
    overrides += list(change)
    return VerlJobSpec.model_validate(
        {
            "verl": {"image": "i", "version": "0.9", "entrypoint": row["module"]},
            "model": {"path": row["model"]},
            "resources": {"gpus": _pools(overrides)},
            "overrides": overrides,
        }
    )


def _example_spec(name: str, change: tuple[str, ...] = ()) -> VerlJobSpec:
    import yaml

    job = VerlJob.model_validate(yaml.safe_load((EXAMPLES / name).read_text()))
    return job.spec.model_copy(update={"overrides": [*job.spec.overrides, *change]})


def _mode(spec: VerlJobSpec) -> str:
    return MODES.get(spec.verl.entrypoint, "separate_async")


@pytest.fixture(scope="module")
def env() -> Iterator[VerlEnv]:
    yield ensure_env("0.9.1")


def judge(env: VerlEnv, requests: list[tuple[str, str, list[str]]]) -> dict[str, dict[str, Any]]:
    """verl 0.9.1's verdicts, one runner process for the batch (argv list, no shell)."""
    payload = {"requests": [{"id": i, "mode": m, "overrides": o} for i, m, o in requests]}
    done = subprocess.run(
        [str(env.python), str(RUNNER)],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return {r["id"]: r for r in json.loads(done.stdout)["results"]}


#: (id, spec builder): verl's scripts, the examples, and one-change variants.
CASES: list[tuple[str, Any]] = [
    *[
        (f"script:{row['source'].rsplit('/', 1)[-1]}:{row['module'].split('.')[2]}", (row, ()))
        for row in SCRIPTS
    ],
    ("example:separate_async", ("async-separate-qwen7b-dgx.yaml", ())),
    ("example:fully_async", ("async-fully-qwen7b-dgx.yaml", ())),
    ("example:one_step_off", ("async-one-step-off-qwen7b-dgx.yaml", ())),
    (
        "separate_async:tb!=pss*mini",
        ("async-separate-qwen7b-dgx.yaml", ("actor_rollout_ref.actor.ppo_mini_batch_size=32",)),
    ),
    (
        "separate_async:naive-engine",
        ("async-separate-qwen7b-dgx.yaml", ("actor_rollout_ref.rollout.checkpoint_engine.backend=naive",)),
    ),
    ("separate_async:colocated-rm", ("async-separate-qwen7b-dgx.yaml", ("reward.reward_model.enable=True",))),
    (
        "separate_async:switch+pd",
        (
            "async-separate-qwen7b-dgx.yaml",
            (
                "trainer.v1.separate_async.hybrid_rollout.enable_switch=True",
                "actor_rollout_ref.rollout.disaggregation.enabled=True",
            ),
        ),
    ),
    ("fully_async:tb512", ("async-fully-qwen7b-dgx.yaml", ("data.train_batch_size=512",))),
    ("fully_async:hybrid", ("async-fully-qwen7b-dgx.yaml", ("actor_rollout_ref.hybrid_engine=True",))),
    ("fully_async:gen-batch", ("async-fully-qwen7b-dgx.yaml", ("data.gen_batch_size=4",))),
    ("fully_async:staleness", ("async-fully-qwen7b-dgx.yaml", ("async_training.staleness_threshold=-1",))),
    (
        "fully_async:trigger0",
        ("async-fully-qwen7b-dgx.yaml", ("async_training.trigger_parameter_sync_step=0",)),
    ),
    ("fully_async:unknown-key", ("async-fully-qwen7b-dgx.yaml", ("rollout.total_epochs=3",))),
    ("fully_async:colocated-rm", ("async-fully-qwen7b-dgx.yaml", ("reward.reward_model.enable=True",))),
    (
        "one_step_off:hybrid",
        ("async-one-step-off-qwen7b-dgx.yaml", ("actor_rollout_ref.hybrid_engine=True",)),
    ),
]


def _spec(args: Any) -> VerlJobSpec:
    source, change = args
    return _script_spec(source, change) if isinstance(source, dict) else _example_spec(source, change)


def _as_written(args: Any, spec: VerlJobSpec) -> list[str]:
    """What verl gets for the case as written: a script's own overrides; for an example's variant, the
    example's plan (what the operator launches) with the one change."""
    source, change = args
    if isinstance(source, dict):
        return list(spec.overrides)
    base = planner.plan_job(_example_spec(source), NODES)
    assert base.plan is not None, base.violations
    return [*base.plan.overrides, *change]


def test_planner_and_verl_agree_on_the_async_modes(env: VerlEnv) -> None:
    specs = {case: _spec(args) for case, args in CASES}
    results = {case: planner.plan_job(spec, NODES) for case, spec in specs.items()}
    requests = []
    for (case, args), spec in zip(CASES, specs.values(), strict=True):
        requests.append((f"{case}|raw", _mode(spec), _as_written(args, spec)))
        plan = results[case].plan
        if plan is not None:
            requests.append((f"{case}|plan", _mode(spec), list(plan.overrides)))
    verdicts = judge(env, requests)
    false_accept, false_reject, missed, rows = [], [], [], []
    for case in specs:
        result, raw = results[case], verdicts[f"{case}|raw"]
        planned = verdicts.get(f"{case}|plan")
        mode_refusals = sorted({v.rule for v in result.violations} & MODE_RULES)
        rows.append(
            f"{case}: planner {'plans' if result.feasible else mode_refusals or 'refuses'}; verl {raw['stage'] if not raw['ok'] else 'ok'}{' / plan ok' if planned and planned['ok'] else ''}"
        )
        if planned is not None and not planned["ok"]:
            false_accept.append((case, planned["error"]))
        if mode_refusals and raw["ok"]:
            false_reject.append((case, mode_refusals))
        if not raw["ok"] and result.feasible and not (planned and planned["ok"]):
            missed.append((case, raw["error"]))
        if not raw["ok"] and not result.feasible and not mode_refusals:
            missed.append(
                (case, f"verl: {raw['error']}; planner only: {[v.rule for v in result.violations]}")
            )
    print("\n".join(rows))
    assert not false_accept, false_accept
    assert not false_reject, false_reject
    assert not missed, missed
    # The sample is honest: verl refuses some and accepts some, every mode is there, each check can fail.
    assert sum(not verdicts[f"{c}|raw"]["ok"] for c in specs) >= 12
    assert sum(r.feasible for r in results.values()) >= 4
    assert {_mode(s) for s in specs.values()} == {"separate_async", "fully_async", "one_step_off"}


def test_a_broken_plan_is_refused_by_verl(env: VerlEnv) -> None:
    """The oracle can fail: the separate_async example's plan with its mini-batch changed is refused."""
    spec = _example_spec("async-separate-qwen7b-dgx.yaml")
    result = planner.plan_job(spec, NODES)
    assert result.plan is not None
    broken = [*result.plan.overrides, "actor_rollout_ref.actor.ppo_mini_batch_size=32"]
    verdict = judge(env, [("broken", "separate_async", broken)])["broken"]
    assert not verdict["ok"] and "trainer_separate_async.py:59" in verdict["error"]


@pytest.mark.parametrize("mode", ["fully_async", "one_step_off"])
def test_the_recipe_key_table_is_the_recipes_config(env: VerlEnv, mode: str) -> None:
    """``pools.RECIPE_CONFIG_KEYS`` holds the keys verl 0.9.1's own config of the mode adds to ppo_trainer."""
    from verl_operator.planner.pools import RECIPE_CONFIG_KEYS

    payload = {"requests": [{"id": mode, "mode": mode, "keys": True}]}
    done = subprocess.run(
        [str(env.python), str(RUNNER)],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    (result,) = json.loads(done.stdout)["results"]
    table = RECIPE_CONFIG_KEYS[("0.9", mode)] - {
        "data.gen_batch_size"
    }  # ppo_trainer's own key, listed for 0.6
    assert set(result["keys"]) == table
