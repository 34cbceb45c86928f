"""Regenerate ``tests/fidelity/data/verl-example-scripts.json`` from verl's public repository.

Reads every ``examples/**/*.sh`` of the given refs of a verl git directory (``git show``, no checkout), finds
each ``python3 -m verl.trainer.main_ppo`` command, and records the argv that Python would receive (``verl_operator.scripts``
reads the bash; nothing is executed), with the script's own variable defaults and an environment of only
``HOME`` and ``PWD``. Each command is one row; the rows that use FSDP and vLLM form the corpus, the others are
listed with the reason they are left out.

With ``--megatron`` the rows are instead the commands that launch verl's own Megatron config
(``verl-megatron-scripts.json``, see ``megatron_exclusion``).

Usage (``git`` must be on PATH)::

    python tests/fidelity/corpus/extract.py --git-dir /path/to/verl.git --ref v0.6.1 --ref HEAD \\
        --out tests/fidelity/data/verl-example-scripts.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl_operator.scripts import launch
from verl_operator.scripts.launch import Invocation
from verl_operator.scripts.shell import Field, Shell, Unsupported

MODULE = "verl.trainer.main_ppo"
#: The environment a script sees besides its own variables (anything else is unset).
ENVIRONMENT = {"HOME": "/home/user", "PWD": "/workspace"}
ARR = "actor_rollout_ref"


def _git(git_dir: str, *args: str) -> str:
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True, text=True
    ).stdout


def invocations(text: str) -> list[Invocation]:
    """Every ``main_ppo`` command of a script, expanded as bash would run it without arguments.

    Raises:
        Unsupported: the script uses shell syntax the reader does not evaluate.
    """
    return [i for i in launch.invocations(text, Shell(ENVIRONMENT)) if i.module == MODULE]


def _split_args(args: list[Field]) -> dict[str, Any]:
    """Hydra's command line (``launch.hydra_args``) as the row's fields."""
    split = launch.hydra_args(args)
    return {
        "config_name": split.config_name,
        "config_path": split.config_path,
        "options": split.options,
        "overrides": split.overrides,
        "dropped": [{"override": o, "unset": list(u)} for o, u in split.dropped],
        "unset_in_kept": [{"override": o, "unset": list(u)} for o, u in split.unset_in_kept],
    }


def _last(overrides: list[str], key: str) -> str | None:
    values = [o.split("=", 1)[1] for o in overrides if "=" in o and o.split("=", 1)[0].lstrip("+") == key]
    return values[-1] if values else None


#: The rollout engines a corpus keeps (``--engine``; the main corpus: vLLM, the engines' corpus
#: ``verl-engine-scripts.json``: SGLang and TensorRT-LLM).
ENGINES: tuple[str, ...] = ("vllm",)


def _exclusion(row: dict[str, Any]) -> str | None:
    """Why a command is not an FSDP launch of verl's own ``ppo_trainer`` config with one of ``ENGINES``, or
    None."""
    overrides = row["overrides"]
    if "npu" in Path(row["source"]["path"]).stem.lower().split("_"):
        return "an Ascend NPU script"
    if row["config_path"] is not None:
        return f"uses its own config folder (--config-path={row['config_path']})"
    if row["config_name"] not in (None, "ppo_trainer"):
        return f"config {row['config_name']} (not the FSDP ppo_trainer)"
    strategy = _last(overrides, f"{ARR}.actor.strategy")
    if strategy not in (None, "fsdp", "fsdp2"):
        return f"actor strategy {strategy}"
    return _launch_exclusion(overrides, ENGINES)


#: ``--config-path`` values that name ``main_ppo``'s own config folder: Hydra resolves a relative config path
#: against the folder of the file that declares ``@hydra.main`` (``verl/trainer/main_ppo.py``, whose own
#: ``config_path`` is ``"config"``), so these select ``verl/trainer/config``, the built-in configs.
OWN_CONFIG_PATHS: tuple[str, ...] = ("config", "./config", "config/")
#: The reason ``megatron_exclusion`` gives an FSDP command (those are listed in verl-example-scripts.json).
NOT_MEGATRON = "not a Megatron launch (no megatron config or strategy)"
#: The rollout engines the Megatron corpus keeps (the planner models all three).
MEGATRON_ENGINES: tuple[str, ...] = ("vllm", "sglang", "trtllm")


def megatron_exclusion(row: dict[str, Any]) -> str | None:
    """Why a command is not a Megatron launch of verl's own ``ppo_megatron_trainer`` config, or None.

    A row is kept when its config is ``ppo_megatron_trainer`` (``.yaml`` or not) from verl's own config
    folder (no ``--config-path``, or one of ``OWN_CONFIG_PATHS``), its actor strategy is ``megatron`` (the
    config's default), it rolls out with one of ``MEGATRON_ENGINES`` on CUDA and names its model.
    """
    overrides = row["overrides"]
    name = (row["config_name"] or "ppo_trainer").removesuffix(".yaml")
    strategy = _last(overrides, f"{ARR}.actor.strategy")
    if strategy != "megatron" and "megatron" not in name:
        return NOT_MEGATRON
    if "npu" in Path(row["source"]["path"]).stem.lower().split("_"):
        return "an Ascend NPU script"
    if row["config_path"] is not None and row["config_path"] not in OWN_CONFIG_PATHS:
        return f"uses its own config folder (--config-path={row['config_path']})"
    if name != "ppo_megatron_trainer":
        return f"config {name} (not ppo_megatron_trainer)"
    if strategy not in (None, "megatron"):
        return f"actor strategy {strategy}"
    return _launch_exclusion(overrides, MEGATRON_ENGINES)


def _launch_exclusion(overrides: list[str], engines: tuple[str, ...]) -> str | None:
    """The reason shared by both corpora: a rollout engine outside ``engines``, a device other than CUDA or
    no model path (or None)."""
    engine = _last(overrides, f"{ARR}.rollout.name")
    if engine not in engines:
        return f"rollout engine {engine or '(unset)'}"
    device = _last(overrides, "trainer.device")
    if device not in (None, "cuda"):
        return f"trainer.device={device}"
    if _last(overrides, f"{ARR}.model.path") is None:
        return "no actor_rollout_ref.model.path"
    return None


def rows_for(
    git_dir: str, ref: str, exclusion: Callable[[dict[str, Any]], str | None] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The corpus rows and the excluded commands/scripts of one ref (``exclusion``: why a command is left out,
    ``_exclusion`` when not given)."""
    exclusion = exclusion or _exclusion
    commit = _git(git_dir, "rev-parse", f"{ref}^{{commit}}").strip()
    date = _git(git_dir, "show", "-s", "--format=%cs", commit).strip()
    listing = _git(git_dir, "ls-tree", "-r", commit, "examples").splitlines()
    rows: list[dict[str, Any]] = []
    excluded: list[dict[str, Any]] = []
    for entry in listing:
        meta, path = entry.split("\t", 1)
        if not path.endswith(".sh"):
            continue
        blob = meta.split()[2]
        text = _git(git_dir, "cat-file", "blob", blob)
        if MODULE not in text:
            continue
        source = {"repo": "volcengine/verl", "ref": ref, "commit": commit, "date": date, "path": path}
        source["blob"] = blob
        try:
            found = invocations(text)
        except Unsupported as exc:
            excluded.append({"source": source, "reason": f"shell syntax not read: {exc}"})
            continue
        for index, invocation in enumerate(found):
            row = {"id": f"{ref}:{path}#{index}", "source": {**source, "line": invocation.line}}
            row.update(_split_args(invocation.args))
            reason = exclusion(row)
            if reason is not None:
                excluded.append({"source": row["source"], "reason": reason})
                continue
            overrides = row["overrides"]
            nnodes, gpn = _last(overrides, "trainer.nnodes"), _last(overrides, "trainer.n_gpus_per_node")
            row["nnodes"] = int(nnodes) if nnodes and nnodes.isdigit() else None
            row["n_gpus_per_node"] = int(gpn) if gpn and gpn.isdigit() else None
            row["model"] = _last(overrides, f"{ARR}.model.path")
            rows.append(row)
    return rows, excluded


def _not_megatron(entry: dict[str, Any]) -> bool:
    """An excluded entry that the Megatron file does not list: an FSDP command, or an unreadable script
    whose name does not say Megatron."""
    reason = str(entry["reason"])
    unread = reason.startswith("shell syntax not read") and "megatron" not in entry["source"]["path"].lower()
    return reason == NOT_MEGATRON or unread


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git-dir", required=True, help="a clone (bare is fine) of volcengine/verl")
    parser.add_argument("--ref", action="append", required=True, help="a tag or commit (repeatable)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--engine", action="append", help="a rollout engine to keep (repeatable; default vllm)"
    )
    parser.add_argument(
        "--megatron",
        action="store_true",
        help="keep the launches of verl's own ppo_megatron_trainer config instead (megatron_exclusion)",
    )
    args = parser.parse_args(argv)
    global ENGINES
    ENGINES = tuple(args.engine or ENGINES)
    exclusion = megatron_exclusion if args.megatron else _exclusion
    rows: list[dict[str, Any]] = []
    excluded: list[dict[str, Any]] = []
    for ref in args.ref:
        got, left_out = rows_for(args.git_dir, ref, exclusion)
        rows += got
        excluded += [e for e in left_out if not (args.megatron and _not_megatron(e))]
    document = {
        "about": "verl example launch scripts, expanded as main_ppo receives them; see README.md here",
        "generator": "tests/fidelity/corpus/extract.py",
        "environment": ENVIRONMENT,
        "refs": sorted({(r["source"]["ref"], r["source"]["commit"]) for r in rows + excluded}),
        "rows": rows,
        "excluded": excluded,
    }
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"{len(rows)} rows, {len(excluded)} excluded -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
