"""The chart README is generated from values.yaml; every key carries a ``# --`` comment."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "verl-operator"
SCRIPT = CHART / "scripts" / "gen_readme.py"


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_gen_readme", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def test_readme_matches_values(gen: ModuleType) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    expected = gen.render((CHART / "values.yaml").read_text(), chart)
    actual = (CHART / "README.md").read_text()
    assert actual == expected, (
        f"charts/verl-operator/README.md is stale; regenerate it with: {gen.REGENERATE}"
    )


def test_every_value_is_in_the_readme(gen: ModuleType) -> None:
    readme = (CHART / "README.md").read_text()
    documented = {d.path for d in gen.collect((CHART / "values.yaml").read_text())}
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def leaves(node: object, prefix: str) -> list[str]:
        if isinstance(node, dict) and node and prefix not in documented:
            return [p for k, v in node.items() for p in leaves(v, f"{prefix}.{k}" if prefix else k)]
        return [prefix]

    for path in leaves(values, ""):
        assert f"| `{path}` |" in readme, path


VALID = """\
# header comment, not a key doc
# -- The image.
image: x
section:
  # -- A nested key,
  # continued on a second line.
  key: 1
  # -- A documented map is one row.
  resources:
    requests:
      cpu: 1
"""


def test_collect_reads_descriptions_paths_and_defaults(gen: ModuleType) -> None:
    docs = gen.collect(VALID)
    assert [(d.path, d.description, d.default) for d in docs] == [
        ("image", "The image.", "x"),
        ("section.key", "A nested key, continued on a second line.", 1),
        ("section.resources", "A documented map is one row.", {"requests": {"cpu": 1}}),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("a: 1\n", "a: no '# --' comment", id="undocumented-scalar"),
        pytest.param(
            "sec:\n  # -- ok\n  b: 1\n  c: []\n", "sec.c: no '# --' comment", id="undocumented-nested"
        ),
        pytest.param(
            "# plain comment\nempty: {}\n", "empty: no '# --' comment", id="plain-comment-is-not-a-doc"
        ),
        pytest.param(
            "# -- map\nm:\n  # -- inner\n  k: 1\n",
            "m.k: documented, but a parent map",
            id="doc-on-map-and-key",
        ),
    ],
)
def test_collect_rejects_undocumented_keys(gen: ModuleType, text: str, message: str) -> None:
    with pytest.raises(gen.ValuesDocError, match=message):
        gen.collect(text)


def test_check_mode_reports_a_stale_readme(
    gen: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chart = tmp_path / "chart"
    chart.mkdir()
    for name in ("Chart.yaml", "values.yaml"):
        (chart / name).write_text((CHART / name).read_text())
    (chart / "README.md").write_text("old\n")
    assert gen.main(["--check", "--chart-dir", str(chart)]) == 1
    assert gen.REGENERATE in capsys.readouterr().err
    assert gen.main(["--chart-dir", str(chart)]) == 0
    assert gen.main(["--check", "--chart-dir", str(chart)]) == 0
    assert "| `replicaCount` | int | `2` |" in (chart / "README.md").read_text()
