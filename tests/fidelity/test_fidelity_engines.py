"""The SGLang and TensorRT-LLM rollouts, judged by verl's own code.

1. verl's own example scripts that roll out with SGLang or TensorRT-LLM (``data/verl-engine-scripts.json``,
   extracted by ``corpus/extract.py --engine sglang --engine trtllm`` at the refs of the main corpus) are
   checked by each release's own config code and planned; they must agree as the main corpus does
   (``test_fidelity_corpus.py``). No engine package is installed: the checks are those verl makes before an
   engine is imported: Hydra's compose of the release's config, ``RolloutConfig`` (0.9.1
   ``workers/config/rollout.py`` lines 280-342: mode, EP and TensorRT-LLM's MoE split, pipeline, disaggregation),
   the rollout registry's (engine, mode) pairs (``workers/rollout/base.py``) and ``RolloutReplica``'s sizing
   (0.9.1 ``workers/rollout/replica.py`` line 113).
   Scripts that use one of verl's example config folders (``--config-path``, the SGLang multi-turn examples)
   are stored as facts (``corpus/config_folders.py``): the folder's base config and its values flattened to
   ``++key=value`` overrides, which go in front of the script's own; verl composes ``--config-name=<base>``
   with them and the planner plans the same overrides (with a pasted ``--config-name=ppo_megatron_trainer``
   for a Megatron base).
2. Planner-generated specs for each engine x release line x shipped cluster profile: every plan the planner
   accepts passes those checks, and TensorRT-LLM on verl 0.6 is refused by both.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from corpus_cases import DISAGREEMENTS, Verdict, case_for, judge, table
from plan_sample import RELEASE, model_shape
from verl_client import MAIN_PPO_ARGV, CheckRequest, VerlRunner

ROOT = Path(__file__).parents[2]
DATA = Path(__file__).parent / "data" / "verl-engine-scripts.json"
DOC = ROOT / "docs" / "fidelity.md"
ENGINES = ("vllm", "sglang", "trtllm")
#: The shipped cluster profiles the generated specs plan on.
PROFILES = ("dgx-h100.yaml", "a100-pcie.yaml", "l40s.yaml")
#: Fewest engine-script rows judged per release (guards against a vacuous pass).
MIN_JUDGED = 4
#: Fewest judged rows per release that use a config folder.
MIN_JUDGED_FOLDER = 10
MEGATRON_BASE = "ppo_megatron_trainer"


def _rows() -> list[dict[str, Any]]:
    return list(json.loads(DATA.read_text())["rows"])


def _engine(overrides: tuple[str, ...] | list[str]) -> str:
    values = [
        o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+").endswith("rollout.name")
    ]
    return values[-1] if values else "(unset)"


def engine_case(row: dict[str, Any], line: str) -> Any:
    """The case of a stored row: a config folder's flattened values go in front of the script's overrides,
    and a Megatron base is pasted as ``--config-name`` for the planner."""
    folder = row.get("config_folder")
    if folder is None:
        return case_for(row, line)
    case = case_for({**row, "overrides": folder["overrides"] + row["overrides"]}, line)
    if case.spec is not None and folder["base"] == MEGATRON_BASE:
        spec = {**case.spec, "overrides": [f"--config-name={MEGATRON_BASE}", *case.spec["overrides"]]}
        case = dataclasses.replace(case, spec=spec)
    return case


def _request(case: Any, row: dict[str, Any], overrides: tuple[str, ...] | None = None) -> CheckRequest:
    """verl's check of a case (or of ``overrides`` for the same config): ``--config-name`` of the base."""
    folder = row.get("config_folder")
    overrides = case.overrides if overrides is None else overrides
    if folder is not None and folder["base"] != "ppo_trainer":
        argv = (*MAIN_PPO_ARGV, f"--config-name={folder['base']}", *overrides)
        return CheckRequest(case.label, (), argv, case.shape)
    return CheckRequest(case.label, overrides, (), case.shape)


@pytest.fixture(scope="session")
def engine_corpus(verl_runners: dict[str, VerlRunner]) -> dict[str, list[tuple[Any, Any, Any, Verdict]]]:
    from verl_operator.api.spec import VerlJobSpec
    from verl_operator.planner import plan_job

    out: dict[str, list[tuple[Any, Any, Any, Verdict]]] = {}
    for line, release in sorted(RELEASE.items()):
        rows_by_id = {row["id"]: row for row in _rows()}
        items = [engine_case(row, line) for row in _rows()]
        judged = [c for c in items if c.spec is not None]
        results = verl_runners[release].check([_request(c, rows_by_id[c.row_id]) for c in judged])
        by_label = dict(zip([c.label for c in judged], results, strict=True))
        rows: list[tuple[Any, Any, Any, Verdict]] = []
        for c in items:
            if c.spec is None:
                rows.append((c, None, None, Verdict("not-judged", c.not_judged or "")))
                continue
            verl = by_label[c.label]
            plan = plan_job(VerlJobSpec.model_validate(c.spec), list(c.nodes))
            rows.append((c, verl, plan, judge(verl.ok, verl.stage, verl.error or "", plan)))
        out[release] = rows
    return out


