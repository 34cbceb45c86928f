"""verl's own Megatron launch scripts, judged by verl (with megatron-core) and by the planner: they must agree.

Every row of ``data/verl-megatron-scripts.json`` (the ``main_ppo`` commands of verl's examples at v0.6.1 and
main that launch verl's own ``ppo_megatron_trainer`` config) is checked for each supported release: the
script's whole command line goes to ``verl_runner.py`` (Hydra's parser and compose of ``ppo_megatron_trainer``,
``validate_config``, the dataclasses, the rollout registry, then the Megatron workers' pre-load checks of
``verl_runner_megatron.py`` with megatron-core's own ``TransformerConfig``), and ``plan_job`` plans a VerlJob
holding the script's ``--config-name`` and overrides on ``nnodes`` simulated nodes of the script's GPU. Each
script verl accepts is also changed in one Megatron rule at a time (``megatron_variants``) and judged again.
Verdicts are compared as in ``test_fidelity_corpus.py``; the tables are kept in docs/fidelity.md.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from corpus_cases import DISAGREEMENTS, MEMORY_RULES, Verdict, catalog_shape, judge, table
from plan_sample import RELEASE, make_node
from verl_client import CheckRequest, CheckResult, VerlRunner

DATA = Path(__file__).parent / "data" / "verl-megatron-scripts.json"
DOC = Path(__file__).parents[2] / "docs" / "fidelity.md"
ARR = "actor_rollout_ref"
MAIN = ("python3", "-m", "verl.trainer.main_ppo")
RELEASES = sorted(RELEASE.values())
#: Fewest judged script rows and rejected variants per release (guards against a vacuous pass).
MIN_JUDGED, MIN_VARIANT_REJECTS = 12, 30

#: The simulated GPUs: 80 GB H100 unless the script's name says H20 or 96 GB (verl's H20 examples).
H100 = ("NVIDIA-H100-80GB-HBM3", 81559)
H20 = ("NVIDIA-H20", 97871)

#: Models of the scripts the planner's catalog lacks, and why their rows are not judged.
NOT_JUDGED_MODELS: dict[str, str] = {
    "Qwen/Qwen2.5-VL-7B-Instruct": "vision-language model (the planner models decoder-only LMs)",
    "/models/Qwen3-VL-235B-A22B-Instruct": "vision-language model (the planner models decoder-only LMs)",
    "/models/Qwen3-VL-30B-A3B-Instruct": "vision-language model (the planner models decoder-only LMs)",
    "/models/Qwen3-VL-8B-Instruct": "vision-language model (the planner models decoder-only LMs)",
    "<path_to_dsv3_config>": "the script passes a placeholder ('<path_to_dsv3_config>') as its model",
    "/data/models/Qwen/Qwen1.5-MoE-A2.7B-Chat": "Qwen1.5-MoE-A2.7B is not in the planner's catalog",
    "/home/user/verl/models/MiMo-7B-RL": "MiMo-7B-RL (multi-token prediction) is not in the planner's catalog",
}
#: Script models named differently from the catalog entry with the same config.json numbers.
SAME_SHAPE_AS: dict[str, str] = {
    # moonshotai/Moonlight-16B-A3B and its -Instruct share config.json's architecture numbers.
    "moonshotai/Moonlight-16B-A3B": "moonshotai/Moonlight-16B-A3B-Instruct",
}

#: Planner rules that mirror checks verl makes inside the rollout engine's server, which need the engine itself
#: (no engine is installed here): a script verl's checks accept that the planner rejects only by these is not
#: judged. ``rollout-data-parallel``: 0.6.1 ``workers/rollout/vllm_rollout/vllm_async_server.py`` lines 250-257.
ENGINE_SERVER_RULES = frozenset({"rollout-data-parallel"})
#: The Megatron stages of ``verl_runner_megatron.py`` (arithmetic and shapes: the planner must reject).
MEGATRON_STAGES = frozenset(
    {"megatron_engine", "megatron_parallel_state", "megatron_transformer_config", "megatron_batch"}
)
#: verl's / megatron-core's message -> the planner fields (normalised) one of whose violations must name.
MEGATRON_FIELDS: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = (
    (
        re.compile(r"model_parallel_size \(|world_size"),
        ("tensorparallel", "tensormodelparallel", "pipeline", "contextparallel"),
    ),
    (re.compile(r"num_attention_heads|num_query_groups"), ("tensorparallel", "tensormodelparallel")),
    (re.compile(r"interleaved|virtual"), ("virtualpipeline", "pipelineparallel", "pipelinemodelparallel")),
    (re.compile(r"recompute"), ("recompute",)),
    (re.compile(r"use_mbridge"), ("usembridge",)),
    (re.compile(r"dynamic_context_parallel|Dynamic CP"), ("removepadding", "padtolength", "virtualpipeline")),
    (re.compile(r"layers|pipeline"), ("pipelineparallel", "pipelinemodelparallel", "overrides")),
    (re.compile(r"expert"), ("expert",)),
    (re.compile(r"mini_batch|mini-batch|ppo_mini_batch_size"), ("minibatchsize", "trainbatchsize")),
)


@dataclasses.dataclass(frozen=True)
class MegatronCase:
    """One Megatron script (or a variant of it) planned and checked for one verl release line."""

    row_id: str
    line: str
    release: str
    argv: tuple[str, ...]
    spec: dict[str, Any] | None
    nodes: tuple[dict[str, Any], ...]
    shape: dict[str, Any] | None
    not_judged: str | None = None

    @property
    def label(self) -> str:
        return f"{self.release}|{self.row_id}"


def load_rows() -> list[dict[str, Any]]:
    """The stored Megatron rows."""
    return list(json.loads(DATA.read_text())["rows"])


def _shape(model: str) -> tuple[dict[str, Any] | None, str | None]:
    return catalog_shape(model, NOT_JUDGED_MODELS, SAME_SHAPE_AS, "is not in the planner's catalog")


def _gpu(path: str) -> tuple[str, int]:
    name = Path(path).stem.lower()
    return H20 if "h20" in name.split("_") or "96gb" in name else H100


def argv_of(row: dict[str, Any], overrides: list[str]) -> tuple[str, ...]:
    """The command line as the script runs it: Hydra's config options, then the overrides."""
    options = [f"--config-path={row['config_path']}"] if row["config_path"] else []
    return (*MAIN, *options, f"--config-name={row['config_name']}", *overrides)


