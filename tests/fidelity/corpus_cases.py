"""The corpus of verl's own launch scripts (``data/verl-example-scripts.json``) as fidelity cases.

Each stored row is checked against every supported verl release: verl's own checks run on the row's
overrides (``verl_runner.py``), the planner plans a VerlJob holding the same overrides on a simulated cluster
of the row's size, and ``judge`` compares the two verdicts.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from plan_sample import RELEASE, make_node

DATA = Path(__file__).parent / "data" / "verl-example-scripts.json"
#: The simulated GPU node: the scripts target 80 GB H100/A100/H800-class GPUs.
GPU_PRODUCT, GPU_MEMORY_MIB = "NVIDIA-H100-80GB-HBM3", 81559
#: verl's defaults for trainer.nnodes and trainer.n_gpus_per_node.
DEFAULT_NNODES, DEFAULT_GPUS_PER_NODE = 1, 8

#: Models of the corpus the planner's catalog lacks, and why their rows are not judged.
NOT_JUDGED_MODELS: dict[str, str] = {
    "Qwen/Qwen2.5-VL-7B-Instruct": "vision-language model (the planner models decoder-only LMs)",
    "zai-org/GLM-4.1V-9B-Thinking": "vision-language model (the planner models decoder-only LMs)",
    "openbmb/MiniCPM-o-2_6": "omni-modal model (the planner models decoder-only LMs)",
    "model_path": "the script passes the literal string 'model_path' as the model (a typo in the script)",
}
#: Corpus models named differently from the catalog entry with the same config.json numbers.
SAME_SHAPE_AS: dict[str, str] = {
    # Qwen2.5-Coder-14B-Instruct's config.json has Qwen2.5-14B-Instruct's numbers (48 layers, hidden 5120,
    # 40 heads, 8 KV heads, intermediate 13824, vocab 152064).
    "Qwen/Qwen2.5-Coder-14B-Instruct": "Qwen/Qwen2.5-14B-Instruct",
}

#: Planner rules that judge memory (an estimate, allowed to differ from verl, which never checks memory).
MEMORY_RULES = frozenset({"memory-train", "memory-log-prob", "memory-rollout", "kv-cache-max-model-len"})

#: verl stages whose failure is about arithmetic or shapes (the planner must reject those launches).
ARITHMETIC_STAGES = frozenset(
    {"validate_config", "dataclass:rollout", "rollout_registry", "rollout_replica", "monkey_patch"}
)
#: verl's message -> the planner fields (normalised: lower case, no ``_``) one of whose violations must name.
ERROR_FIELDS: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = (
    (re.compile(r"ppo_mini_batch_size"), ("minibatchsize", "trainbatchsize")),
    (re.compile(r"real_train_batch_size|train_batch_size"), ("trainbatchsize", "rollout.n", "rolloutn")),
    (re.compile(r"micro_batch_size"), ("microbatchsize",)),
    (
        re.compile(r"ulysses|sp_size|sequence_parallel|num_attention_heads|num_key_value_heads"),
        ("sequenceparallel",),
    ),
    (
        re.compile(r"tensor_model_parallel|world_size|gpus_per_node|replica"),
        ("tensormodelparallel", "tensorparallel"),
    ),
    (re.compile(r"mode"), ("rollout.mode", "rolloutmode")),
    (re.compile(r"use_remove_padding"), ("removepadding", "sequenceparallel")),
)


@dataclasses.dataclass(frozen=True)
class Case:
    """One corpus row planned and checked for one verl release line."""

    row_id: str
    line: str  # VerlJob spec.verl.version: 0.6 or 0.9
    release: str  # the verl release that judges it
    overrides: tuple[str, ...]
    spec: dict[str, Any] | None  # None: not judged
    nodes: tuple[dict[str, Any], ...]
    shape: dict[str, Any] | None
    not_judged: str | None = None

    @property
    def label(self) -> str:
        return f"{self.release}|{self.row_id}"


def load_rows() -> list[dict[str, Any]]:
    """The stored corpus rows."""
    return list(json.loads(DATA.read_text())["rows"])


def _shape(model: str) -> tuple[dict[str, Any] | None, str | None]:
    return catalog_shape(
        model,
        NOT_JUDGED_MODELS,
        SAME_SHAPE_AS,
        "is not in the planner's catalog and the corpus records no shape for it",
    )


def catalog_shape(
    model: str, not_judged: Mapping[str, str], same_shape_as: Mapping[str, str], missing: str
) -> tuple[dict[str, Any] | None, str | None]:
    """``(the catalog's shape of the script's model, None)``, or ``(None, why it is not judged)``: a model in
    ``not_judged``, or not in the catalog (``missing`` follows its name); ``same_shape_as`` maps a script's
    model name to the catalog entry with the same config numbers."""
    from verl_operator.planner import catalog

    if model in not_judged:
        return None, not_judged[model]
    entry = catalog.lookup(same_shape_as.get(model, model))
    if entry is None:
        return None, f"{model} {missing}"
    return dict(entry.shape.to_wire()), None


def case_for(row: dict[str, Any], line: str) -> Case:
    """The case of ``row`` on verl line ``line``: a VerlJob spec with the row's overrides and its nodes."""
    nnodes = row["nnodes"] or DEFAULT_NNODES
    per_node = row["n_gpus_per_node"] or DEFAULT_GPUS_PER_NODE
    shape, why = _shape(row["model"])
    nodes = tuple(make_node(f"n{i}", per_node, GPU_PRODUCT, GPU_MEMORY_MIB) for i in range(nnodes))
    spec = None
    if why is None:
        model: dict[str, Any] = {"path": row["model"]}
        if SAME_SHAPE_AS.get(row["model"]):
            model["shape"] = shape
        spec = {
            "verl": {"image": "verl:test", "version": line},
            "model": model,
            "resources": {"gpus": nnodes * per_node},
            "overrides": list(row["overrides"]),
        }
    return Case(row["id"], line, RELEASE[line], tuple(row["overrides"]), spec, nodes, shape, why)


