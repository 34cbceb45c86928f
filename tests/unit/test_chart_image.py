"""The chart's default image is the project's image, and the operator is told it (for launcher injection)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_chart_render import one, render

from verl_devtools.devcluster.projectimages import IMAGE_REPOSITORY

CHART = Path(__file__).resolve().parents[2] / "charts" / "verl-operator"
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]


@pytest.mark.parametrize(
    ("sets", "image"),
    [
        pytest.param((), f"{IMAGE_REPOSITORY}:{APP_VERSION}", id="default-project-image-at-appversion"),
        pytest.param(
            ("image.repository=registry.example/vo", "image.tag=dev"),
            "registry.example/vo:dev",
            id="own-registry",
        ),
    ],
)
def test_operator_image_and_launcher_image_agree(helm: str, sets: tuple[str, ...], image: str) -> None:
    container = one(render(helm, *sets), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == image
    # The whole command line, so any image entrypoint works; the launcher comes from the same image.
    assert container["command"][:2] == ["verl-operator", "run"]
    assert f"--launcher-image={image}" in container["command"]
    assert "args" not in container


def test_the_image_tag_is_the_project_version() -> None:
    """The locally built image (tag = project version) is the one the chart installs by default."""
    from verl_devtools.devcluster.projectimages import operator_image

    assert operator_image() == f"{IMAGE_REPOSITORY}:{APP_VERSION}"
