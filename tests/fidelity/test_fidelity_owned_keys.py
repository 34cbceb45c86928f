"""verl runs with the plan's values for every key the planner owns, whatever the user's overrides.

The planner owns the keys of ``dialect.INPUT_KEYS``: it reads them as pins and emits its own values. A user
override may name such a key through a parent (``trainer={nnodes:5}``, ``++actor_rollout_ref.rollout={n:64}``,
``data={...}``; Hydra merges a dict value into the node) or delete a parent (``~trainer``). For every
accepted spec of the corpus (verl's example scripts, as written and with their planner keys regrouped into
dict values), of a seeded sample of the fuzz strategy ``hostile_specs.dict_specs`` (dict values, parent
deletions, typo keys) and of the reproductions below, the launcher's argv is composed by the release's own
Hydra compose (``verl_runner.py``), and the composed config must hold exactly the planner's emitted value of
every owned key it emitted, and verl's default of every owned key it did not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from corpus_cases import cases
from hypothesis import HealthCheck, given, seed, settings
from plan_sample import RELEASE, make_node, model_shape
from test_fidelity_launcher import launch_argv
from verl_client import CheckRequest, VerlRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from hostile_specs import dict_specs

#: Keys the runner points at its local model folder (their values are the runner's, not the plan's).
LOCALISED = frozenset({"actor_rollout_ref.model.path", "critic.model.path"})
#: Drawn fuzz specs (about half are admitted).
DRAWS = 240
#: Fewest checked argvs per release (guards against a vacuous pass).
MIN_CHECKED = 60
ARR = "actor_rollout_ref"
#: The hostile-input campaign's overrides that undid the plan, in forms the planner admits (the others are
#: denied: tests/unit/test_planner_overrides.py).
REPRODUCTIONS: tuple[tuple[str, ...], ...] = (
    ("trainer={nnodes:1,n_gpus_per_node:8,total_epochs:2}",),
    (f"{ARR}.rollout={{n:4,tensor_model_parallel_size:2,temperature:0.9}}",),
    (f"++{ARR}.rollout={{n:64}}",),
    ("data={train_batch_size:64,shuffle:False}",),
    ("+trainer={nnodes:1,val_before_train:False}",),
    (f"{ARR}={{rollout:{{n:8}},actor:{{ppo_mini_batch_size:16,clip_ratio:0.2}}}}",),
    ("trainer.nnodes=2", "trainer={nnodes:1}"),
    (f"{ARR}.rollout.n=4", f"{ARR}.rollout={{val_kwargs:{{n:2}}}}", f"~{ARR}.rollout.val_kwargs.n"),
)
NODES = [make_node(f"gpu-{i}", 8, "NVIDIA-H100-80GB-HBM3", 81559) for i in range(2)]

Item = tuple[str, Any, Any]  # (label, VerlJobSpec, Plan)


def owned_keys() -> list[str]:
    from verl_operator.planner.dialect import INPUT_KEYS

    return sorted(set(INPUT_KEYS) - LOCALISED)


def _plan(label: str, raw: dict[str, Any], nodes: Any, out: dict[str, list[Item]]) -> Any:
    from verl_operator.api.spec import VerlJobSpec
    from verl_operator.planner import plan_job

    spec = VerlJobSpec.model_validate(raw)
    result = plan_job(spec, list(nodes))
    if result.feasible:
        out[RELEASE[spec.verl.version]].append((label, spec, result.plan))
    return result


def as_dicts(overrides: tuple[str, ...]) -> list[str]:
    """``overrides`` with the planner's keys of each parent regrouped into one dict value at the first one's
    place (``trainer.nnodes=1 trainer.n_gpus_per_node=8`` -> ``trainer={nnodes:1,n_gpus_per_node:8}``)."""
    from verl_operator.planner.dialect import INPUT_KEYS

    groups: dict[str, list[str]] = {}
    out: list[str] = []
    for raw in overrides:
        key, _, text = raw.partition("=")
        parent, _, leaf = key.rpartition(".")
        if key not in INPUT_KEYS or not parent or any(c in text for c in ":'\"${}"):
            out.append(raw)
            continue
        if parent not in groups:
            groups[parent] = []
            out.append(f"<group {parent}>")
        groups[parent].append(f"{leaf}:{text}")
    return [f"{o[7:-1]}={{{','.join(groups[o[7:-1]])}}}" if o.startswith("<group ") else o for o in out]


@pytest.fixture(scope="module")
def accepted() -> dict[str, list[Item]]:
    """The accepted specs and their plans, by verl release."""
    from verl_operator.controller.webhook import check_admission

    out: dict[str, list[Item]] = {release: [] for release in RELEASE.values()}
    for case in cases():
        if case.spec is None:
            continue
        plain = _plan(f"corpus|{case.label}", case.spec, case.nodes, out)
        regrouped = {**case.spec, "overrides": as_dicts(case.overrides)}
        if regrouped["overrides"] != list(case.overrides):
            as_dict = _plan(f"corpus-dicts|{case.label}", regrouped, case.nodes, out)
            assert as_dict.feasible == plain.feasible, (case.label, regrouped["overrides"])
    for i, overrides in enumerate(REPRODUCTIONS):
        for line in RELEASE:
            raw = {
                "verl": {"image": "verl:test", "version": line},
                "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
                "resources": {"gpus": 8},
                "overrides": list(overrides),
            }
            result = _plan(f"reproduction-{i}|{line}", raw, NODES[:1], out)
            assert result.feasible, (overrides, [v.one_line() for v in result.violations])

    @seed(20261222)
    @settings(max_examples=DRAWS, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(dict_specs())
    def collect(raw: dict[str, Any]) -> None:
        if not check_admission(raw, None, NODES).problems:
            _plan(f"fuzz|{json.dumps(raw['overrides'])}", raw, NODES, out)

    collect()
    return out


def expected_values(plan: Any, defaults: dict[str, Any]) -> dict[str, Any]:
    """The plan's value of every owned key it emits, verl's default of the others."""
    from verl_operator.planner.overrides import parse_override

    emitted = {ov.key: ov.value for ov in map(parse_override, plan.overrides)}
    return {key: emitted.get(key, defaults[key]) for key in owned_keys()}


@pytest.mark.parametrize("release", sorted(RELEASE.values()))
def test_composed_config_holds_the_plan_for_every_owned_key(
    accepted: dict[str, list[Item]], verl_runners: dict[str, VerlRunner], release: str
) -> None:
    items = accepted[release]
    kinds = {label.split("|")[0].split("-")[0] for label, _, _ in items}
    assert len(items) >= MIN_CHECKED and {"corpus", "fuzz", "reproduction"} <= kinds, (len(items), kinds)
    keys = tuple(owned_keys())
    base = CheckRequest("defaults", (), read_keys=keys)
    requests = [base] + [
        CheckRequest(
            label, argv=tuple(launch_argv(i, spec, plan)), model_shape=model_shape(spec), read_keys=keys
        )
        for i, (label, spec, plan) in enumerate(items)
    ]
    results = verl_runners[release].check(requests)
    defaults = results[0].values
    assert defaults is not None, results[0]
    failures = []
    for (label, _, plan), result in zip(items, results[1:], strict=True):
        if result.values is None:
            failures.append({"case": label, "compose": f"{result.error_type}: {result.error}"})
            continue
        want = expected_values(plan, defaults)
        wrong = {k: {"verl": result.values[k], "plan": want[k]} for k in keys if result.values[k] != want[k]}
        if wrong:
            failures.append({"case": label, "wrong": wrong, "overrides": plan.overrides})
    assert not failures, (
        f"{len(failures)} of {len(items)} argvs give verl {release} other values:\n"
        + "\n".join(json.dumps(f, indent=1, default=str)[:3000] for f in failures[:10])
    )
