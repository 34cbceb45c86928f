"""The head's progress endpoint: verl's real lines in, the bounded progress document out over HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from verl_contract.progress import MAX_BYTES, MAX_RECENT, ProgressDocument
from verl_launcher.progress import ProgressTracker
from verl_launcher.progress_server import ProgressServer

OUTPUT = Path(__file__).parent / "data" / "verl-output"


@pytest.fixture
def served() -> Iterator[tuple[ProgressTracker, str]]:
    tracker = ProgressTracker()
    server = ProgressServer(tracker.progress, host="127.0.0.1", port=0).start()
    try:
        yield tracker, f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_phases_before_the_first_step(served: tuple[ProgressTracker, str]) -> None:
    tracker, base = served
    doc = ProgressDocument.model_validate_json(get(base + "/progress")[1])
    assert (doc.launch_phase, doc.step, doc.last_output_age_seconds) == ("RayForming", 0, None)
    tracker.enter("RayFormed")
    tracker.enter("VerlStarted")
    tracker.feed("(TaskRunner pid=1) Total training steps: 300")
    doc = ProgressDocument.model_validate_json(get(base + "/progress")[1])
    assert (doc.launch_phase, doc.total_steps, doc.step) == ("VerlStarted", 300, 0)
    assert doc.last_output_age_seconds is not None and doc.last_step_age_seconds is None


def test_a_real_step_line_is_served(served: tuple[ProgressTracker, str]) -> None:
    tracker, base = served
    tracker.enter("VerlStarted")
    line = (OUTPUT / "qwen3-8b-megatron-before.log").read_text().strip()
    tracker.feed(
        "\x1b[36m(TaskRunner pid=3165)\x1b[0m "
        + line.replace("perf/mfu/actor:0.41926334277752103", "perf/mfu/actor:np.float64(0.41926334277752103)")
    )
    status, body = get(base + "/progress")
    assert status == 200
    raw = json.loads(body)
    assert raw["launchPhase"] == "Stepping" and raw["step"] == 3
    assert raw["stepSeconds"] == pytest.approx(1268.488, abs=1e-3)
    assert raw["phases"]["gen"] == pytest.approx(698.88, abs=1e-2)
    assert not any(k.startswith("agent_loop") or k in ("step", "stop_profile") for k in raw["phases"])
    assert raw["throughputPerGpu"] == pytest.approx(524.49, abs=1e-2)
    assert raw["mfu"] == pytest.approx(0.4193, abs=1e-4)
    assert raw["recent"][0]["step"] == 3


def test_mfu_zero_is_no_signal_and_recent_steps_are_bounded(served: tuple[ProgressTracker, str]) -> None:
    tracker, base = served
    for step in range(1, 40):
        tracker.feed(f"step:{step} - timing_s/step:2.5 - timing_s/gen:1.0 - perf/mfu/actor:0.0")
    doc = ProgressDocument.model_validate_json(get(base + "/progress")[1])
    assert doc.mfu is None
    assert [s.step for s in doc.recent] == list(range(40 - MAX_RECENT, 40))
    assert len(doc.to_json()) < MAX_BYTES


def test_other_paths_are_not_served(served: tuple[ProgressTracker, str]) -> None:
    _, base = served
    assert get(base + "/")[0] == 404
    assert get(base + "/progress/../etc")[0] == 404
