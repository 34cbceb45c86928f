"""The planner takes node facts already read (what the operator keeps per Node) with the same result."""

from __future__ import annotations

import pytest
from conftest import make_node, make_nodes, make_spec

from verl_operator.api.spec import VerlJobSpec
from verl_operator.planner import plan_job
from verl_operator.planner.facts import node_facts

MIXED = [
    *make_nodes(6, prefix="h100"),
    *make_nodes(3, gpus=4, product="NVIDIA-L40S", memory_mib=46068, prefix="l40s"),
    make_node("cordoned", unschedulable=True),
    make_node("not-ready", ready=False),
]


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(make_spec(8), id="8gpu-open"),
        pytest.param(make_spec(16, resources={"gpusPerNode": 8}), id="16gpu-2nodes"),
        pytest.param(make_spec(48, resources={"gpusPerNode": 8}), id="48gpu-all-h100"),
        pytest.param(make_spec(64, resources={"gpusPerNode": 8}), id="64gpu-infeasible"),
        pytest.param(make_spec(8, resources={"gpuProduct": "NVIDIA-L40S"}), id="l40s-2nodes"),
        pytest.param(
            make_spec(16, data={"trainBatchSize": 100}, rollout={"responsesPerPrompt": 1}), id="bad-batch"
        ),
    ],
)
def test_facts_and_raw_nodes_give_the_same_result(spec: VerlJobSpec) -> None:
    raw = plan_job(spec, MIXED)
    read = plan_job(spec, [node_facts(n) for n in MIXED])
    assert read.model_dump() == raw.model_dump()
