"""The planner's override grammar against Hydra's own parser (hydra-core in each verl environment).

Every override of :data:`CASES` is parsed by ``hydra.core.override_parser.overrides_parser.OverridesParser``
in the verl environment's Python and by ``planner.overrides.parse_override``: Hydra's refusals are refused,
Hydra's sweeps (which a single run refuses with "requires --multirun") are refused, and every other
override has the value Hydra gives it. :data:`PROJECT_REFUSALS` are refused by the planner alone, each with
its reason; one deliberately wrong value proves the comparison can fail.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

import pytest

from verl_operator.planner.overrides import OverrideError, parse_override

#: Overrides judged by both parsers: typed values, quoting and escapes, lists and dicts, casts, sweeps,
#: functions, whitespace (in keys, around ``=``, in values), characters Hydra's lexer has no token for.
CASES: tuple[str, ...] = (
    "trainer.nnodes=1",
    "trainer.nnodes=int(1)",
    "trainer.nnodes=int('2')",
    "trainer.nnodes=int(2.7)",
    "trainer.nnodes=int(value=3)",
    "data.train_batch_size=int(1_024)",
    "actor_rollout_ref.rollout.gpu_memory_utilization=float(0.5)",
    "actor_rollout_ref.rollout.gpu_memory_utilization=float('0.25')",
    "trainer.experiment_name=str(42)",
    "trainer.experiment_name=str(true)",
    "actor_rollout_ref.model.use_remove_padding=bool(true)",
    "actor_rollout_ref.model.use_remove_padding=bool('False')",
    "actor_rollout_ref.model.use_remove_padding=bool(0)",
    "actor_rollout_ref.model.use_remove_padding=bool(yes)",
    "trainer.logger=int([1,2])",
    "trainer.logger=sort([b,a,c])",
    "trainer.logger=sort([3,1,2],reverse=true)",
    "trainer.nnodes=int()",
    "trainer.nnodes=int(1,value=2)",
    "trainer.nnodes=1,2",
    "trainer.nnodes=range(1,4)",
    "trainer.nnodes=choice(1,2)",
    "trainer.nnodes=interval(1,2)",
    "data.train_files=glob(*)",
    "trainer.nnodes=tag(a,choice(1,2))",
    "trainer.nnodes=foo(1)",
    "trainer.nnodes =1",
    "trainer.nnodes = 1",
    " trainer.nnodes=1",
    "trainer.nnodes= 1",
    "trainer.nnodes=1 ",
    "trainer.experiment_name=a b",
    "trainer.experiment_name='a b'",
    'trainer.experiment_name="it\'s"',
    "trainer.experiment_name='it\\'s'",
    "trainer.experiment_name='a,b'",
    "trainer.experiment_name=a\\,b",
    "trainer.experiment_name=${oc.env:USER}",
    "trainer.default_local_dir=$HOME/ckpt/run-1",
    "trainer.default_local_dir=~/ckpt",
    "trainer.experiment_name=a#b",
    "trainer.experiment_name=a!b",
    "trainer.experiment_name=run@v1?x|y",
    "trainer.experiment_name=10%",
    "trainer.experiment_name='a",
    "trainer.experiment_name=",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.optim.lr=1.5E+3",
    "actor_rollout_ref.actor.optim.lr=.5",
    "actor_rollout_ref.actor.optim.lr=5.",
    "actor_rollout_ref.actor.optim.lr=-inf",
    "trainer.nnodes=+3",
    "trainer.nnodes=007",
    "trainer.val_before_train=TRUE",
    "trainer.val_before_train=False",
    "trainer.val_before_train=none",
    "trainer.val_before_train=NULL",
    "trainer.logger=[console,wandb]",
    "trainer.logger=[ console , 'wandb' ]",
    "trainer.logger=[]",
    "trainer.logger=[a,[b,c]]",
    "trainer.logger=[a,]",
    "trainer.logger=[a",
    "trainer={nnodes:2,n_gpus_per_node:8}",
    "trainer={ nnodes : 2 }",
    "trainer={}",
    "trainer={nnodes:}",
    "trainer={nnodes:1",
    "trainer={logger:[console],x:{y:null}}",
    "trainer={nnodes:int(2)}",
    "trainer={a b:1}",
    "trainer={ a  b : 1 }",
    "trainer={a\tb:1,c d e:{f g:[x y]}}",
    "trainer={a\\ b:1}",
    "trainer={a b:1,a  b:2}",
    "trainer={1 2:3}",
    "+trainer.new_key=1",
    "++trainer.nnodes=2",
    "~trainer.nnodes",
    "~trainer.nnodes=1",
    "trainer.nnodes",
    "trainer.nnodes==1",
    "trainer.nnodes=a=b",
    "trainer.nnodes=(1)",
    "trainer.nnodes=a)",
    "trainer.nnodes=1\t",
)

#: Accepted by Hydra, refused by the planner, and why.
PROJECT_REFUSALS: dict[str, str] = {
    "trainer.nnodes=shuffle([1,2])": "no fixed result",
    "trainer={a.b:1}": "is not a name",
    "trainer={n:1,n:2}": "appears twice",
    "trainer.nnodes=" + "9" * 41: "too long",
}

HYDRA_SCRIPT = r"""
import json, math, sys
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import QuotedString