def case_for(
    row: dict[str, Any], line: str, overrides: list[str] | None = None, suffix: str = ""
) -> MegatronCase:
    """The case of ``row`` (or of ``overrides`` in its place) on verl line ``line``."""
    overrides = list(row["overrides"]) if overrides is None else overrides
    nnodes, per_node = row["nnodes"] or 1, row["n_gpus_per_node"] or 8
    shape, why = _shape(row["model"])
    product, memory = _gpu(row["source"]["path"])
    nodes = tuple(make_node(f"n{i}", per_node, product, memory) for i in range(nnodes))
    spec = None
    if why is None:
        model: dict[str, Any] = {"path": row["model"]}
        if row["model"] in SAME_SHAPE_AS:
            model["shape"] = shape
        spec = {
            "verl": {"image": "verl:test", "version": line},
            "model": model,
            "resources": {"gpus": nnodes * per_node},
            "overrides": [f"--config-name={row['config_name']}", *overrides],
        }
    argv = argv_of(row, overrides)
    return MegatronCase(row["id"] + suffix, line, RELEASE[line], argv, spec, nodes, shape, why)


def _last(overrides: list[str], key: str) -> str | None:
    values = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+") == key]
    return values[-1] if values else None


def _int(overrides: list[str], key: str, default: int) -> int:
    value = _last(overrides, key)
    return int(value) if value is not None and value.lstrip("-").isdigit() else default


def _set(overrides: list[str], key: str, value: Any) -> list[str]:
    """``overrides`` with every ``key`` override (and its ref copy) replaced by ``value``."""
    keys = {key, key.replace(".actor.", ".ref.")}
    kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+") not in keys]
    return [*kept, *(f"{k}={value}" for k in sorted(keys))]


