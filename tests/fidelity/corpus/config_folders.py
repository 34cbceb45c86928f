"""Read the launches that use one of verl's example config folders (``--config-path``) as facts.

Some of verl's example scripts run ``main_ppo`` with a config folder of the example's own, for example
``--config-path=$PROJECT_DIR/examples/sglang_multiturn/config --config-name=gsm8k_multiturn_grpo``. That file's
``defaults`` list names one of verl's own configs (``ppo_trainer`` or ``ppo_megatron_trainer``) and then
``_self_``: Hydra loads verl's config, merges the file's values over it (adding the keys verl's config lacks),
then applies the command line's overrides. So the launch is the same as ``--config-name=<that config>`` with
the file's values as overrides in front of the script's own, each written ``++key=value`` (set the key, or add
it where verl's config has none, as the merge does). ``hydra.*`` (the file's search path) is left out: it only
tells Hydra where verl's configs are.

Each such command becomes a row of ``verl-engine-scripts.json`` whose ``config_folder`` holds those facts with
their source: the file (repo, commit, blob, path), its ``defaults``, the ``base`` config they select, the
flattened ``overrides``, and ``files``: every tool / interaction config path the file or the script names
(``*.multi_turn.*_config_path``), with the blob of that file at the same commit (null: not in the
repository), since verl's multi-turn rollout opens them when it starts. The file itself is not copied.

A folder row is kept when the folder's own ``rollout.name`` or the script's is one of the engines asked for
(``--engine``): the folder is written for that engine, and a script of it that switches the engine stays with
its folder. Usage (``git`` on PATH; the other rows are ``extract.py``'s)::

    python tests/fidelity/corpus/config_folders.py --git-dir /path/to/verl.git --ref v0.6.1 --ref HEAD \\
        --engine sglang --engine trtllm --out tests/fidelity/data/verl-engine-scripts.json
"""

from __future__ import annotations

import argparse
import json
import posixpath
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import extract  # the sibling module, found through the path above

#: ``defaults`` entries that are verl's own configs, the only bases this reader takes.
BASES = ("ppo_trainer", "ppo_megatron_trainer")
#: The reason ``extract.py`` gives a command with its own config folder (a prefix).
FOLDER_REASON = "uses its own config folder"
ARR = extract.ARR
#: Override keys whose values are files the multi-turn rollout opens.
FILE_KEYS = (
    f"{ARR}.rollout.multi_turn.tool_config_path",
    f"{ARR}.rollout.multi_turn.interaction_config_path",
)


def _git(git_dir: str, *args: str) -> str:
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True, text=True
    ).stdout


