"""Extract verl 0.6.1's asynchronous recipes from a clone of github.com/volcengine/verl (a development tool).

verl 0.6.1's wheel has no ``recipe`` package: its fully_async and one_step_off trainers live in the repository's
``recipe/`` folder. This copies, byte for byte, the files of ``recipe/fully_async_policy`` and
``recipe/one_step_off_policy`` that hold their configs and the checks ``verl_runner_async.py`` runs
(``FILES``) into ``tests/fidelity/data/verl-0.6.1-recipes/``, and writes each launch script's command (a
``python -m recipe.*`` one) as the module receives it (``verl_operator.scripts``: the script's own defaults,
``HOME=/root``) to ``tests/fidelity/data/verl-0.6.1-recipe-scripts.json``. Nothing is executed.

Usage: ``python tests/fidelity/corpus/extract_recipes.py --git-dir /path/to/verl.git``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from verl_operator.scripts import launch
from verl_operator.scripts.shell import Shell

REF = "v0.6.1"
DATA = Path(__file__).resolve().parents[1] / "data"
#: The recipe files the fidelity tier reads: the recipes' Hydra configs and the sources of the checks.
FILES = (
    "recipe/fully_async_policy/config/fully_async_ppo_trainer.yaml",
    "recipe/fully_async_policy/config/fully_async_ppo_megatron_trainer.yaml",
    "recipe/fully_async_policy/fully_async_main.py",
    "recipe/fully_async_policy/fully_async_rollouter.py",
    "recipe/fully_async_policy/fully_async_trainer.py",
    "recipe/one_step_off_policy/config/one_step_off_ppo_trainer.yaml",
    "recipe/one_step_off_policy/config/one_step_off_ppo_megatron_trainer.yaml",
    "recipe/one_step_off_policy/main_ppo.py",
    "recipe/one_step_off_policy/ray_trainer.py",
    "recipe/one_step_off_policy/fsdp_workers.py",
    "recipe/one_step_off_policy/megatron_workers.py",
)
FOLDERS = ("recipe/fully_async_policy", "recipe/one_step_off_policy")
#: The catalog model of each script's model path (the model the script downloads).
MODELS = {
    "Qwen2.5-Math-7B": "Qwen/Qwen2.5-Math-7B",
    "Qwen3-0.6B": "Qwen/Qwen3-0.6B",
    "Qwen2.5-3B-Instruct": "Qwen/Qwen2.5-3B-Instruct",
    "Qwen3-30B-A3B-Base": "Qwen/Qwen3-30B-A3B-Base",
    "Qwen2.5-VL-7B-Instruct": "Qwen/Qwen2.5-VL-7B-Instruct",
}


def _git(git_dir: str, *args: str) -> str:
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True, text=True
    ).stdout


def _model(overrides: list[str]) -> str | None:
    path = next((o.split("=", 1)[1] for o in overrides if o.startswith("actor_rollout_ref.model.path=")), "")
    return next((m for name, m in MODELS.items() if path.rstrip("/").endswith(name)), None)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--git-dir", required=True, help="a clone (bare is fine) of volcengine/verl with its tags"
    )
    args = parser.parse_args(argv)
    commit = _git(args.git_dir, "rev-parse", f"{REF}^{{commit}}").strip()
    out = DATA / "verl-0.6.1-recipes"
    for rel in FILES:
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(
            subprocess.run(
                ["git", f"--git-dir={args.git_dir}", "show", f"{commit}:{rel}"],
                check=True,
                capture_output=True,
            ).stdout
        )
    rows = []
    for path in _git(args.git_dir, "ls-tree", "-r", "--name-only", commit, *FOLDERS).split():
        if not path.endswith(".sh"):
            continue
        text = _git(args.git_dir, "show", f"{commit}:{path}")
        for inv in launch.invocations(text, Shell({"HOME": "/root", "PWD": "/workspace"})):
            if not inv.module.startswith("recipe."):
                continue  # the colocated baselines run verl.trainer.main_ppo
            split = launch.hydra_args(inv.args)
            options = [f"--config-path={split.config_path}"] if split.config_path else []
            options += [f"--config-name={split.config_name}"] if split.config_name else []
            rows.append(
                {
                    "source": f"volcengine/verl {path}",
                    "commit": commit,
                    "module": inv.module,
                    "model": _model(split.overrides),
                    "options": options,
                    "overrides": split.overrides,
                }
            )
    doc = {
        "about": (
            "verl 0.6.1's recipe launch scripts (recipe/fully_async_policy, recipe/one_step_off_policy), each "
            "python -m recipe.* command's Hydra options and overrides with the script's own defaults "
            "(HOME=/root); written by tests/fidelity/corpus/extract_recipes.py, read by "
            "tests/fidelity/test_fidelity_recipes.py"
        ),
        "scripts": rows,
    }
    (DATA / "verl-0.6.1-recipe-scripts.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(rows)} commands, {len(FILES)} files from {REF} ({commit})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