def megatron_variants(row: dict[str, Any], shape: dict[str, Any], line: str) -> list[tuple[str, list[str]]]:
    """Variants of a row that break one Megatron rule: ``(name, overrides)``.

    ``tp-heads``: a TP that divides the GPUs of a node but not the attention or KV heads (megatron-core's
    ``TransformerConfig``); ``pp-layers``: a PP that divides the world but not the layers
    (``get_num_layers_to_build``), with the script's TP set to 1; ``vpp-pp1``: a virtual pipeline size with PP 1
    (``initialize_model_parallel``); ``mp-world``: TP x PP not dividing the world; ``mini-dp``: a mini-batch
    below Megatron's DP; ``recompute-module``: selective recompute naming a submodule megatron-core lacks;
    ``recompute-selective-layers``: selective recompute with ``recompute_num_layers`` (``TransformerConfig``);
    on verl 0.9 ``mbridge-off``: ``use_mbridge=False`` and ``dynamic-cp-padding``: dynamic context
    parallelism with ``use_remove_padding=False`` (the Megatron engine's constructor).
    """
    overrides = list(row["overrides"])
    per_node, world = row["n_gpus_per_node"] or 8, (row["nnodes"] or 1) * (row["n_gpus_per_node"] or 8)
    heads, kv, layers = int(shape["attentionHeads"]), int(shape["kvHeads"]), int(shape["layers"])
    m = f"{ARR}.actor.megatron"
    out: list[tuple[str, list[str]]] = []
    base = _set(
        _set(_set(overrides, f"{m}.pipeline_model_parallel_size", 1), f"{m}.context_parallel_size", 1),
        f"{m}.virtual_pipeline_model_parallel_size",
        "null",
    )
    base = _set(_set(base, f"{m}.expert_model_parallel_size", 1), f"{m}.expert_tensor_parallel_size", "null")
    tp = next((d for d in range(2, per_node + 1) if per_node % d == 0 and (heads % d or kv % d)), None)
    if tp is not None:
        out.append(("tp-heads", _set(base, f"{m}.tensor_model_parallel_size", tp)))
    pp = next((d for d in range(2, world + 1) if world % d == 0 and layers % d), None)
    if pp is not None:
        out.append(
            (
                "pp-layers",
                _set(
                    _set(base, f"{m}.tensor_model_parallel_size", 1), f"{m}.pipeline_model_parallel_size", pp
                ),
            )
        )
    out.append(("vpp-pp1", _set(base, f"{m}.virtual_pipeline_model_parallel_size", 2)))
    bad_mp = next((d for d in range(3, 2 * world) if world % d and heads % d == 0 and kv % d == 0), None)
    if bad_mp is not None:
        out.append(("mp-world", _set(base, f"{m}.tensor_model_parallel_size", bad_mp)))
    tc = f"{m}.override_transformer_config"
    plain = [o for o in base if not o.split("=", 1)[0].lstrip("+").startswith(f"{tc}.recompute_")]
    selective = [*plain, f"{tc}.recompute_granularity=selective"]
    out.append(("recompute-module", [*selective, f"{tc}.recompute_modules=[core_attn,layernorms]"]))
    out.append(("recompute-selective-layers", [*selective, f"{tc}.recompute_num_layers=1"]))
    if line != "0.6":
        out.append(("mbridge-off", _set(base, f"{m}.use_mbridge", False)))
        dcp = [f"{m}.dynamic_context_parallel=True", f"{m}.use_remove_padding=False"]
        out.append(("dynamic-cp-padding", [*base, *dcp]))
    n = _int(overrides, f"{ARR}.rollout.n", 1)
    dp = world // max(1, _int(base, f"{m}.tensor_model_parallel_size", 1))
    if dp > n and dp > 1:
        mini = [f"{ARR}.actor.ppo_mini_batch_size=1", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=1"]
        out.append(("mini-dp", [*base, *mini]))
    return out


def _judge(verl: CheckResult, plan: Any) -> Verdict:
    """``corpus_cases.judge``, with the Megatron stages counted as arithmetic (the planner must reject) and
    ``validate_config``'s Megatron world check (``n_gpus ... model_parallel_size``) mapped to the Megatron
    sizes."""
    engine_only = {v.rule for v in plan.violations} - MEMORY_RULES
    if verl.ok and engine_only and engine_only <= ENGINE_SERVER_RULES:
        return Verdict(
            "not-judged", f"the planner's {', '.join(sorted(engine_only))} mirrors a check of the engine"
        )
    megatron_world = verl.stage == "validate_config" and "model_parallel_size (" in (verl.error or "")
    if verl.ok or (verl.stage not in MEGATRON_STAGES and not megatron_world):
        return judge(verl.ok, verl.stage, verl.error or "", plan)
    if plan.feasible:
        return Verdict("missed-rejection", f"{verl.stage}: {(verl.error or '')[:300]}")
    rules = sorted({v.rule for v in plan.violations})
    fields = next((f for pattern, f in MEGATRON_FIELDS if pattern.search(verl.error or "")), None)
    named = [
        v.field.lower().replace("_", "").replace("-", "")
        for v in plan.violations
        if v.rule not in MEMORY_RULES
    ]
    if fields is None or any(f in field for field in named for f in fields):
        return Verdict("agree-reject", ",".join(rules))
    return Verdict(
        "wrong-field",
        f"verl {verl.stage}: {(verl.error or '')[:200]} | planner: "
        + "; ".join(f"{v.rule} @ {v.field}" for v in plan.violations),
    )


Judged = list[tuple[MegatronCase, CheckResult | None, Any, Verdict]]


def _judge_all(items: list[MegatronCase], runner: VerlRunner) -> Judged:
    from verl_operator.api.spec import VerlJobSpec
    from verl_operator.planner import plan_job

    judged = [c for c in items if c.spec is not None]
    results = runner.check([CheckRequest(c.label, argv=c.argv, model_shape=c.shape) for c in judged])
    by_label = dict(zip([c.label for c in judged], results, strict=True))
    out: Judged = []
    for c in items:
        if c.spec is None:
            out.append((c, None, None, Verdict("not-judged", c.not_judged or "")))
            continue
        verl = by_label[c.label]
        plan = plan_job(VerlJobSpec.model_validate(c.spec), list(c.nodes))
        out.append((c, verl, plan, _judge(verl, plan)))
    return out


@pytest.fixture(scope="session")
def megatron_corpus(verl_runners: dict[str, VerlRunner]) -> dict[str, dict[str, Judged]]:
    """By release: ``scripts`` (the stored rows) and ``variants`` (one Megatron change to each accepted one)."""
    rows = load_rows()
    by_id = {row["id"]: row for row in rows}
    out: dict[str, dict[str, Judged]] = {}
    for line, release in sorted(RELEASE.items()):
        scripts = _judge_all([case_for(row, line) for row in rows], verl_runners[release])
        variants = [
            case_for(by_id[c.row_id], line, overrides, f"~{name}")
            for c, r, _, v in scripts
            if r is not None and r.ok and c.shape is not None
            for name, overrides in megatron_variants(by_id[c.row_id], c.shape, line)
        ]
        out[release] = {"scripts": scripts, "variants": _judge_all(variants, verl_runners[release])}
    return out


def megatron_tables(corpus: dict[str, dict[str, Judged]]) -> str:
    """The two agreement tables of the Megatron scripts (markdown, kept in docs/fidelity.md)."""
    return "\n\n".join(
        f"{title}:\n\n" + table({r: [v for *_, v in corpus[r][part]] for r in RELEASES})
        for part, title in (
            ("scripts", "verl's Megatron example scripts"),
            ("variants", "one-change Megatron variants"),
        )
    )


def _disagreements(items: Judged) -> list[dict[str, Any]]:
    return [
        {
            "case": c.row_id,
            "verdict": v.kind,
            "detail": v.detail,
            "verl": r and f"{r.stage}: {r.error_type}: {(r.error or '')[:300]}",
        }
        for c, r, _, v in items
        if v.kind in DISAGREEMENTS
    ]


@pytest.mark.parametrize("release", RELEASES)
def test_planner_agrees_with_verl_on_its_megatron_scripts(
    megatron_corpus: dict[str, dict[str, Judged]], release: str
) -> None:
    scripts, variants = megatron_corpus[release]["scripts"], megatron_corpus[release]["variants"]
    tables = megatron_tables(megatron_corpus)
    judged = [item for item in scripts if item[3].kind != "not-judged"]
    assert len(judged) >= MIN_JUDGED, f"only {len(judged)} judged Megatron rows for verl {release}"
    rejects = sum(v.kind == "agree-reject" for *_, v in variants)
    assert rejects >= MIN_VARIANT_REJECTS, f"only {rejects} rejected variants for verl {release}\n{tables}"
    bad = _disagreements(scripts) + _disagreements(variants)
    assert not bad, f"{len(bad)} disagreements with verl {release}:\n{tables}\n" + "\n".join(
        json.dumps(b, indent=1) for b in bad
    )


@pytest.mark.parametrize("release", RELEASES)
def test_every_accepted_megatron_plan_passes_verl(
    megatron_corpus: dict[str, dict[str, Judged]], verl_runners: dict[str, VerlRunner], release: str
) -> None:
    """Each feasible plan's own command line (``--config-name=ppo_megatron_trainer`` and the plan's overrides)
    passes verl's checks, the Megatron ones included."""
    from verl_operator.api.spec import VerlJobSpec
    from verl_operator.manifests.launchspec import LaunchPlan, entrypoint

    plans = [
        (c, p)
        for c, _, p, v in megatron_corpus[release]["scripts"] + megatron_corpus[release]["variants"]
        if p is not None and p.feasible and v.kind != "not-judged"
    ]
    assert len(plans) >= MIN_JUDGED // 2, f"only {len(plans)} feasible Megatron plans for verl {release}"
    requests = []
    for c, p in plans:
        engine = LaunchPlan.from_plan(p.plan, VerlJobSpec.model_validate(c.spec)).training_engine
        argv = (*entrypoint(engine), *p.plan.overrides)
        requests.append(CheckRequest(c.label, argv=argv, model_shape=c.shape, fill_model_paths=False))
    results = verl_runners[release].check(requests)
    failures = [
        {"case": c.row_id, "stage": r.stage, "error": f"{r.error_type}: {(r.error or '')[:400]}"}
        for (c, _), r in zip(plans, results, strict=True)
        if not r.ok
    ]
    assert not failures, f"{len(failures)} of {len(plans)} Megatron plans fail verl {release}:\n" + "\n".join(
        json.dumps(f, indent=1) for f in failures
    )


def test_docs_show_the_megatron_tables(megatron_corpus: dict[str, dict[str, Judged]]) -> None:
    text = megatron_tables(megatron_corpus)
    assert text in DOC.read_text(), f"docs/fidelity.md does not hold the Megatron tables:\n{text}"


def test_stored_rows_are_megatron_launches_of_verls_own_config() -> None:
    """Every stored row passes the extractor's own filter and names verl's own Megatron config and a ref."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "corpus"))
    from extract import OWN_CONFIG_PATHS, megatron_exclusion

    document = json.loads(DATA.read_text())
    refs = {commit for _, commit in document["refs"]}
    rows = document["rows"]
    assert len(rows) >= 40
    for row in rows:
        assert megatron_exclusion(row) is None, row["id"]
        assert row["config_name"].removesuffix(".yaml") == "ppo_megatron_trainer", row["id"]
        assert row["config_path"] in (None, *OWN_CONFIG_PATHS), row["id"]
        assert row["source"]["commit"] in refs and row["source"]["line"] > 0, row["id"]
    assert {r["source"]["ref"] for r in rows} == {"v0.6.1", "b178a3cd56f58b2d502255daba591e92833930a7"}