def engine_table(corpus: dict[str, list[tuple[Any, Any, Any, Verdict]]]) -> str:
    """The agreement table of the engines' scripts (kept in docs/fidelity.md)."""
    return "verl's SGLang and TensorRT-LLM example scripts:\n\n" + table(
        {release: [v for *_, v in rows] for release, rows in corpus.items()}
    )


@pytest.mark.parametrize("release", sorted(RELEASE.values()))
def test_planner_agrees_with_verl_on_the_engines_scripts(
    engine_corpus: dict[str, list[tuple[Any, Any, Any, Verdict]]],
    verl_runners: dict[str, VerlRunner],
    release: str,
) -> None:
    rows = engine_corpus[release]
    stored = {row["id"]: row for row in _rows()}
    # A script of an SGLang config folder may switch the engine (the folder's vllm_fsdp example).
    assert {_engine(c.overrides) for c, *_ in rows if "config_folder" not in stored[c.row_id]} <= {
        "sglang",
        "trtllm",
    }
    judged = [r for r in rows if r[3].kind != "not-judged"]
    assert len(judged) >= MIN_JUDGED, f"only {len(judged)} judged engine scripts for verl {release}"
    folders = [r for r in judged if "config_folder" in stored[r[0].row_id]]
    assert len(folders) >= MIN_JUDGED_FOLDER, f"only {len(folders)} judged config-folder scripts ({release})"
    bad = [
        {"case": c.row_id, "verdict": v.kind, "detail": v.detail, "verl": r and f"{r.stage}: {r.error}"}
        for c, r, _, v in rows
        if v.kind in DISAGREEMENTS
    ]
    assert not bad, f"{len(bad)} disagreements:\n{engine_table(engine_corpus)}\n" + "\n".join(
        json.dumps(b, indent=1) for b in bad
    )
    # Every plan accepted from a script rolls out with the script's engine and passes verl too.
    plans = [(c, p) for c, _, p, v in rows if p is not None and p.feasible]
    for c, p in plans:
        assert _engine(p.plan.overrides) == _engine(c.overrides), c.row_id
    results = verl_runners[release].check(
        [_request(c, stored[c.row_id], tuple(p.plan.overrides)) for c, p in plans]
    )
    failures = [(c.row_id, r.stage, r.error) for (c, _), r in zip(plans, results, strict=True) if not r.ok]
    assert not failures, failures


def test_docs_show_the_engine_table(engine_corpus: dict[str, list[tuple[Any, Any, Any, Verdict]]]) -> None:
    text = engine_table(engine_corpus)
    assert text in DOC.read_text(), f"docs/fidelity.md does not hold the engines' table:\n{text}"


def _generated() -> list[tuple[str, str, str, dict[str, Any]]]:
    """(engine, line, profile, spec): GRPO on Qwen2.5-3B and PPO with a critic on Qwen2.5-7B per combination."""
    out = []
    for engine in ENGINES:
        for line in sorted(RELEASE):
            for profile in PROFILES:
                for model, algorithm, gpus in (
                    ("Qwen/Qwen2.5-3B-Instruct", "grpo", 8),
                    ("Qwen/Qwen2.5-7B-Instruct", "ppo", 8),
                ):
                    spec = {
                        "verl": {"image": "verl:test", "version": line},
                        "model": {"path": model},
                        "algorithm": algorithm,
                        "data": {"maxPromptLength": 512, "maxResponseLength": 1024},
                        "rollout": {"name": engine},
                        "resources": {"gpus": gpus},
                        "overrides": (
                            ["actor_rollout_ref.rollout.multi_turn.enable=True"] if engine == "sglang" else []
                        ),
                    }
                    out.append((engine, line, profile, spec))
    return out


