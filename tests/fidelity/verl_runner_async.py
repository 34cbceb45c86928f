"""Judge a launch of one of verl's asynchronous trainer modes with verl's own code; runs INSIDE a verl virtualenv.

Protocol: one JSON object on stdin, ``{"requests": [{"id", "mode", "overrides"}, ...]}``; one JSON object on
stdout, ``{"verlVersion", "results": [{"id", "ok", "stage", "error_type", "error"}, ...]}``. ``mode`` is
``separate_async``, ``fully_async`` or ``one_step_off``; a request ``{"id", "mode", "keys": true}`` gets
``{"id", "keys"}`` instead: the keys the mode's config adds to ``ppo_trainer``. Everything verl prints goes to
stderr.

The checks, in the order verl meets them:

1. ``compose``: Hydra's compose API on the mode's own config of the installed release (``ppo_trainer`` for
   separate_async, ``experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml``,
   ``experimental/one_step_off_policy/config/one_step_off_ppo_trainer.yaml``), struct mode.
2. ``mode_checks``: the statements of the mode's own ``__init__`` (``PPOTrainerSeparateAsync``,
   ``FullyAsyncRollouter``, ``OneStepOffRayTrainer``) read from the installed source file and run on the
   composed config, in their order, up to the mode's last check. Importing those modules needs verl's full
   runtime (TransferQueue, vLLM's server stack); their ``__init__`` checks need only the config, so the
   statements run alone (file and line numbers kept, so a failure names verl's own line). separate_async's
   ``super().__init__`` (the colocated trainer's set-up, which builds workers) is left out.

This file imports only the standard library at module level: it runs on the verl environment's Python.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import sys
import traceback
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

#: The mode's config folder (relative to the verl package) and name.
CONFIGS = {
    "separate_async": ("trainer/config", "ppo_trainer"),
    "fully_async": ("experimental/fully_async_policy/config", "fully_async_ppo_trainer"),
    "one_step_off": ("experimental/one_step_off_policy/config", "one_step_off_ppo_trainer"),
}
#: The mode's checks: the source file (relative to the verl package), the class, and the first statement of
#: its ``__init__`` that is no longer a check (None: to the end), as ``ast.unparse`` writes it.
CHECKS = {
    "separate_async": ("trainer/ppo/v1/trainer_separate_async.py", "PPOTrainerSeparateAsync", None),
    "fully_async": (
        "experimental/fully_async_policy/fully_async_rollouter.py",
        "FullyAsyncRollouter",
        "self.use_critic = False",
    ),
    "one_step_off": (
        "experimental/one_step_off_policy/ray_trainer.py",
        "OneStepOffRayTrainer",
        "role_worker_mapping.pop(Role.Rollout, None)",
    ),
}
#: separate_async statements that set up the colocated trainer (not checks): left out.
SKIPPED = ("super().__init__(config)", "self._init_hybrid_rollout_state()")


def _statements(root: Path, mode: str) -> tuple[Any, str]:
    """The mode's check statements compiled with verl's file name and line numbers."""
    rel, cls_name, stop = CHECKS[mode]
    path = root / rel
    tree = ast.parse(path.read_text(), filename=str(path))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    body: list[ast.stmt] = []
    for stmt in init.body:
        text = ast.unparse(stmt)
        if stop is not None and text == stop:
            break
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # the docstring
        if text in SKIPPED:
            continue
        body.append(_without_skipped(stmt))
    module = ast.Module(body=body, type_ignores=[])
    return compile(module, str(path), "exec"), str(path)


class _Strip(ast.NodeTransformer):
    def visit_Expr(self, node: ast.Expr) -> Any:
        return None if ast.unparse(node) in SKIPPED else node


def _without_skipped(stmt: ast.stmt) -> ast.stmt:
    """``stmt`` without the set-up calls nested in it (each sits beside checks, so no block empties)."""
    return ast.fix_missing_locations(_Strip().visit(stmt))


class _ReplayBuffer:
    """What separate_async's switching asks of the replay buffer (verl's own buffer has both)."""

    def wait_for_sampleable(self) -> None: ...

    def get_sampleable_count(self) -> int:
        return 0


def _namespace(mode: str, config: Any) -> dict[str, Any]:
    from verl.trainer.ppo.utils import need_reward_model
    from verl.utils.config import omega_conf_to_dataclass

    me = SimpleNamespace(replay_buffer=_ReplayBuffer(), _enable_hybrid_replicas=True)
    if mode == "separate_async":
        me.config = config  # what super().__init__ keeps
    return {
        "self": me,
        "config": config,
        "tokenizer": None,
        "processor": None,
        "device_name": None,
        "need_reward_model": need_reward_model,
        "omega_conf_to_dataclass": omega_conf_to_dataclass,
        "replace": replace,
        "logger": logging.getLogger("verl"),
    }


def judge(root: Path, mode: str, overrides: list[str]) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    folder, name = CONFIGS[mode]
    GlobalHydra.instance().clear()
    cwd = os.getcwd()
    os.chdir(root.parent)  # one_step_off's searchpath is file://verl/trainer/config
    try:
        with initialize_config_dir(config_dir=str(root / folder), version_base=None):
            config = compose(config_name=name, overrides=overrides)
    except Exception as exc:
        return {"ok": False, "stage": "compose", "error_type": type(exc).__name__, "error": str(exc)[:2000]}
    finally:
        os.chdir(cwd)
    code, path = _statements(root, mode)
    try:
        exec(code, _namespace(mode, config))
    except Exception as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        where = next(
            (f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames) if f.filename == path), None
        )
        if where is None:
            raise
        return {
            "ok": False,
            "stage": "mode_checks",
            "error_type": type(exc).__name__,
            "error": f"{where}: {exc}",
        }
    return {"ok": True, "stage": "mode_checks", "error_type": None, "error": None}


def _flat(node: Any, prefix: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}{key}"
            out.add(path)
            out |= _flat(value, path + ".")
    return out


def added_keys(root: Path, mode: str) -> list[str]:
    """The keys the mode's config adds to ``ppo_trainer`` (both composed with verl's Hydra), leaves only."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    keys = []
    for folder, name in (CONFIGS["separate_async"], CONFIGS[mode]):
        GlobalHydra.instance().clear()
        cwd = os.getcwd()
        os.chdir(root.parent)
        try:
            with initialize_config_dir(config_dir=str(root / folder), version_base=None):
                config = OmegaConf.to_container(compose(config_name=name), resolve=False)
        finally:
            os.chdir(cwd)
        keys.append(_flat(config))
    base, own = keys
    leaves = {k for k in own - base if not any(o.startswith(k + ".") for o in own)}
    return sorted(leaves)


def main() -> int:
    import verl

    root = Path(verl.__file__).parent
    request = json.loads(sys.stdin.read())
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    results = [
        {"id": r["id"], "keys": added_keys(root, r["mode"])}
        if r.get("keys")
        else {"id": r["id"], **judge(root, r["mode"], list(r["overrides"]))}
        for r in request["requests"]
    ]
    real_stdout.write(json.dumps({"verlVersion": getattr(verl, "__version__", "?"), "results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
