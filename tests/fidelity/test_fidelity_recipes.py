"""verl 0.6.1's asynchronous recipes judged by verl 0.6.1's own config code and by the planner: the launch
scripts of ``recipe/fully_async_policy`` and ``recipe/one_step_off_policy`` and one-change variants verl refuses.

verl 0.6.1's wheel has no ``recipe`` package, so the recipes' configs and the files holding their checks are a
byte-for-byte copy of the repository's at tag v0.6.1 (``data/verl-0.6.1-recipes``, written with the scripts'
commands by ``corpus/extract_recipes.py``); the rest (``ppo_trainer`` and everything it composes) is the
installed verl 0.6.1's. ``verl_runner_async.py`` composes each launch with the recipe's own config and runs the
recipe's own checks (its docstring lists them).

The verdicts compared, as for 0.9.1 (``test_fidelity_async.py``): a job the planner accepts must launch (its
plan's override list passes verl's compose and checks: no false acceptance); a job the planner refuses for one
of the modes' rules must be one verl refuses as written (no false rejection); a launch verl refuses must be
refused by the planner, or launched with the keys the plan sets (no miss).
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

from verl_operator.api.spec import VerlJobSpec  # noqa: E402
from verl_operator.planner.pools import ENTRYPOINTS, megatron_config_name  # noqa: E402

HERE = Path(__file__).parent
RUNNER = HERE / "verl_runner_async.py"
RECIPES = HERE / "data" / "verl-0.6.1-recipes"
SCRIPTS = json.loads((HERE / "data" / "verl-0.6.1-recipe-scripts.json").read_text())["scripts"]
#: Scripts left out, with the reason.
EXCLUDED = {
    "geo3k_qwen25vl_7b_megatron_4_4.sh": "a vision-language model (Qwen2.5-VL-7B) outside the planner's catalog",
}
MODES = {module: mode for module, mode in ENTRYPOINTS["0.6"].items() if mode is not None}
#: The planner's rules for the recipes (a refusal by one of them must be verl's).
MODE_RULES = frozenset(
    {
        "fully-async-batch",
        "fully-async-log-probs",
        "async-hybrid-engine",
        "async-reward-model",
        "override-unknown-key",
        "pool-size",
        "rollout-pool",
        "rollout-mode",
    }
)


def _node(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": f"gpu-{i:02d}",
            "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"},
        },
        "spec": {},
        "status": {
            "allocatable": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


NODES = [_node(i) for i in range(16)]  # 128 GPUs: the largest scripts (64 + 64, 96 + 32)


def _name(row: dict[str, Any]) -> str:
    return str(row["source"]).rsplit("/", 1)[-1]


def _values(overrides: list[str]) -> dict[str, str]:
    return dict(o.split("=", 1) for o in overrides if "=" in o and not o.startswith("-"))


def _pools(overrides: list[str]) -> int:
    """GPUs of both pools as a script sets them (the recipes' defaults, 1 x 8 each, where unset)."""
    v = _values(overrides)
    trainer = int(v.get("trainer.nnodes", 1)) * int(v.get("trainer.n_gpus_per_node", 8))
    return trainer + int(v.get("rollout.nnodes", 1)) * int(v.get("rollout.n_gpus_per_node", 8))


def _spec(row: dict[str, Any], change: tuple[str, ...]) -> VerlJobSpec:
    overrides = [o for o in row["overrides"] if not o.startswith("actor_rollout_ref.model.path=")]
    overrides = [*row["options"], *overrides, *change]
    return VerlJobSpec.model_validate(
        {
            "verl": {"image": "i", "version": "0.6", "entrypoint": row["module"]},
            "model": {"path": row["model"]},
            "resources": {"gpus": _pools(overrides)},
            "overrides": overrides,
        }
    )


def _row(name: str, mode: str) -> dict[str, Any]:
    return next(r for r in SCRIPTS if _name(r) == name and MODES[r["module"]] == mode)


FA, OSO, OSO_MEGATRON = (
    "dapo_7b_math_fsdp2_8_8.sh",
    "grpo_0.6b_gsm8k_fsdp2_2_6.sh",
    "dapo_7b_math_megatron_4_12.sh",
)
#: (id, script row, one change): verl's scripts as written, then one-change variants.
CASES: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    *[(f"script:{_name(r)}:{MODES[r['module']]}", r, ()) for r in SCRIPTS if _name(r) not in EXCLUDED],
    ("fully_async:tb64", _row(FA, "fully_async"), ("data.train_batch_size=64",)),
    ("fully_async:hybrid", _row(FA, "fully_async"), ("actor_rollout_ref.hybrid_engine=True",)),
    ("fully_async:gen-batch", _row(FA, "fully_async"), ("data.gen_batch_size=4",)),
    ("fully_async:staleness", _row(FA, "fully_async"), ("async_training.staleness_threshold=-1",)),
    ("fully_async:trigger0", _row(FA, "fully_async"), ("async_training.trigger_parameter_sync_step=0",)),
    ("fully_async:0.9-key", _row(FA, "fully_async"), ("async_training.use_trainer_do_validate=True",)),
    ("fully_async:rollout-sync", _row(FA, "fully_async"), ("actor_rollout_ref.rollout.mode=sync",)),
    ("fully_async:no-log-probs", _row(FA, "fully_async"), ("actor_rollout_ref.rollout.calculate_log_probs=False",)),
    ("fully_async:rollout0", _row(FA, "fully_async"), ("rollout.nnodes=0",)),
    ("one_step_off:hybrid", _row(OSO, "one_step_off"), ("actor_rollout_ref.hybrid_engine=True",)),
    ("one_step_off:fully-async-key", _row(OSO, "one_step_off"), ("rollout.total_rollout_steps=10",)),
    ("one_step_off:rollout0", _row(OSO, "one_step_off"), ("rollout.nnodes=0",)),
    ("one_step_off:1-gpu-for-tp2", _row(OSO, "one_step_off"), ("rollout.n_gpus_per_node=1",)),
    ("one_step_off:megatron-async", _row(OSO_MEGATRON, "one_step_off"), ("actor_rollout_ref.rollout.mode=async",)),
]  # fmt: skip