def _blob(git_dir: str, commit: str, path: str) -> str | None:
    """The blob id of ``path`` at ``commit``, or None when it is not there."""
    out = subprocess.run(
        ["git", f"--git-dir={git_dir}", "rev-parse", "--verify", "--quiet", f"{commit}:{path}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or None


def repo_path(config_path: str) -> str | None:
    """The repository path of a ``--config-path`` that names a folder of ``examples/`` (the scripts write
    ``$PROJECT_DIR/examples/...`` with ``PROJECT_DIR=$(pwd)``, the repository root), or None."""
    normal = posixpath.normpath(config_path)
    parts = normal.split("/")
    if "examples" not in parts:
        return None
    return "/".join(parts[parts.index("examples") :])


#: Strings Hydra reads back as the same string without quotes (no grammar characters, not a number).
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./\-]*")


def hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar: plain names as they are, other strings single-quoted (a quote and the backslashes before a
    quote or the end escaped), booleans ``true``/``false``, ``null``, numbers as YAML wrote them, lists and
    dicts element by element."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in ("true", "false", "null", "nan", "inf"):
        return text
    out: list[str] = []
    for i, ch in enumerate(text):
        if ch == "\\" and (i + 1 == len(text) or text[i + 1] in "\\'" or _before_quote(text, i)):
            out.append("\\\\")
        elif ch == "'":
            out.append("\\'")
        else:
            out.append(ch)
    return "'" + "".join(out) + "'"


def _before_quote(text: str, i: int) -> bool:
    """Whether the backslash at ``i`` is one of a run that ends at a quote or the end of the text."""
    j = i
    while j < len(text) and text[j] == "\\":
        j += 1
    return j == len(text) or text[j] == "'"


def flatten(node: dict[str, Any], prefix: str = "") -> list[str]:
    """``++key=value`` for every leaf of a config mapping (an empty mapping is a leaf: ``{}``)."""
    out: list[str] = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out += flatten(value, path + ".")
        else:
            out.append(f"++{path}={hydra_value(value)}")
    return out


def folder_facts(git_dir: str, commit: str, config_path: str, config_name: str) -> dict[str, Any]:
    """The facts of ``<config_path>/<config_name>.yaml`` at ``commit`` (see the module docstring).

    Raises:
        ValueError: The file is missing, or its defaults are not one of ``BASES`` then ``_self_``.
    """
    folder = repo_path(config_path)
    if folder is None:
        raise ValueError(f"--config-path={config_path} is not a folder of examples/")
    path = f"{folder}/{config_name.removesuffix('.yaml')}.yaml"
    blob = _blob(git_dir, commit, path)
    if blob is None:
        raise ValueError(f"{path} is not in the repository at {commit}")
    document = yaml.safe_load(_git(git_dir, "cat-file", "blob", blob)) or {}
    defaults = document.pop("defaults", None)
    if not (
        isinstance(defaults, list) and len(defaults) == 2 and defaults[0] in BASES and defaults[1] == "_self_"
    ):
        raise ValueError(f"{path}: defaults {defaults!r} are not one of {BASES} then _self_")
    document.pop("hydra", None)
    return {
        "repo": "volcengine/verl",
        "commit": commit,
        "path": path,
        "blob": blob,
        "defaults": defaults,
        "base": defaults[0],
        "overrides": flatten(document),
    }


def named_files(git_dir: str, commit: str, overrides: list[str]) -> list[dict[str, Any]]:
    """The tool / interaction config files the overrides name (the last value of each key), with their blob
    at ``commit`` (the scripts write ``$PROJECT_DIR/examples/...``)."""
    out: list[dict[str, Any]] = []
    for key in FILE_KEYS:
        values = [o.split("=", 1)[1].strip("'\"") for o in overrides if o.split("=", 1)[0].lstrip("+") == key]
        if not values or values[-1] in ("", "null"):
            continue
        path = repo_path(values[-1])
        out.append(
            {"key": key, "value": values[-1], "path": path, "blob": path and _blob(git_dir, commit, path)}
        )
    return out


def exclusion(row: dict[str, Any], engines: tuple[str, ...]) -> str | None:
    """Why a folder row is left out, or None (``extract._exclusion``'s reasons, over the folder's overrides
    and the script's together)."""
    folder = row["config_folder"]
    overrides = folder["overrides"] + row["overrides"]
    if "npu" in Path(row["source"]["path"]).stem.lower().split("_"):
        return "an Ascend NPU script"
    engine_of_folder = _last(folder["overrides"], f"{ARR}.rollout.name")
    engine = _last(overrides, f"{ARR}.rollout.name")
    if engine_of_folder not in engines and engine not in engines:
        return f"config folder for rollout engine {engine_of_folder or '(unset)'}"
    device = _last(overrides, "trainer.device")
    if device not in (None, "cuda"):
        return f"trainer.device={device}"
    if _last(overrides, f"{ARR}.model.path") is None:
        return "no actor_rollout_ref.model.path"
    return None


def _last(overrides: list[str], key: str) -> str | None:
    values = [
        o.split("=", 1)[1].strip("'") for o in overrides if "=" in o and o.split("=", 1)[0].lstrip("+") == key
    ]
    return values[-1] if values else None


def folder_rows(
    git_dir: str, left_out: list[dict[str, Any]], engines: tuple[str, ...]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows (and the still excluded commands) of the entries ``extract.py`` left out for their config
    folder: each script is read again and its commands with a readable folder get ``config_folder``."""
    rows: list[dict[str, Any]] = []
    excluded: list[dict[str, Any]] = []
    by_script: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for entry in left_out:
        by_script.setdefault((entry["source"]["commit"], entry["source"]["path"]), []).append(entry)
    for (commit, path), entries in by_script.items():
        source = {k: v for k, v in entries[0]["source"].items() if k != "line"}
        wanted = {e["source"]["line"] for e in entries}
        found = extract.invocations(_git(git_dir, "cat-file", "blob", source["blob"]))
        for index, invocation in enumerate(found):
            if invocation.line not in wanted:
                continue
            row: dict[str, Any] = {
                "id": f"{source['ref']}:{path}#{index}",
                "source": {**source, "line": invocation.line},
            }
            row.update(extract._split_args(invocation.args))
            try:
                row["config_folder"] = folder_facts(git_dir, commit, row["config_path"], row["config_name"])
            except ValueError as exc:
                excluded.append({"source": row["source"], "reason": f"{FOLDER_REASON}: {exc}"})
                continue
            folder = row["config_folder"]
            folder["files"] = named_files(git_dir, commit, folder["overrides"] + row["overrides"])
            reason = exclusion(row, engines)
            if reason is not None:
                excluded.append({"source": row["source"], "reason": reason})
                continue
            overrides = folder["overrides"] + row["overrides"]
            nnodes, gpn = _last(overrides, "trainer.nnodes"), _last(overrides, "trainer.n_gpus_per_node")
            row["nnodes"] = int(nnodes) if nnodes and nnodes.isdigit() else None
            row["n_gpus_per_node"] = int(gpn) if gpn and gpn.isdigit() else None
            row["model"] = _last(overrides, f"{ARR}.model.path")
            rows.append(row)
    return rows, excluded


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git-dir", required=True, help="a clone (bare is fine) of volcengine/verl")
    parser.add_argument("--ref", action="append", required=True, help="a tag or commit (repeatable)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--engine", action="append", required=True, help="a rollout engine to keep (repeatable)"
    )
    args = parser.parse_args(argv)
    extract.ENGINES = tuple(args.engine)
    rows: list[dict[str, Any]] = []
    excluded: list[dict[str, Any]] = []
    for ref in args.ref:
        got, left_out = extract.rows_for(args.git_dir, ref)
        folders = [e for e in left_out if str(e["reason"]).startswith(FOLDER_REASON) and _in_examples(e)]
        more, still_out = folder_rows(args.git_dir, folders, extract.ENGINES)
        rows += got + more
        excluded += [e for e in left_out if e not in folders] + still_out
    document = {
        "about": "verl example launch scripts, expanded as main_ppo receives them; see README.md here",
        "generator": "tests/fidelity/corpus/config_folders.py (tests/fidelity/corpus/extract.py for the rest)",
        "environment": extract.ENVIRONMENT,
        "refs": sorted({(r["source"]["ref"], r["source"]["commit"]) for r in rows + excluded}),
        "rows": rows,
        "excluded": excluded,
    }
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(
        f"{len(rows)} rows ({len(rows) - sum(1 for r in rows if 'config_folder' not in r)} with a config "
        f"folder), {len(excluded)} excluded -> {args.out}",
        file=sys.stderr,
    )
    return 0


def _in_examples(entry: dict[str, Any]) -> bool:
    reason = str(entry["reason"])
    return "=" in reason and repo_path(reason.split("=", 1)[1].rstrip(")")) is not None


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
