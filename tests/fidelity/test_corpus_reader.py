"""The launch-script reader (``verl_operator.scripts``, ``corpus/extract.py``) and the stored corpus rows.

The reader runs nothing: these tables pin what bash would pass to ``main_ppo`` for the constructs verl's
example scripts use.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

CORPUS = Path(__file__).parent / "corpus"
sys.path.insert(0, str(CORPUS))
from extract import _split_args, invocations  # noqa: E402

from verl_operator.scripts.shell import Unsupported  # noqa: E402

DATA = Path(__file__).parent / "data" / "verl-example-scripts.json"
MAIN = "python3 -m verl.trainer.main_ppo"


def _argv(script: str) -> list[str]:
    (found,) = invocations(script)
    return [field.text for field in found.args]


@pytest.mark.parametrize(
    ("script", "argv"),
    [
        (f"{MAIN} a=1 \\\n  b=2 $@", ["a=1", "b=2"]),
        (f'm=${{M:-"Qwen/Q"}}\n{MAIN} x=$m y="$m"', ["x=Qwen/Q", "y=Qwen/Q"]),
        (f"n=$((2 * (3 + 1)))\nh=$((n / 3))\n{MAIN} n=$n h=$h", ["n=8", "h=2"]),
        (f'A="\n  p.a=1 \\\n  p.b=2"\n{MAIN} $A "$A"', ["p.a=1", "p.b=2", "\n  p.a=1   p.b=2"]),
        (f"A='p.a=1 p.b=2'\n{MAIN} ${{A//p./q.}}", ["q.a=1", "q.b=2"]),
        (f'B=(\n  b.x=1\n  "b.y=a b"\n)\n{MAIN} "${{B[@]}}"', ["b.x=1", "b.y=a b"]),
        (f"{MAIN} q='$HOME' r=\"$HOME\" s=${{1:-vllm}}", ["q=$HOME", "r=/home/user", "s=vllm"]),
        (f"{MAIN} k=$UNSET 2>&1 | tee log.txt", ["k="]),
        (
            f'x=8\nif [ "$x" = "4" ]; then\n y=a\nelif [[ $x == 8 ]]; then\n y=b\nelse\n y=c\nfi\n{MAIN} y=$y',
            ["y=b"],
        ),
        (f"# it's a comment with a quote \\\n{MAIN} a=1 # trailing 'note'", ["a=1"]),
        (f"PYTHONPATH=/x nohup {MAIN} --config-name=ppo_trainer a=1", ["--config-name=ppo_trainer", "a=1"]),
    ],
)
def test_reader_expands_like_bash(script: str, argv: list[str]) -> None:
    assert _argv(script) == argv


@pytest.mark.parametrize(
    "script",
    [
        f"for i in 1 2; do {MAIN} a=$i; done",
        f"f() {{\n {MAIN} a=1\n}}",
        f"source env.sh\n{MAIN} a=1",
        f"cat <<EOF\nx\nEOF\n{MAIN} a=1",
        f"n=$((4 / $ZERO))\n{MAIN} a=$n",
    ],
)
def test_reader_refuses_what_it_does_not_evaluate(script: str) -> None:
    with pytest.raises(Unsupported):
        invocations(script)


def test_unset_values_are_dropped_and_recorded() -> None:
    (found,) = invocations(f'N=${{SLURM_NODES}}\n{MAIN} trainer.nnodes="$N" a.b=$X/y c=1')
    split = _split_args(found.args)
    assert split["overrides"] == ["a.b=/y", "c=1"]
    assert split["dropped"] == [{"override": "trainer.nnodes=", "unset": ["N"]}]
    assert split["unset_in_kept"] == [{"override": "a.b=/y", "unset": ["X"]}]


def test_stored_corpus_rows() -> None:
    data = json.loads(DATA.read_text())
    rows = data["rows"]
    refs = {row["source"]["ref"] for row in rows}
    assert refs == {"v0.6.1", "HEAD"}, refs
    assert len(rows) >= 80, len(rows)
    for row in rows:
        assert row["overrides"], row["id"]
        assert all("=" in o and "\n" not in o for o in row["overrides"]), row["id"]
        assert row["config_path"] is None and row["config_name"] in (None, "ppo_trainer"), row["id"]
        assert len(row["source"]["commit"]) == 40 and row["source"]["path"].startswith("examples/")
    assert len({row["id"] for row in rows}) == len(rows)
    # Scripts repeat keys (a base block and a per-run block): they stay repeated, in order.
    assert any(
        len(
            [
                o
                for o in row["overrides"]
                if o.startswith("actor_rollout_ref.model.enable_gradient_checkpointing=")
            ]
        )
        > 1
        for row in rows
    )