@pytest.fixture(scope="module")
def env() -> Iterator[VerlEnv]:
    yield ensure_env("0.6.1")


def judge(env: VerlEnv, requests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """verl 0.6.1's verdicts, one runner process for the batch (argv list, no shell)."""
    payload = {"requests": [{**r, "recipes": str(RECIPES)} for r in requests]}
    done = subprocess.run(
        [str(env.python), str(RUNNER)],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return {r["id"]: r for r in json.loads(done.stdout)["results"]}


def _config_name(options: list[str]) -> str | None:
    return next((o.split("=", 1)[1] for o in options if o.startswith("--config-name=")), None)


def _planned(case: str, spec: VerlJobSpec, plan: Any) -> dict[str, Any]:
    """What the operator launches: the plan's overrides, with the recipe's Megatron config for that engine."""
    megatron = plan.training is not None and plan.training.engine == "megatron"
    return {
        "id": f"{case}|plan",
        "mode": MODES[spec.verl.entrypoint],
        "overrides": [o for o in plan.overrides if not o.startswith("-")],
        "config_name": megatron_config_name(spec.verl.entrypoint) if megatron else None,
    }


def test_planner_and_verl_061_agree_on_the_recipes(env: VerlEnv) -> None:
    specs = {case: _spec(row, change) for case, row, change in CASES}
    results = {case: planner.plan_job(spec, NODES) for case, spec in specs.items()}
    requests = []
    for case, row, change in CASES:
        requests.append(
            {
                "id": f"{case}|raw",
                "mode": MODES[row["module"]],
                "overrides": [*row["overrides"], *change],
                "config_name": _config_name(row["options"]),
            }
        )
        plan = results[case].plan
        if plan is not None:
            requests.append(_planned(case, specs[case], plan))
    verdicts = judge(env, requests)
    false_accept, false_reject, missed, rows = [], [], [], []
    for case in specs:
        result, raw = results[case], verdicts[f"{case}|raw"]
        planned = verdicts.get(f"{case}|plan")
        mode_refusals = sorted({v.rule for v in result.violations} & MODE_RULES)
        rows.append(
            f"{case}: planner {'plans' if result.feasible else mode_refusals or [v.rule for v in result.violations]}; "
            f"verl {raw['error'] if not raw['ok'] else 'ok'}{' / plan ok' if planned and planned['ok'] else ''}"
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
    # The sample is honest: every script is judged, verl refuses every variant, both recipes are there.
    assert sum(not verdicts[f"{c}|raw"]["ok"] for c in specs) >= 14
    assert sum(verdicts[f"{c}|raw"]["ok"] for c in specs if c.startswith("script:")) == 15
    assert sum(r.feasible for r in results.values()) >= 12
    assert {MODES[s.verl.entrypoint] for s in specs.values()} == {"fully_async", "one_step_off"}


def test_the_recipe_checks_can_fail(env: VerlEnv) -> None:
    """The oracle can fail: a planned one_step_off job with its rollout pool shrunk below one TP-2 replica is
    refused by verl 0.6.1's own rollout worker, a fully_async plan with log-probs off by its rollouter."""
    cases = {"one_step_off": (OSO, "rollout.n_gpus_per_node=1"), "fully_async": (FA, "actor_rollout_ref.rollout.calculate_log_probs=False")}  # fmt: skip
    requests = []
    for mode, (name, change) in cases.items():
        spec = _spec(_row(name, mode), ())
        result = planner.plan_job(spec, NODES)
        assert result.plan is not None, result.violations
        request = _planned(mode, spec, result.plan)
        requests.append({**request, "overrides": [*request["overrides"], change]})
    verdicts = judge(env, requests)
    assert "fsdp_workers.py:230" in verdicts["one_step_off|plan"]["error"]
    assert "fully_async_rollouter.py:241" in verdicts["fully_async|plan"]["error"]
