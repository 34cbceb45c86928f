"""Send batches of launch configurations to ``verl_runner.py`` inside a verl environment.

One subprocess per batch (argv list, no shell): verl and its config tree are imported once and every
request of the batch is checked in that process, so a sample of hundreds of plans costs seconds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verl_envs import VerlEnv

RUNNER = Path(__file__).with_name("verl_runner.py")
MAIN_PPO_ARGV = ("python3", "-m", "verl.trainer.main_ppo")


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """verl's verdict on one request.

    Attributes:
        id: The request's label.
        ok: Whether every check passed.
        stage: The check that failed, or the last one run.
        error_type: The exception class verl raised (``AssertionError``, ``ValueError``...), or None.
        error: verl's message, or None.
    """

    id: str
    ok: bool
    stage: str
    error_type: str | None
    error: str | None


@dataclasses.dataclass(frozen=True)
class CheckRequest:
    """One configuration to check.

    Attributes:
        id: A label that comes back with the result.
        overrides: verl Hydra overrides (used when ``argv`` is empty).
        argv: A whole ``python3 -m verl.trainer.main_ppo ...`` command instead of overrides.
        model_shape: The VerlJob ``spec.model.shape`` (camelCase); None uses a small Qwen2 shape.
        verify_compose: Also run Hydra's full ``compose`` and fail if the runner's shortcut differs.
    """

    id: str
    overrides: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()
    model_shape: dict[str, Any] | None = None
    verify_compose: bool = False

    def to_json(self, version: str) -> dict[str, Any]:
        """The runner's request object."""
        body: dict[str, Any] = {
            "id": self.id,
            "version": version,
            "modelShape": self.model_shape,
            "verifyCompose": self.verify_compose,
        }
        if self.argv:
            body["argv"] = list(self.argv)
        else:
            body["overrides"] = list(self.overrides)
        return body


def _runner_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "PYTHONNOUSERSITE": "1",
            "HF_HUB_OFFLINE": "1",  # the model folders are local: any download attempt must fail
            "TRANSFORMERS_OFFLINE": "1",
            "CUDA_VISIBLE_DEVICES": "",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    env.pop("PYTHONPATH", None)  # nothing of this project's environment may leak into verl's
    return env


def check_batch(env: VerlEnv, requests: Sequence[CheckRequest], timeout_s: float = 600) -> list[CheckResult]:
    """Check every request with verl's own code in one process of ``env``.

    Args:
        env: A built verl environment.
        requests: The configurations, checked in order.
        timeout_s: Upper bound for the whole batch.

    Returns:
        One result per request, in order.

    Raises:
        RuntimeError: The runner crashed or printed no result (its stderr tail is in the message).
    """
    payload = json.dumps({"requests": [request.to_json(env.version) for request in requests]})
    proc = subprocess.run(
        [str(env.python), str(RUNNER)],
        input=payload,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=_runner_env(),
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"verl runner exited {proc.returncode}; stderr tail:\n{proc.stderr[-4000:]}")
    data = json.loads(lines[-1])
    if not data["verlVersion"].startswith(env.version):
        raise RuntimeError(f"environment {env.root} holds verl {data['verlVersion']}, not {env.version}")
    results = [CheckResult(**item) for item in data["results"]]
    if [result.id for result in results] != [request.id for request in requests]:
        raise RuntimeError("the runner answered out of order")
    return results