def plain(v):
    if isinstance(v, QuotedString):
        return v.text
    if isinstance(v, list):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, float) and math.isinf(v):
        return {"float": repr(v)}
    return v

parser = OverridesParser.create()
out = []
for text in json.load(sys.stdin):
    try:
        override = parser.parse_override(text)
    except Exception as exc:
        out.append(["error", type(exc).__name__ + ": " + str(exc).splitlines()[0]])
        continue
    if override.is_sweep_override():
        out.append(["sweep", None])
    else:
        out.append(["ok", [override.get_key_element(), plain(override.value())]])
print(json.dumps(out))
"""


def hydra_verdicts(python: Path, overrides: list[str]) -> list[tuple[str, Any]]:
    """``(kind, detail)`` of each override by Hydra: ``ok`` with ``[key element, value]``, ``sweep``, ``error``."""
    done = subprocess.run(
        [str(python), "-c", HYDRA_SCRIPT],
        input=json.dumps(overrides),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return [tuple(item) for item in json.loads(done.stdout)]


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return {"float": repr(value)}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def planner_verdict(text: str) -> tuple[str, Any]:
    """The planner's reading: ``ok`` with ``[key element, value]``, or ``error`` with the message."""
    try:
        ov = parse_override(text)
    except OverrideError as exc:
        return ("error", str(exc))
    key = f"{'~' if ov.prefix == '~' else ov.prefix}{ov.key}"
    return ("ok", [key, _jsonable(ov.value)])


def disagreements(python: Path, cases: tuple[str, ...]) -> list[str]:
    """Every case where the two parsers disagree, one line each (empty: they agree on all)."""
    out = []
    for text, (kind, detail) in zip(cases, hydra_verdicts(python, list(cases)), strict=True):
        mine, value = planner_verdict(text)
        if kind == "sweep":
            if mine != "error" or "requires --multirun" not in str(value):
                out.append(f"{text!r}: a sweep by Hydra, the planner says {mine} {value!r}")
        elif kind == "error":
            if mine != "error":
                out.append(f"{text!r}: Hydra refuses it ({detail}), the planner reads {value!r}")
        elif mine == "error":
            out.append(f"{text!r}: Hydra reads {detail!r}, the planner refuses it ({value})")
        elif _key_value(detail) != _key_value(value):
            out.append(f"{text!r}: Hydra reads {detail!r}, the planner {value!r}")
    return out


def _key_value(pair: list[Any]) -> tuple[str, str]:
    key, value = pair
    # Hydra's key element of ~key is "~key"; an empty value and a missing one (deletion) read alike
    return key, json.dumps(value if value != "" or not str(key).startswith("~") else None, sort_keys=True)


@pytest.fixture(scope="module", params=["0.9.1", "0.6.1"])
def hydra_python(request: pytest.FixtureRequest, verl_envs: dict[str, Any]) -> Path:
    return Path(verl_envs[request.param].python)


def test_the_planner_reads_overrides_as_hydra_does(hydra_python: Path) -> None:
    assert disagreements(hydra_python, CASES) == []


def test_the_planner_refuses_only_what_it_says_on_top_of_hydra(hydra_python: Path) -> None:
    texts = list(PROJECT_REFUSALS)
    for text, (kind, _) in zip(texts, hydra_verdicts(hydra_python, texts), strict=True):
        assert kind == "ok", text  # Hydra accepts it
        mine, message = planner_verdict(text)
        assert mine == "error" and PROJECT_REFUSALS[text] in str(message), (text, message)


def test_the_comparison_catches_a_wrong_reading(hydra_python: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import verl_operator.planner.hydra_grammar as grammar

    monkeypatch.setattr(grammar, "_cast", lambda kind, value: "wrong")
    assert disagreements(hydra_python, ("trainer.nnodes=int(1)",)) != []


def test_the_table_has_every_kind_of_verdict(hydra_python: Path) -> None:
    kinds = {kind for kind, _ in hydra_verdicts(hydra_python, list(CASES))}
    assert kinds == {"ok", "sweep", "error"}
