"""The config-folder reader (``corpus/config_folders.py``) and the folder rows of ``verl-engine-scripts.json``.

The reader runs nothing: a config file's values become ``++key=value`` overrides whose values the planner's
override parser (Hydra's grammar) reads back unchanged, and every stored folder row names its file, its base
config and the tool / interaction files it opens, each found at the row's commit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "corpus"))
from config_folders import BASES, FILE_KEYS, flatten, hydra_value, repo_path

DATA = Path(__file__).parent / "data" / "verl-engine-scripts.json"


@pytest.mark.parametrize(
    "value",
    [
        "sglang",
        "qwen",
        "true",  # a string that would read as a boolean unquoted
        "1.5",
        "a b",
        "it's",
        "{% if x %}{{ '<tool_call>' }}{% endif %}\\n",
        "$HOME/data",
        300.0,
        60,
        True,
        None,
    ],
)
def test_values_read_back_unchanged(value: Any) -> None:
    # (Backslashes before a quote, escaped as Hydra wants them, are in none of the stored files; Hydra's own
    # compose of each file was compared with its flattened overrides, see docs/fidelity.md.)
    from verl_operator.planner.overrides import parse_override

    override = parse_override(f"++a.b={hydra_value(value)}", 0)
    assert override.prefix == "++" and override.key == "a.b"
    assert override.value == value


def test_flatten_writes_every_leaf() -> None:
    config = {"data": {"max_prompt_length": 1024}, "a": {"b": {"c": True, "d": {}}, "e": [1, "x y"]}}
    assert flatten(config) == [
        "++data.max_prompt_length=1024",
        "++a.b.c=true",
        "++a.b.d={}",
        "++a.e=[1,'x y']",
    ]


@pytest.mark.parametrize(
    ("config_path", "folder"),
    [
        ("/examples/sglang_multiturn/config", "examples/sglang_multiturn/config"),
        ("/workspace/verl/examples/sglang_multiturn/config/", "examples/sglang_multiturn/config"),
        ("config", None),  # main_ppo's own folder (verl/trainer/config)
    ],
)
def test_repo_path(config_path: str, folder: str | None) -> None:
    assert repo_path(config_path) == folder


def _folder_rows() -> list[dict[str, Any]]:
    return [r for r in json.loads(DATA.read_text())["rows"] if "config_folder" in r]


def test_stored_folder_rows_are_facts_with_their_source() -> None:
    rows = _folder_rows()
    assert len(rows) >= 20
    for row in rows:
        folder = row["config_folder"]
        assert folder["commit"] == row["source"]["commit"] and len(folder["blob"]) == 40
        assert folder["path"].startswith("examples/") and folder["path"].endswith(".yaml")
        assert folder["defaults"] == [folder["base"], "_self_"] and folder["base"] in BASES
        assert folder["overrides"] and all(o.startswith("++") for o in folder["overrides"])
        assert not any(o.startswith("++hydra.") for o in folder["overrides"])
        for named in folder["files"]:
            assert named["key"] in FILE_KEYS and named["blob"], (row["id"], named)