def test_generated_plans_per_engine_pass_verl(verl_runners: dict[str, VerlRunner]) -> None:
    from verl_operator.api.spec import VerlJobSpec
    from verl_operator.commands.plan import load_nodes
    from verl_operator.planner import plan_job

    feasible: dict[tuple[str, str], int] = {}
    requests: dict[str, list[tuple[str, CheckRequest]]] = {}
    for engine, line, profile, doc in _generated():
        spec = VerlJobSpec.model_validate(doc)
        result = plan_job(spec, load_nodes(str(ROOT / "examples" / "clusters" / profile)))
        label = f"{engine}|{line}|{profile}|{doc['model']['path']}"
        if engine == "trtllm" and line == "0.6":
            assert {v.rule for v in result.violations} == {"rollout-engine-mode"}, label
            # verl 0.6 refuses the pair too: its registry has no trtllm.
            req = CheckRequest(label, (*_base_overrides(), "actor_rollout_ref.rollout.name=trtllm"), ())
            requests.setdefault(RELEASE[line], []).append(("refused", req))
            continue
        if not result.feasible:
            assert all(v.rule.startswith("memory") or v.rule == "no-nodes" for v in result.violations), (
                label,
                [v.one_line() for v in result.violations],
            )
            continue
        assert f"actor_rollout_ref.rollout.name={engine}" in result.plan.overrides, label
        feasible[(engine, line)] = feasible.get((engine, line), 0) + 1
        req = CheckRequest(label, tuple(result.plan.overrides), (), model_shape(spec))
        requests.setdefault(RELEASE[line], []).append(("accepted", req))
    for engine in ENGINES:
        for line in sorted(RELEASE):
            if not (engine == "trtllm" and line == "0.6"):
                assert feasible.get((engine, line), 0) >= 2, (engine, line, feasible)
    failures = []
    for release, items in requests.items():
        results = verl_runners[release].check([req for _, req in items])
        for (want, req), res in zip(items, results, strict=True):
            if (want == "accepted") != res.ok:
                failures.append((req.id, want, res.stage, res.error))
    assert not failures, "\n".join(map(str, failures))


def _base_overrides() -> tuple[str, ...]:
    return (
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "trainer.n_gpus_per_node=8",
    )


#: Rollout data parallelism the planner accepts: (engine, line, TP, DP, extra overrides).
DP_CASES = (
    ("sglang", "0.9", 2, 2, ()),
    ("sglang", "0.9", 1, 8, ()),
    ("vllm", "0.9", 2, 4, ()),
    ("sglang", "0.6", 2, 2, ("actor_rollout_ref.rollout.mode=async",)),
)


def test_rollout_data_parallel_plans_pass_verl(verl_runners: dict[str, VerlRunner]) -> None:
    """Plans with ``rollout.data_parallel_size`` > 1 pass verl's RolloutConfig (EP == TP x DP) and
    RolloutReplica (a replica of TP x DP GPUs on whole nodes); the replicas the plan reports are verl's."""
    from verl_operator.api.spec import VerlJobSpec
    from verl_operator.commands.plan import load_nodes
    from verl_operator.planner import plan_job

    nodes = load_nodes(str(ROOT / "examples" / "clusters" / "dgx-h100.yaml"))
    requests: dict[str, list[CheckRequest]] = {}
    for engine, line, tp, dp, extra in DP_CASES:
        doc = {
            "verl": {"image": "verl:test", "version": line},
            "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
            "algorithm": "grpo",
            "rollout": {"name": engine, "tensorParallelSize": tp},
            "resources": {"gpus": 8},
            "overrides": [f"actor_rollout_ref.rollout.data_parallel_size={dp}", *extra],
        }
        spec = VerlJobSpec.model_validate(doc)
        result = plan_job(spec, nodes)
        label = f"{engine}|{line}|tp{tp}|dp{dp}"
        assert result.feasible, (label, [v.one_line() for v in result.violations])
        assert result.plan.rollout.replicas == result.plan.world_size // (tp * dp), label
        req = CheckRequest(label, tuple(result.plan.overrides), (), model_shape(spec))
        requests.setdefault(RELEASE[line], []).append(req)
    failures = []
    for release, reqs in requests.items():
        for req, res in zip(reqs, verl_runners[release].check(reqs), strict=True):
            if not res.ok:
                failures.append((req.id, res.stage, res.error))
    assert not failures, failures
    # The check can fail: a replica of TP 4 x DP 3 = 12 GPUs does not tile nodes of 8 (the planner refuses it).
    first = requests[RELEASE["0.9"]][0]
    broken = (
        *first.overrides,
        "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
        "actor_rollout_ref.rollout.data_parallel_size=3",
    )
    [res] = verl_runners[RELEASE["0.9"]].check([CheckRequest("broken", broken, (), first.model_shape)])
    assert not res.ok and res.stage == "rollout_replica", res
