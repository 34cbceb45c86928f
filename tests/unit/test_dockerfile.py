"""The Dockerfile and the engine-free image build describe the same operator image.

`verl-operator-dev devcluster image` builds the operator image without a container engine (mmdebstrap, a
virtualenv, an OCI archive); users build the same image from the `Dockerfile`. These tests read the
Dockerfile's instructions and compare them with the engine-free recipe, so a change to one side that the other
lacks fails here.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from verl_devtools.devcluster import imagebuild, projectimages

DOCKERFILE = Path(__file__).resolve().parents[2] / "Dockerfile"


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _final_stage() -> list[tuple[str, str]]:
    steps = _instructions(DOCKERFILE.read_text())
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from + 1 :]


def _env(stage: list[tuple[str, str]]) -> tuple[str, ...]:
    pairs: list[str] = []
    for word, rest in stage:
        if word == "ENV":
            pairs.extend(shlex.split(rest))
    return tuple(pairs)


@pytest.fixture(scope="module")
def recipe() -> imagebuild.Recipe:
    return projectimages.operator_recipe(projectimages.project_root())


def test_the_entrypoint_is_the_recipes(recipe: imagebuild.Recipe) -> None:
    (entrypoint,) = [rest for word, rest in _final_stage() if word == "ENTRYPOINT"]
    assert tuple(json.loads(entrypoint)) == recipe.config.entrypoint == ("verl-operator", "run")


def test_the_user_is_the_recipes_non_root_user(recipe: imagebuild.Recipe) -> None:
    (user,) = [rest for word, rest in _final_stage() if word == "USER"]
    assert user == recipe.config.user == imagebuild.NONROOT
    assert not user.startswith("0")


def test_the_environment_is_the_recipes(recipe: imagebuild.Recipe) -> None:
    assert _env(_final_stage()) == recipe.config.env


def test_the_labels_are_the_recipes(recipe: imagebuild.Recipe) -> None:
    labels = dict(
        pair.split("=", 1) for word, rest in _final_stage() if word == "LABEL" for pair in shlex.split(rest)
    )
    assert labels == recipe.config.labels


def test_the_account_lines_and_the_virtualenv_path_are_the_recipes() -> None:
    text = DOCKERFILE.read_text()
    assert imagebuild.NONROOT_PASSWD.strip() in text
    assert imagebuild.NONROOT_GROUP.strip() in text
    assert f"python3 -m venv {imagebuild.VENV}" in text
    assert f"COPY --from=build {imagebuild.VENV} {imagebuild.VENV}" in text


def test_the_default_base_is_the_recipes_debian_release() -> None:
    (base,) = [
        rest for word, rest in _instructions(DOCKERFILE.read_text()) if word == "ARG" and "BASE=" in rest
    ]
    image = base.split("=", 1)[1]
    assert image.startswith(f"debian:{imagebuild.DEBIAN_SUITE}-"), image
    assert image.split(":", 1)[1] != imagebuild.DEBIAN_SUITE, "the default base is pinned by a dated tag"


def test_the_instruction_reader_sees_a_changed_entrypoint() -> None:
    changed = DOCKERFILE.read_text().replace('["verl-operator", "run"]', '["verl-operator", "demo"]')
    steps = _instructions(changed)
    assert ("ENTRYPOINT", '["verl-operator", "demo"]') in steps


def test_the_build_copies_and_runs_the_product_only() -> None:
    """The image's build context is the product (tests/unit/test_product_wheel.py builds a wheel from what
    these COPY lines name); nothing of the development tooling (tools/, verl_devtools) is copied or imported."""
    steps = _instructions(DOCKERFILE.read_text())
    copied = [shlex.split(rest)[:-1] for word, rest in steps if word == "COPY" and "--from" not in rest]
    assert sorted(path for sources in copied for path in sources) == [
        "README.md",
        "launcher",
        "operator",
        "pyproject.toml",
    ]
    runs = " ".join(rest for word, rest in steps if word == "RUN")
    assert "verl_operator.launcher_zipapp import launcher_zipapp" in runs
    assert "devtools" not in runs and "devcluster" not in runs
