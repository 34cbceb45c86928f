"""A stand-in for verl's trainer that prints verl's console format, then hangs (a stuck NCCL call prints
nothing): ``Total training steps: N``, then STEPS step lines behind Ray's ``(TaskRunner pid=..)`` prefix, each
the published gsm8k line (tests/unit/data/verl-output/gsm8k-vllm-ray-wrapped.log, joined as verl prints it)
with its step number set and every ``timing_s/*`` seconds divided by SPEEDUP (so a test sees steps of seconds,
not minutes; the shares stay the run's), then silence until it is stopped.

Usage: ``python verl_standin.py TOTAL STEPS SPEEDUP``.
"""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

LINE = Path(__file__).resolve().parents[1] / "unit" / "data" / "verl-output" / "gsm8k-vllm-ray-wrapped.log"


#: Seconds only: the agent loop's token counts and preemption counts carry the prefix too.
TIMING = re.compile(
    r"(timing_s/(?!agent_loop/(?:slowest/)?(?:prompt_length|response_length|num_preempted))[\w/]+):([0-9.e+-]+)"
)


def step_line(step: int, speedup: float) -> str:
    parts = [part.strip() for part in LINE.read_text().splitlines()]
    body = TIMING.sub(lambda m: f"{m.group(1)}:{float(m.group(2)) / speedup!r}", " ".join(parts[1:]))
    return f"(TaskRunner pid=15930, ip=10.4.1.33) step:{step} {body}"


def main() -> int:
    total, steps, speedup = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    print(f"(TaskRunner pid=15930) Total training steps: {total}", flush=True)
    for step in range(1, steps + 1):
        print(step_line(step, speedup), flush=True)
    signal.pause()  # hung: no more output until the test stops it
    return 0


if __name__ == "__main__":
    sys.exit(main())
