"""Fixtures of the fidelity tier: cached virtualenvs with real verl releases (see ``verl_envs.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from plan_sample import RELEASE, SAMPLE_SIZE, Draw, sample
from verl_client import VerlRunner
from verl_envs import SUPPORTED_VERSIONS, VerlEnv, ensure_env

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of this folder ``fidelity``."""
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.fidelity)


@pytest.fixture(scope="session")
def verl_envs(request: pytest.FixtureRequest) -> Iterator[dict[str, VerlEnv]]:
    """Every supported verl environment, built on first use (minutes when cold; progress shown)."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    envs: dict[str, VerlEnv] = {}
    with capture.global_and_fixture_disabled():  # show the build's progress live
        for version in SUPPORTED_VERSIONS:
            envs[version] = ensure_env(version)
    yield envs


@pytest.fixture(scope="session")
def verl_runners(verl_envs: dict[str, VerlEnv]) -> Iterator[dict[str, VerlRunner]]:
    """One long-lived runner process per verl release, shared by the session's tests, stopped at the end."""
    runners = {version: VerlRunner(env) for version, env in verl_envs.items()}
    try:
        yield runners
    finally:
        for runner in runners.values():
            runner.close()


@pytest.fixture(scope="session")
def accepted_plans() -> dict[str, list[tuple[Draw, Any, Any]]]:
    """The sample's feasible plans, by verl release: ``(draw, VerlJobSpec, PlanResult)``.

    Skips while ``verl_operator.planner`` cannot be imported.
    """
    planner = pytest.importorskip("verl_operator.planner", reason="verl_operator.planner cannot be imported")
    from verl_operator.api.spec import VerlJobSpec

    out: dict[str, list[tuple[Draw, Any, Any]]] = {release: [] for release in RELEASE.values()}
    for item in sample(SAMPLE_SIZE):
        spec = VerlJobSpec.model_validate(item.spec)
        result = planner.plan_job(spec, item.nodes)
        if result.feasible:
            out[RELEASE[spec.verl.version]].append((item, spec, result))
    return out


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Print the corpus agreement tables (``test_fidelity_corpus.py``) when they were computed."""
    from test_fidelity_corpus import CORPUS_TABLES

    for text in config.stash.get(CORPUS_TABLES, []):
        terminalreporter.section("verl example scripts: planner vs verl")
        terminalreporter.write_line(text)
