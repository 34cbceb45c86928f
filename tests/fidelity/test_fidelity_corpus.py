"""verl's own launch scripts, judged by verl and by the planner: they must agree.

Every row of ``data/verl-example-scripts.json`` (the FSDP + vLLM ``main_ppo`` commands of verl's examples at
v0.6.1 and the newest main) is checked for each supported release: verl's own checks on the script's
overrides, and ``plan_job`` on a VerlJob holding the same overrides on a cluster of the script's size.
Accepted by verl => not rejected by the planner except for memory; rejected by verl for arithmetic, shapes or
an unknown key => rejected by the planner with a violation on the matching field. Every script verl accepts
is also changed in one rule at a time (``one_change_variants``) and judged again, so both directions are
exercised. Each accepted plan's own override list must then pass verl too. The agreement tables are printed
at the end of the run and kept in docs/fidelity.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from corpus_cases import DISAGREEMENTS, Case, Verdict, cases, judge, table, variant_cases
from plan_sample import RELEASE
from verl_client import CheckRequest, CheckResult, VerlRunner

DOC = Path(__file__).parents[2] / "docs" / "fidelity.md"
Judged = list[tuple[Case, CheckResult | None, Any, Verdict]]
RELEASES = sorted(RELEASE.values())
#: Fewest judged rows per release (guards against a vacuous pass).
MIN_JUDGED, MIN_VARIANTS, MIN_PLANS = 60, 80, 40


def _plan(case: Case) -> Any:
    from verl_operator.api.spec import VerlJobSpec
    from verl_operator.planner import plan_job

    return plan_job(VerlJobSpec.model_validate(case.spec), list(case.nodes))


def _judge_all(items: list[Case], runner: VerlRunner) -> Judged:
    """verl's verdict (one batch, identical requests checked once), the plan and the comparison of each case."""

    def key(c: Case) -> tuple[Any, ...]:
        return (c.overrides, json.dumps(c.shape, sort_keys=True))

    unique: dict[tuple[Any, ...], CheckRequest] = {}
    for c in items:
        if c.spec is not None:
            unique.setdefault(key(c), CheckRequest(c.label, c.overrides, (), c.shape))
    results = dict(zip(unique, runner.check(list(unique.values())), strict=True))
    out: Judged = []
    for c in items:
        if c.spec is None:
            out.append((c, None, None, Verdict("not-judged", c.not_judged or "")))
            continue
        verl, plan = results[key(c)], _plan(c)
        out.append((c, verl, plan, judge(verl.ok, verl.stage, verl.error or "", plan)))
    return out


@pytest.fixture(scope="session")
def corpus(verl_runners: dict[str, VerlRunner]) -> dict[str, dict[str, Judged]]:
    """By release: ``scripts`` (the stored rows) and ``variants`` (one change to each script verl accepts)."""
    out: dict[str, dict[str, Judged]] = {}
    all_cases = cases()
    for release in RELEASES:
        scripts = _judge_all([c for c in all_cases if c.release == release], verl_runners[release])
        accepted = [c for c, r, _, v in scripts if r is not None and r.ok and v.kind != "not-judged"]
        out[release] = {
            "scripts": scripts,
            "variants": _judge_all(variant_cases(accepted), verl_runners[release]),
        }
    return out


CORPUS_TABLES = pytest.StashKey[list[str]]()


@pytest.fixture(scope="session")
def corpus_tables(corpus: dict[str, dict[str, Judged]], request: pytest.FixtureRequest) -> str:
    """The two agreement tables (markdown); also printed in the run's terminal summary."""
    text = "\n\n".join(
        f"{title}:\n\n" + table({r: [v for *_, v in corpus[r][part]] for r in RELEASES})
        for part, title in (("scripts", "verl's example scripts"), ("variants", "one-change variants"))
    )
    request.config.stash.setdefault(CORPUS_TABLES, []).append(text)
    return text


def _disagreements(items: Judged) -> list[dict[str, Any]]:
    return [
        {
            "case": c.row_id,
            "verdict": v.kind,
            "detail": v.detail,
            "verl": f"{r.stage}: {r.error_type}: {(r.error or '')[:300]}" if r else None,
        }
        for c, r, _, v in items
        if v.kind in DISAGREEMENTS
    ]


@pytest.mark.parametrize("release", RELEASES)
def test_planner_agrees_with_verl_on_its_scripts(
    corpus: dict[str, dict[str, Judged]], corpus_tables: str, release: str
) -> None:
    scripts, variants = corpus[release]["scripts"], corpus[release]["variants"]
    judged = [item for item in scripts if item[3].kind != "not-judged"]
    assert len(judged) >= MIN_JUDGED, f"only {len(judged)} judged rows for verl {release}"
    assert len(variants) >= MIN_VARIANTS, f"only {len(variants)} variants for verl {release}"
    assert sum(v.kind == "agree-reject" for *_, v in variants) >= MIN_VARIANTS // 2, corpus_tables
    bad = _disagreements(scripts) + _disagreements(variants)
    assert not bad, f"{len(bad)} disagreements with verl {release}:\n{corpus_tables}\n" + "\n".join(
        json.dumps(b, indent=1) for b in bad
    )


@pytest.mark.parametrize("release", RELEASES)
def test_every_accepted_corpus_plan_passes_verl(
    corpus: dict[str, dict[str, Judged]], verl_runners: dict[str, VerlRunner], release: str
) -> None:
    plans = [
        (c, p)
        for c, _, p, v in corpus[release]["scripts"] + corpus[release]["variants"]
        if p is not None and p.feasible and v.kind != "not-judged"
    ]
    assert len(plans) >= MIN_PLANS, f"only {len(plans)} feasible corpus plans for verl {release}"
    requests = [
        CheckRequest(c.label, tuple(p.plan.overrides), (), c.shape, fill_model_paths=False) for c, p in plans
    ]
    results = verl_runners[release].check(requests)
    failures = [
        {
            "case": c.row_id,
            "stage": r.stage,
            "error": f"{r.error_type}: {(r.error or '')[:400]}",
            "overrides": p.plan.overrides,
        }
        for (c, p), r in zip(plans, results, strict=True)
        if not r.ok
    ]
    assert not failures, f"{len(failures)} of {len(plans)} corpus plans fail verl {release}:\n" + "\n".join(
        json.dumps(f, indent=1) for f in failures
    )


def test_docs_show_the_current_tables(corpus_tables: str) -> None:
    text = DOC.read_text()
    assert corpus_tables in text, (
        f"docs/fidelity.md does not hold the current agreement tables:\n{corpus_tables}"
    )


def test_planner_key_lists_match_verl(verl_envs: dict[str, Any]) -> None:
    """``verl-config-keys.json`` (the planner's key check) is what verl's own compose gives today."""
    import verl_keys

    assert verl_keys.TARGET.read_text() == verl_keys.render(verl_keys.generate()), (
        "operator/verl_operator/data/verl-config-keys.json drifted: run python tests/fidelity/verl_keys.py"
    )
