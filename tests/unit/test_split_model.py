"""The split model against verl's published runs: the constants are the fit, and its error is what
docs/planner.md states."""

from __future__ import annotations

import math

import pytest

from verl_operator.planner import split_model
from verl_operator.planner.split_model import PUBLISHED, Published


def _y(row: Published) -> float:
    f = row.rollout_gpus / (row.rollout_gpus + row.trainer_gpus)
    s = row.response / (row.prompt + row.response)
    return math.log(f / (1 - f)) - math.log(s)


def test_kappa_and_gamma_are_the_least_squares_fit() -> None:
    dense = {
        fam: [
            _y(r)
            for r in PUBLISHED
            if split_model.family(r.mode) == fam and r.params_total_b == r.params_active_b
        ]
        for fam in split_model.KAPPA
    }
    for fam, ys in dense.items():
        assert split_model.KAPPA[fam] == pytest.approx(math.exp(sum(ys) / len(ys)), abs=1e-3)
    moe = [r for r in PUBLISHED if r.params_total_b != r.params_active_b]
    xs = [math.log(r.params_total_b / r.params_active_b) for r in moe]
    ys = [_y(r) - math.log(split_model.KAPPA[split_model.family(r.mode)]) for r in moe]
    gamma = sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
    assert pytest.approx(gamma, abs=1e-3) == split_model.GAMMA


@pytest.mark.parametrize("row", PUBLISHED, ids=[r.source for r in PUBLISHED])
def test_error_against_the_published_splits(row: Published) -> None:
    """docs/planner.md: dense rows within 0.07 of the published rollout share, the MoE rows within 0.16."""
    bound = 0.07 if row.params_total_b == row.params_active_b else 0.16
    assert abs(split_model.split_error(row)) <= bound


@pytest.mark.parametrize(
    ("gpus", "unit", "fraction", "want"),
    [
        pytest.param(16, 8, 0.5, [8], id="16-halves"),
        pytest.param(32, 8, 0.6, [16, 8, 24], id="32-tie-to-larger-trainer"),
        pytest.param(8, 1, 0.4167, [5, 4, 6, 3, 7, 2, 1], id="one-node"),
    ],
)
def test_candidates_nearest_first(gpus: int, unit: int, fraction: float, want: list[int]) -> None:
    assert split_model.candidates(gpus, unit, fraction) == want