def cases() -> list[Case]:
    """Every row on every supported verl line."""
    return [case_for(row, line) for row in load_rows() for line in sorted(RELEASE)]


def _last(overrides: list[str], key: str) -> str | None:
    values = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+") == key]
    return values[-1] if values else None


def _int(overrides: list[str], key: str, default: int) -> int:
    value = _last(overrides, key)
    return int(value) if value is not None and value.lstrip("-").isdigit() else default


def one_change_variants(row: dict[str, Any], shape: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """Variants of a row that break one rule verl checks on the CPU: ``(name, overrides)``.

    ``batch``: ``data.train_batch_size`` moved to the next size with ``B x n % W != 0`` (no dynamic batch size);
    ``mini``: ``ppo_mini_batch_size`` above the train batch; ``sp-heads``: a Ulysses SP size that divides the
    GPUs but not the attention heads (verl's monkey patch asserts it).
    """
    overrides = list(row["overrides"])
    world = (row["nnodes"] or DEFAULT_NNODES) * (row["n_gpus_per_node"] or DEFAULT_GPUS_PER_NODE)
    n = _int(overrides, "actor_rollout_ref.rollout.n", 1)
    batch = _int(overrides, "data.train_batch_size", 1024)
    out: list[tuple[str, list[str]]] = []
    if _last(overrides, "actor_rollout_ref.actor.use_dynamic_bsz") not in ("True", "true") and n % world:
        bad = batch + 1
        while (bad * n) % world == 0:
            bad += 1
        out.append(("batch", [*overrides, f"data.train_batch_size={bad}"]))
    out.append(("mini", [*overrides, f"actor_rollout_ref.actor.ppo_mini_batch_size={batch * 2}"]))
    heads = int(shape["attentionHeads"])
    sp = next((d for d in range(2, world + 1) if world % d == 0 and heads % d), None)
    if sp is not None:
        sp_key = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
        out.append(
            ("sp-heads", [*overrides, "actor_rollout_ref.model.use_remove_padding=True", f"{sp_key}={sp}"])
        )
    return out


def variant_cases(base: list[Case]) -> list[Case]:
    """The one-change variants of every judged case (see ``one_change_variants``)."""
    rows = {row["id"]: row for row in load_rows()}
    out: list[Case] = []
    for case in base:
        if case.spec is None or case.shape is None:
            continue
        for name, overrides in one_change_variants(rows[case.row_id], case.shape):
            spec = {**case.spec, "overrides": overrides}
            out.append(
                dataclasses.replace(
                    case, row_id=f"{case.row_id}~{name}", overrides=tuple(overrides), spec=spec
                )
            )
    return out


def _norm(text: str) -> str:
    return text.lower().replace("_", "").replace("-", "")


def expected_fields(error: str) -> tuple[str, ...] | None:
    """The planner fields a violation must name for verl's ``error``; None when the message is not mapped."""
    for pattern, fields in ERROR_FIELDS:
        if pattern.search(error):
            return fields
    return None


@dataclasses.dataclass(frozen=True)
class Verdict:
    """How the planner's answer compares with verl's on one case."""

    kind: str
    detail: str = ""


#: verl errors that only a missing setting causes (the planner fills it in; its plan is checked by verl too).
MISSING_SETTING = ("Please set at least one of",)
#: verl errors of checks that need vLLM installed (the fidelity environments have no vLLM): not judged.
HARNESS_LIMITS = ("vllm version None not supported",)

#: Verdict kinds that fail the test.
DISAGREEMENTS = frozenset({"false-rejection", "missed-rejection", "wrong-field"})


def judge(verl_ok: bool, stage: str, error: str, result: Any) -> Verdict:
    """Compare verl's verdict (``verl_ok``, the failing ``stage`` and its ``error``) with a ``PlanResult``."""
    rules = sorted({v.rule for v in result.violations})
    if verl_ok:
        if result.feasible:
            return Verdict("agree-accept")
        if set(rules) <= MEMORY_RULES:
            return Verdict("accept-memory", ",".join(rules))
        other = [v for v in result.violations if v.rule not in MEMORY_RULES]
        return Verdict("false-rejection", "; ".join(f"{v.rule} @ {v.field}: {v.message}" for v in other))
    if any(marker in error for marker in HARNESS_LIMITS):
        return Verdict("not-judged", f"verl's check needs vLLM itself: {error[:120]}")
    key = _refused_key(error) if stage in ("parse", "compose") else None
    if key is not None:
        return _judge_key(key, error, result)
    if stage not in ARITHMETIC_STAGES:
        return Verdict("verl-config", f"{stage}: {error[:160]}")
    if result.feasible and any(marker in error for marker in MISSING_SETTING):
        return Verdict("planner-completes", f"{stage}: {error[:200]}")
    if result.feasible:
        return Verdict("missed-rejection", f"{stage}: {error[:300]}")
    fields = expected_fields(error)
    if fields is None or any(f in _norm(v.field) for v in result.violations for f in fields):
        return Verdict("agree-reject", ",".join(rules))
    return Verdict(
        "wrong-field",
        f"verl {stage}: {error[:200]} | planner: "
        + "; ".join(f"{v.rule} @ {v.field}" for v in result.violations),
    )


_REFUSED_KEY = re.compile(r"Could not override '([^']+)'|An item is already at '([^']+)'")


def _refused_key(error: str) -> str | None:
    """The key Hydra's struct mode refused in ``error``, or None."""
    match = _REFUSED_KEY.search(error)
    return (match.group(1) or match.group(2)) if match else None


def _judge_key(key: str, error: str, result: Any) -> Verdict:
    """verl refused an override key: the planner must refuse the same override."""
    if result.feasible:
        return Verdict("missed-rejection", f"compose: {error[:200]}")
    if any(f"({key})" in v.field for v in result.violations):
        return Verdict("agree-reject", "override key")
    return Verdict(
        "wrong-field", f"verl: {error[:160]} | planner: " + "; ".join(v.field for v in result.violations)
    )


def table(verdicts: dict[str, list[Verdict]]) -> str:
    """The agreement table: one column per release, one line per verdict kind (markdown)."""
    kinds = [
        "agree-accept",
        "accept-memory",
        "agree-reject",
        "planner-completes",
        "false-rejection",
        "missed-rejection",
        "wrong-field",
        "verl-config",
        "not-judged",
    ]
    releases = sorted(verdicts)
    counts = {release: Counter(v.kind for v in verdicts[release]) for release in releases}
    lines = ["| verdict | " + " | ".join(f"verl {r}" for r in releases) + " |"]
    lines.append("|---|" + "---|" * len(releases))
    for kind in kinds:
        lines.append(f"| {kind} | " + " | ".join(str(counts[r][kind]) for r in releases) + " |")
    lines.append("| total | " + " | ".join(str(len(verdicts[r])) for r in releases) + " |")
    return "\n".join(lines)
