"""Send batches of launch configurations to ``verl_runner.py`` inside a verl environment.

``check_batch`` starts one subprocess per batch; ``VerlRunner`` keeps one ``--serve`` process per release
for a whole test session. Either way the argv is a list (no shell), verl and its config tree are imported
once per process (about 4 s) and each request then costs a fraction of a second.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

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
        values: The composed config's values of the request's ``read_keys`` (None: none asked, or the
            composition failed).
    """

    id: str
    ok: bool
    stage: str
    error_type: str | None
    error: str | None
    values: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class CheckRequest:
    """One configuration to check.

    Attributes:
        id: A label that comes back with the result.
        overrides: verl Hydra overrides (used when ``argv`` is empty).
        argv: A whole ``python3 -m verl.trainer.main_ppo ...`` command instead of overrides.
        model_shape: The VerlJob ``spec.model.shape`` (camelCase); None uses a small Qwen2 shape.
        verify_compose: Also run Hydra's full ``compose`` and fail if the runner's shortcut differs.
        fill_model_paths: Add the actor's and the critic's ``model.path`` when the overrides lack them; off,
            a missing path keeps verl's default (which names no local folder, so a critic built from it fails).
        read_keys: Keys whose composed values come back in ``CheckResult.values``.
    """

    id: str
    overrides: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()
    model_shape: dict[str, Any] | None = None
    verify_compose: bool = False
    fill_model_paths: bool = True
    read_keys: tuple[str, ...] = ()

    def to_json(self, version: str) -> dict[str, Any]:
        """The runner's request object."""
        body: dict[str, Any] = {
            "id": self.id,
            "version": version,
            "modelShape": self.model_shape,
            "verifyCompose": self.verify_compose,
            "fillModelPaths": self.fill_model_paths,
        }
        if self.read_keys:
            body["readKeys"] = list(self.read_keys)
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
    return _results(env, _run_once(env, [], payload, timeout_s), requests)


def _run_once(env: VerlEnv, args: list[str], payload: str | None, timeout_s: float) -> Any:
    """One ``verl_runner.py`` process in ``env``: its last stdout line as JSON (RuntimeError if it printed none)."""
    proc = subprocess.run(
        [str(env.python), str(RUNNER), *args],
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
    return json.loads(lines[-1])


def _results(env: VerlEnv, data: dict[str, Any], requests: Sequence[CheckRequest]) -> list[CheckResult]:
    if not data["verlVersion"].startswith(env.version):
        raise RuntimeError(f"environment {env.root} holds verl {data['verlVersion']}, not {env.version}")
    results = [CheckResult(**item) for item in data["results"]]
    if [result.id for result in results] != [request.id for request in requests]:
        raise RuntimeError("the runner answered out of order")
    return results


class VerlRunner:
    """One long-lived ``verl_runner.py --serve`` process in a verl environment.

    Args:
        env: The environment to run in.

    Use as a context manager, or call ``close``: the process ends when its stdin closes.
    """

    def __init__(self, env: VerlEnv) -> None:
        self.env = env
        # A file, not a pipe: a full stderr pipe would block the runner. Closed in close().
        self._stderr: IO[str] = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self._proc = subprocess.Popen(
            [str(env.python), str(RUNNER), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=_runner_env(),
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line)
        self._lines.put(None)  # end of output

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-4000:]

    def check(self, requests: Sequence[CheckRequest], timeout_s: float = 600) -> list[CheckResult]:
        """Check every request in order; same results as ``check_batch``.

        Raises:
            RuntimeError: The process died, answered garbage, or took longer than ``timeout_s``.
        """
        assert self._proc.stdin is not None
        payload = json.dumps({"requests": [request.to_json(self.env.version) for request in requests]})
        try:
            self._proc.stdin.write(payload + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError as exc:
            raise RuntimeError(f"verl runner is gone; stderr tail:\n{self._stderr_tail()}") from exc
        while True:
            try:
                line = self._lines.get(timeout=timeout_s)
            except queue.Empty as exc:
                self.close()
                raise RuntimeError(f"verl runner gave no answer in {timeout_s}s") from exc
            if line is None:
                raise RuntimeError(
                    f"verl runner exited {self._proc.wait()}; stderr tail:\n{self._stderr_tail()}"
                )
            if line.startswith("{"):
                return _results(self.env, json.loads(line), requests)

    def close(self) -> None:
        """End the process (closing its stdin ends its loop) and wait for it."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._stderr.close()

    def __enter__(self) -> VerlRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def config_keys(
    env: VerlEnv, timeout_s: float = 300, config_name: str = "ppo_trainer"
) -> tuple[str, list[str]]:
    """``(verl version, every key path of its config_name config)`` from ``verl_runner.py --keys`` in ``env``."""
    version, keys, _ = config_key_table(env, timeout_s, config_name)
    return version, keys


def config_key_table(
    env: VerlEnv, timeout_s: float = 300, config_name: str = "ppo_trainer"
) -> tuple[str, list[str], list[str]]:
    """``(verl version, every key path, the keys whose value is null)`` of its ``config_name`` config."""
    data = _run_once(env, ["--keys", config_name], None, timeout_s)
    return str(data["verlVersion"]), list(data["keys"]), list(data["nullKeys"])
