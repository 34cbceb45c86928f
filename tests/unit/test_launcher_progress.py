"""Parsing verl's step metric lines into the progress record."""

from __future__ import annotations

import json
import math
import pprint
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verl_launcher.progress import ProgressTracker, parse_step_line, parse_total_steps

# verl's own format: " - ".join([f"step:{step}", *(f"{k}:{pprint.pformat(v)}")]) (aggregate_logger.py).
LINE = "step:3 - timing_s/gen:1.52 - perf/throughput:812.4 - critic/score/mean:0.25 - training/epoch:0"


@pytest.mark.parametrize(
    ("line", "step", "metrics"),
    [
        pytest.param(
            LINE,
            3,
            {"timing_s/gen": 1.52, "perf/throughput": 812.4, "critic/score/mean": 0.25, "training/epoch": 0},
            id="plain",
        ),
        pytest.param("(TaskRunner pid=4242) " + LINE, 3, None, id="ray-actor-prefix"),
        pytest.param(
            "\x1b[36m(TaskRunner pid=4242, ip=10.0.0.3)\x1b[0m " + LINE, 3, None, id="ray-prefix-ansi"
        ),
        pytest.param(
            "step:7 - actor/lr:np.float64(1e-06) - perf/max_memory_allocated_gb:np.float32(12.5)",
            7,
            {"actor/lr": 1e-06, "perf/max_memory_allocated_gb": 12.5},
            id="numpy2-repr",
        ),
        pytest.param(
            "step:2 - x:nan - y:inf - flag:True",
            2,
            {"x": math.nan, "y": math.inf, "flag": 1},
            id="nan-inf-bool",
        ),
        pytest.param("step:10", 10, {}, id="no-metrics"),
        pytest.param(
            "step:1 - val-core/openai/gsm8k/reward/mean@1:0.5",
            1,
            {"val-core/openai/gsm8k/reward/mean@1": 0.5},
            id="key-with-at",
        ),
    ],
)
def test_step_lines(line: str, step: int, metrics: dict[str, float] | None) -> None:
    parsed = parse_step_line(line)
    assert parsed is not None
    assert parsed[0] == step
    expected = metrics if metrics is not None else parse_step_line(LINE)[1]  # type: ignore[index]
    assert parsed[1].keys() == expected.keys()
    for key, value in expected.items():
        got = parsed[1][key]
        assert (math.isnan(got) and math.isnan(value)) or got == value


@pytest.mark.parametrize(
    "line",
    [
        pytest.param("Training Progress:  10%|#         | 1/10", id="tqdm"),
        pytest.param("steps:3 - a:1", id="steps-word"),
        pytest.param("INFO step:3 - a:1", id="not-at-start"),
        pytest.param("", id="empty"),
    ],
)
def test_other_lines_are_not_steps(line: str) -> None:
    assert parse_step_line(line) is None


def test_total_steps() -> None:
    assert parse_total_steps("(TaskRunner pid=1) Total training steps: 435") == 435
    assert parse_total_steps("step:1 - a:2") is None


def test_tracker_writes_file_and_summary(tmp_path: Path) -> None:
    path = tmp_path / "p" / "progress.json"
    tracker = ProgressTracker(path=path)
    assert tracker.feed("Total training steps: 20") is None
    assert json.loads(path.read_text())["totalSteps"] == 20
    assert tracker.feed("loading model...") is None
    summary = tracker.feed("step:4 - perf/throughput:100.5 - timing_s/step:3.25 - x:nan")
    assert summary == {"step": 4, "totalSteps": 20, "throughput": 100.5, "stepSeconds": 3.25}
    doc = json.loads(path.read_text())
    assert doc["step"] == 4 and doc["metrics"] == {"perf/throughput": 100.5, "timing_s/step": 3.25, "x": None}
    tracker.feed("step:5 - perf/throughput:90")
    doc = json.loads(path.read_text())
    assert doc["step"] == 5 and doc["throughput"] == 90 and "stepSeconds" not in doc


# Keys under releases-before-0.3's "timing/" are read as "timing_s/" (test_advisor covers that rename).
keys = st.from_regex(r"[a-z_]{1,8}(/[a-z_@0-9]{1,8}){0,3}", fullmatch=True).filter(
    lambda k: not k.startswith("timing/")
)
values = st.one_of(st.integers(-(10**9), 10**9), st.floats(allow_nan=False, allow_infinity=False))


@given(st.integers(min_value=0, max_value=10**6), st.dictionaries(keys, values, max_size=12))
def test_round_trip_of_verls_console_format(step: int, metrics: dict[str, float]) -> None:
    """Format as verl's concat_dict_to_str does (pprint.pformat of each number), then parse back."""
    line = " - ".join([f"step:{step}", *(f"{k}:{pprint.pformat(v)}" for k, v in metrics.items())])
    parsed = parse_step_line(line)
    assert parsed == (step, metrics)
