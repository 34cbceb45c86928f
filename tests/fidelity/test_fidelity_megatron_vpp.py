"""A virtual pipeline size on verl's uneven pipeline splits, judged by megatron-core and by the planner.

verl's large-MoE scripts split the layers unevenly: Qwen3-235B-A22B's (``run_qwen3-235b_megatron_96gb.sh``)
counts the embedding and the loss as layers of the first and last stage (94 + 2 = 96 over PP 8), DeepSeek-V3's
(``run_deepseek671b_math_megatron_96gb.sh``) pins its last stage (61 layers, PP 12, 6 on the last). With an
interleaved schedule megatron-core's ``TransformerConfig`` asks each stage's share to divide by VPP, not the
layers by ``PP x VPP`` (Qwen3-235B-A22B takes VPP 2 though 94 % 16 != 0). The scripts' rows of
``data/memory-evidence.csv`` (verl 0.6.1's config) are launched with VPP 2 to 6 through verl's checks with
megatron-core 0.14.0 (``verl_runner_megatron.py``) and planned: verl and the planner must agree on each.
"""

from __future__ import annotations

import json

from test_memory_evidence import evidence_rows, plan_row
from verl_client import CheckRequest, VerlRunner

MAIN = ("python3", "-m", "verl.trainer.main_ppo")
VPP_KEY = "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size"
#: The rows: Qwen3-235B-A22B on 32 H20 (embedding and loss accounted), DeepSeek-V3 on 96 H20 (last stage 6).
ROWS = (
    "run_qwen3-235b_megatron_96gb.sh#megatron@NNODES=4;",
    "run_deepseek671b_math_megatron_96gb.sh#megatron@NNODES=12;",
)
VPPS = (2, 3, 4, 5, 6)


def _rows() -> list[dict[str, str]]:
    rows = evidence_rows()
    return [next(r for r in rows if marker in r["id"]) for marker in ROWS]


def test_a_virtual_pipeline_on_an_uneven_split(verl_runners: dict[str, VerlRunner]) -> None:
    from verl_operator.planner import catalog

    cases = []
    for row in _rows():
        entry = catalog.lookup(row["model"])
        assert entry is not None, row["model"]
        shape = entry.shape.model_dump(mode="json", by_alias=True, exclude_none=True)
        for vpp in VPPS:
            overrides = [o for o in json.loads(row["overrides"]) if not o.lstrip("+").startswith(VPP_KEY)]
            overrides.append(f"{VPP_KEY}={vpp}")
            argv = (*MAIN, *overrides)
            cases.append(
                (row, vpp, overrides, CheckRequest(f"{row['id']}~vpp{vpp}", argv=argv, model_shape=shape))
            )
    results = verl_runners["0.6.1"].check([c[3] for c in cases])
    verdicts = []
    for (row, vpp, overrides, _), verl in zip(cases, results, strict=True):
        result = plan_row(row, overrides)
        layers = [v for v in result.violations if v.rule == "megatron-layers-divisible"]
        verdicts.append(
            (row["model"], vpp, verl.ok, verl.stage, (verl.error or "")[:160], [v.message for v in layers])
        )
        if verl.ok:
            assert not layers, verdicts[-1]
        else:
            assert verl.stage == "megatron_transformer_config", verdicts[-1]
            assert layers and not result.feasible, verdicts[-1]
            assert any("VPP" in v.field or "virtual" in v.field.lower() for v in layers), verdicts[-1]
    accepted = [v for v in verdicts if v[2]]
    # the test means something only if both outcomes occur: VPP 2 on Qwen3-235B builds, 5 does not
    assert accepted and len(accepted) < len(verdicts), verdicts
    assert ("Qwen/Qwen3-235B-A22B", 2, True) in [v[:3] for v in verdicts], verdicts


LAST_KEY = "actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_last_pipeline_stage"


def test_the_qwen3_235b_table_at_its_revision(verl_runners: dict[str, VerlRunner]) -> None:
    """docs/perf/dpsk.md's Qwen3-235B-A22B settings at the script revision they were published with (65c59c7,
    ``num_layers_in_last_pipeline_stage=${LAST_LAYER}``): with the script's default last stage, 10, verl and
    megatron-core accept each; with the table's own LAST_LAYER, 6, megatron-core refuses each (94 - 6 = 88
    layers for 7 stages) and so does the planner."""
    rows = [r for r in evidence_rows() if "qwen3-235b" in r["id"] and r["commit"].startswith("65c59c719")]
    assert len(rows) == 4
    from verl_operator.planner import catalog

    entry = catalog.lookup(rows[0]["model"])
    assert entry is not None
    shape = entry.shape.model_dump(mode="json", by_alias=True, exclude_none=True)
    cases = []
    for row in rows:
        written = json.loads(row["overrides"])
        assert f"+{LAST_KEY}=10" in written, row["id"]
        for last in (10, 6):
            overrides = [o for o in written if not o.lstrip("+").startswith(LAST_KEY)] + [
                f"+{LAST_KEY}={last}"
            ]
            request = CheckRequest(f"{row['id']}~last{last}", argv=(*MAIN, *overrides), model_shape=shape)
            cases.append((row, last, overrides, request))
    results = verl_runners["0.6.1"].check([c[3] for c in cases])
    for (row, last, overrides, _), verl in zip(cases, results, strict=True):
        result = plan_row(row, overrides)
        seen = (
            row["id"],
            last,
            verl.ok,
            verl.stage,
            (verl.error or "")[:200],
            [v.rule for v in result.violations],
        )
        if last == 10:
            assert verl.ok and result.feasible, seen
        else:
            assert not verl.ok and verl.stage == "megatron_transformer_config", seen
            assert not result.feasible, seen
            assert [v.rule for v in result.violations] == ["megatron-layers-divisible"], seen
