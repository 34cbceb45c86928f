"""Hostile and careless input: every reproduction answers with a violation naming a field, never an exception.

The cases are the ones a user hit against a running operator: numbers that made the planner run for minutes
or allocate gigabytes, overrides that crashed it (division by zero, NaN, huge integers, deep nesting, 1 MB),
pass-through quantities that the API server would only have refused at pod creation, and CLI inputs that
printed tracebacks.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest
from conftest import make_nodes
from hypothesis import given
from hypothesis import strategies as st

from verl_operator import cli
from verl_operator.api import limits
from verl_operator.api.errors import field_path
from verl_operator.api.spec import VerlJobSpec
from verl_operator.controller.webhook import admission_problems
from verl_operator.controller.webhook_server import too_deep_review
from verl_operator.crdgen import build_crd
from verl_operator.planner import arith, plan_job
from verl_operator.planner.budget import Budget
from verl_operator.planner.inputs import Fixed
from verl_operator.planner.overrides import OverrideError, parse_value
from verl_operator.planner.search import mini_candidates

NODES = make_nodes(2, gpus=8)
OVERRIDE = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"


def spec(**sections: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "verl": {"image": "example.com/verl:0.9.1"},
        "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
        "data": {"trainBatchSize": 64},
        "rollout": {"responsesPerPrompt": 4},
        "resources": {"gpus": 16, "gpusPerNode": 8},
    }
    doc.update(sections)
    return doc


def resources(**extra: Any) -> dict[str, Any]:
    return {"gpus": 16, "gpusPerNode": 8, **extra}


def nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        # Sizes that took the planner 68 s, forever (a large prime) or 2.6 GB: the schema maximum answers.
        pytest.param(
            spec(data={"trainBatchSize": 10**18}, rollout={"responsesPerPrompt": 1}),
            f"spec.data.trainBatchSize: Input should be less than or equal to {limits.MAX_BATCH}",
            id="train-batch-1e18",
        ),
        pytest.param(
            spec(data={"trainBatchSize": 1000000007}, rollout={"responsesPerPrompt": 1}),
            "spec.data.trainBatchSize: Input should be less than or equal to",
            id="train-batch-prime-1e9",
        ),
        # The largest prime below the maximum plans at once with suggestions (no linear scan).
        pytest.param(
            spec(data={"trainBatchSize": 1048573}, rollout={"responsesPerPrompt": 1}),
            "use trainBatchSize 1048560 or 1048576",
            id="train-batch-large-prime",
        ),
        pytest.param(
            spec(resources={"gpus": 10**6}), "spec.resources.gpus: Input should be less than", id="gpus"
        ),
        # Overrides that crashed the planner.
        pytest.param(
            spec(overrides=[f"{OVERRIDE}=0"]),
            f"spec.overrides[0] ({OVERRIDE}): 0 is outside the supported range 1 to {limits.MAX_BATCH}",
            id="micro-batch-zero",
        ),
        pytest.param(
            spec(overrides=["actor_rollout_ref.rollout.gpu_memory_utilization=1e308"]),
            "(actor_rollout_ref.rollout.gpu_memory_utilization): 1e+308 is outside the supported range",
            id="gpu-memory-utilization-1e308",
        ),
        pytest.param(
            spec(overrides=["actor_rollout_ref.rollout.gpu_memory_utilization=nan"]),
            "gpu_memory_utilization",
            id="gpu-memory-utilization-nan",
        ),
        pytest.param(
            spec(overrides=["data.max_prompt_length=" + "9" * 400]),
            "spec.overrides[0]: 'data.max_prompt_length=",
            id="400-digit-integer",
        ),
        pytest.param(
            spec(overrides=["data.max_prompt_length=" + "9" * 30]),
            "spec.overrides[0] (data.max_prompt_length): a 30-digit integer is outside the supported range",
            id="30-digit-integer",
        ),
        pytest.param(
            spec(overrides=["trainer.logger=" + "[" * 50000 + "]" * 50000]),
            f"spec.overrides[0]: String should have at most {limits.MAX_OVERRIDE_LENGTH} characters",
            id="50000-nested-brackets",
        ),
        pytest.param(
            spec(overrides=["trainer.logger=" + "[" * 1000 + "]" * 1000]),
            "lists nested deeper than 16 levels",
            id="1000-nested-brackets",
        ),
        pytest.param(
            spec(overrides=["trainer.experiment_name=" + "a" * 1_000_000]),
            "spec.overrides[0]: String should have at most",
            id="1MB-override",
        ),
        pytest.param(
            spec(overrides=[f"trainer.seed={i}" for i in range(limits.MAX_OVERRIDES + 1)]),
            f"spec.overrides: List should have at most {limits.MAX_OVERRIDES} items",
            id="too-many-overrides",
        ),
        pytest.param(
            spec(overrides=["trainer.nnodes=0"]),
            "(trainer.nnodes): 0 is outside the supported range 1 to",
            id="nnodes-zero",
        ),
        pytest.param(
            spec(resources={"gpus": 16}, overrides=["trainer.n_gpus_per_node=0"]),
            "(trainer.n_gpus_per_node): 0 is outside the supported range 1 to",
            id="gpus-per-node-zero",
        ),
        pytest.param(
            spec(overrides=["critic.ulysses_sequence_parallel_size=-3"]),
            "is outside the supported range 1 to",
            id="critic-sp-negative",
        ),
        # Pass-through quantities that used to fail only at pod creation, for ever.
        pytest.param(
            spec(resources=resources(cpuPerNode="lots")),
            "spec.resources.cpuPerNode: String should match pattern",
            id="cpu-lots",
        ),
        pytest.param(
            spec(resources=resources(memoryPerNode="-5Gi")),
            "spec.resources.memoryPerNode: String should match pattern",
            id="memory-negative",
        ),
        pytest.param(
            spec(resources=resources(shmSize="infinite")),
            "spec.resources.shmSize: String should match pattern",
            id="shm-infinite",
        ),
        # Found by the fuzz run: a shape whose head dimension rounds to 0 divided by zero in the KV estimate.
        pytest.param(
            spec(
                model={
                    "path": "my-org/tiny",
                    "shape": {
                        "layers": 2,
                        "hiddenSize": 3,
                        "attentionHeads": 14,
                        "kvHeads": 2,
                        "intermediateSize": 8,
                        "vocabSize": 100,
                        "maxPositionEmbeddings": 4096,
                    },
                }
            ),
            "spec.model.shape.hiddenSize: hiddenSize 3 / attentionHeads 14 = 0",
            id="head-dim-zero",
        ),
        # Quantities are parsed exactly and bounded (they used to overflow a float, or reach the pod as 10e399).
        pytest.param(
            spec(resources=resources(memoryPerNode="1e400")),
            "spec.resources.memoryPerNode: 1e400 is too large",
            id="memory-1e400",
        ),
        pytest.param(
            spec(resources=resources(cpuPerNode="1e400")),
            "spec.resources.cpuPerNode: 1e400 is too large",
            id="cpu-1e400",
        ),
        pytest.param(
            spec(resources=resources(shmSize="1e400")),
            "spec.resources.shmSize: 1e400 is too large",
            id="shm-1e400",
        ),
        pytest.param(
            spec(resources=resources(memoryPerNode="99999999999999999999Ei")),
            "spec.resources.memoryPerNode: 99999999999999999999Ei is more than 1Pi (bytes)",
            id="memory-past-int64",
        ),
        pytest.param(
            spec(resources=resources(cpuPerNode="100000")),
            "spec.resources.cpuPerNode: 100000 is more than 65536 (CPU cores)",
            id="cpu-past-the-bound",
        ),
        pytest.param(
            spec(resources=resources(cpuPerNode="0")),
            "spec.resources.cpuPerNode: 0 must be more than 0",
            id="cpu-0",
        ),
        pytest.param(
            spec(resources=resources(shmSize="1e1.5")),
            "spec.resources.shmSize: '1e1.5' is not a Kubernetes quantity",
            id="shm-fractional-exponent",
        ),
        # Pass-through fields in the project's words, with the user's path (not the client library's env.6).
        pytest.param(
            spec(env=[{"name": "A", "value": 5}]),
            "spec.env[0].value: Input should be a valid string",
            id="env-int",
        ),
        pytest.param(spec(env=[{"value": "x"}]), "spec.env[0].name: Field required", id="env-no-name"),
        pytest.param(
            spec(env=[{"name": "A", "valu": "x"}]),
            "spec.env[0].valu: Extra inputs are not permitted",
            id="env-typo",
        ),
        pytest.param(
            spec(security={"containerSecurityContext": {"privileged": "true"}}),
            "spec.security.containerSecurityContext.privileged: Input should be a valid boolean",
            id="privileged-string",
        ),
        pytest.param(
            spec(security={"containerSecurityContext": {"capabilities": {"add": "SYS_ADMIN"}}}),
            "spec.security.containerSecurityContext.capabilities.add: Input should be a valid list",
            id="capabilities-add-string",
        ),
        pytest.param(
            spec(security={"podSecurityContext": {"runAsUser": "1000"}}),
            "spec.security.podSecurityContext.runAsUser: Input should be a valid integer",
            id="run-as-user-string",
        ),
        pytest.param(
            spec(security={"podSecurityContext": {"seccompProfile": {"type": "unconfined"}}}),
            "spec.security.podSecurityContext.seccompProfile.type: Input should be",
            id="seccomp-type-misspelt",
        ),
        # Lists and strings bounded: 256 data paths of 3,500 characters (897 KB) used to be admitted.
        pytest.param(
            spec(
                data={
                    "trainBatchSize": 64,
                    "trainFiles": [f"/data/{'x' * 3500}-{i}.parquet" for i in range(256)],
                }
            ),
            "spec.data.trainFiles: List should have at most 128 items",
            id="256-long-data-paths",
        ),
        pytest.param(
            spec(data={"trainBatchSize": 64, "valFiles": ["/d/" + "x" * 1100]}),
            "spec.data.valFiles[0]: String should have at most 1024 characters",
            id="data-path-too-long",
        ),
        pytest.param(
            spec(resources=resources(nodeSelector={"k" * 400: "v"})),
            "String should have at most 317 characters",
            id="node-selector-key-too-long",
        ),
        # Deep nesting inside a pass-through object.
        pytest.param(
            spec(env=[{"name": "X", "value": "1", "extra": nested(5000)}]),
            "spec: the operator could not check this spec (RecursionError",
            id="env-nested-5000",
        ),
    ],
)
def test_hostile_spec_is_a_violation_naming_the_field(doc: dict[str, Any], fragment: str) -> None:
    problems = admission_problems(doc, None, NODES)
    assert any(fragment in p for p in problems), problems


@pytest.mark.parametrize(
    "quantity", ["16", "500m", "512Gi", "1.5", "1e3", "64Gi", "100M"], ids=lambda q: f"ok-{q}"
)
def test_valid_quantities_pass_the_schema(quantity: str) -> None:
    doc = spec(resources=resources(cpuPerNode=quantity, memoryPerNode=quantity, shmSize=quantity))
    assert not [p for p in admission_problems(doc, None, NODES) if "pattern" in p]


def test_a_plan_past_its_step_budget_is_too_large_to_plan() -> None:
    result = plan_job(VerlJobSpec.model_validate(spec()), NODES, budget=Budget(steps=3))
    [v] = result.violations
    assert (v.field, v.rule) == ("spec", "plan-too-large")
    assert "too large to plan: it needs more than 3 search steps" in v.message


# 72B on 64 L4s (24 GB): thousands of candidates before the answer (memory-train).
L4 = make_nodes(16, gpus=4, prefix="l4", product="NVIDIA-L4", memory_mib=23034)
LARGE_SEARCH = spec(
    model={"path": "Qwen/Qwen2.5-72B-Instruct"},
    data={"trainBatchSize": 720720, "maxResponseLength": 30000},
    rollout={"responsesPerPrompt": 16},
    resources={"gpus": 64},
)


def test_a_plan_past_the_webhook_deadline_is_too_large_to_plan() -> None:
    ticks = itertools.count()  # a clock that advances 0.1 s at each reading: the 0.8 s pass after 9 readings
    problems = admission_problems(LARGE_SEARCH, None, L4, clock=lambda: next(ticks) / 10)
    assert problems and "spec: the job is too large to plan: it did not finish in time" in problems[0]


def test_the_default_budget_covers_a_memory_bound_search() -> None:
    budget = Budget()
    result = plan_job(VerlJobSpec.model_validate(LARGE_SEARCH), L4, budget=budget)
    assert result.violations and result.violations[0].rule == "memory-train"
    assert 100 < budget.used < budget.steps


@pytest.mark.parametrize(
    ("loc", "path"),
    [
        pytest.param(("overrides", 3), "spec.overrides[3]", id="list-index"),
        pytest.param(("resources", "gpus"), "spec.resources.gpus", id="fields"),
        pytest.param(("env", 0, "name"), "spec.env[0].name", id="mixed"),
    ],
)
def test_field_path(loc: tuple[int | str, ...], path: str) -> None:
    assert field_path(loc) == path


def test_too_deep_review_denies_with_the_request_uid() -> None:
    text = '{"apiVersion":"admission.k8s.io/v1","request":{"uid":"abc-123","object":' + "[" * 3000
    review = too_deep_review(text)
    assert review["response"]["uid"] == "abc-123"
    assert review["response"]["allowed"] is False
    assert "too deeply" in review["response"]["status"]["message"]


# The arithmetic: exact, and polynomial in the number of digits.


@given(st.integers(min_value=1, max_value=20000))
def test_divisors_match_trial_division(n: int) -> None:
    assert arith.divisors(n) == [d for d in range(1, n + 1) if n % d == 0]


@pytest.mark.parametrize(
    ("n", "factors"),
    [
        pytest.param(2**61 - 1, {2**61 - 1: 1}, id="mersenne-prime"),
        pytest.param(1000000007 * 998244353, {998244353: 1, 1000000007: 1}, id="two-large-primes"),
        pytest.param(1000003**2, {1000003: 2}, id="prime-square"),
        pytest.param(2**40 * 3**5, {2: 40, 3: 5}, id="smooth"),
    ],
)
def test_prime_factors_of_large_numbers(n: int, factors: dict[int, int]) -> None:
    assert arith.prime_factors(n) == factors
    assert math.prod(p**e for p, e in factors.items()) == n


@given(st.integers(min_value=1, max_value=3000), st.integers(min_value=1, max_value=300))
def test_nearest_multiple_matches_the_linear_scan(value: int, unit: int) -> None:
    assert arith.nearest_multiple(value, unit) == arith.nearest(value, lambda v: v % unit == 0, 10_000)


@given(st.integers(min_value=1, max_value=400), st.integers(min_value=1, max_value=2000))
def test_nearest_divisor_matches_the_linear_scan(value: int, n: int) -> None:
    assert arith.nearest_divisor(value, n) == arith.nearest(value, lambda v: n % v == 0, 10_000)


@given(
    st.integers(min_value=1, max_value=600),
    st.integers(min_value=1, max_value=16),
    st.integers(min_value=1, max_value=64),
)
def test_mini_batch_fallback_matches_the_linear_search(tb: int, n: int, dp: int) -> None:
    target = max(1, tb // 4)
    divs = [m for m in arith.divisors(tb) if (m * n) % dp == 0 and m * n >= dp]
    linear = [m for m in range(1, tb + 1) if (m * n) % dp == 0 and m * n >= dp]
    valid = divs or linear
    expected = [min(valid, key=lambda m: (abs(m - target), -m))] if valid else [target]
    assert mini_candidates(tb, n, dp, Fixed()) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("[" * 17 + "]" * 17, "lists nested deeper than 16 levels", id="deep-list"),
        pytest.param("9" * 41, "an integer of 41 digits is too long", id="long-integer"),
        pytest.param("-" + "9" * 5000, "an integer of 5000 digits is too long", id="python-int-limit"),
    ],
)
def test_parse_value_refuses(text: str, message: str) -> None:
    with pytest.raises(OverrideError, match=message):
        parse_value(text)


def test_parse_value_keeps_shallow_lists_and_long_enough_integers() -> None:
    assert parse_value("[[1,2],[3]]") == [[1, 2], [3]]
    assert parse_value("9" * 40) == int("9" * 40)


@pytest.mark.parametrize(
    ("path", "maximum"),
    [
        pytest.param(("resources", "gpus"), limits.MAX_GPUS, id="gpus"),
        pytest.param(("data", "trainBatchSize"), limits.MAX_BATCH, id="train-batch"),
        pytest.param(("data", "maxResponseLength"), limits.MAX_TOKENS, id="response-length"),
        pytest.param(("rollout", "responsesPerPrompt"), limits.MAX_ROLLOUT_N, id="responses-per-prompt"),
        pytest.param(("batching", "ppoMicroBatchSizePerGpu"), limits.MAX_BATCH, id="micro"),
    ],
)
def test_crd_carries_the_maxima(path: tuple[str, str], maximum: int) -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    section, name = path
    assert schema["properties"][section]["properties"][name]["maximum"] == maximum


def test_crd_bounds_the_overrides() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    overrides = schema["properties"]["overrides"]
    assert overrides["maxItems"] == limits.MAX_OVERRIDES
    assert overrides["items"]["maxLength"] == limits.MAX_OVERRIDE_LENGTH


# The CLI: exit 2 with one line, no traceback.


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(b"\xff\xfe spec: {}", "is not UTF-8 text (byte 0xff at offset 0)", id="not-utf8"),
        pytest.param(b"[" * 5000 + b"]" * 5000, "nests lists or mappings too deeply to read", id="deep-flow"),
        pytest.param(
            b"x:\n" + b"".join(b" " * (i + 1) + b"y:\n" for i in range(5000)),
            "nests lists or mappings too deeply to read",
            id="deep-block",
        ),
        pytest.param(b"a: 1\n---\nb: 2\n", "holds 2 YAML documents", id="two-documents"),
    ],
)
@pytest.mark.parametrize("command", ["plan", "render"])
def test_cli_bad_file_exits_2_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str, command: str
) -> None:
    job = tmp_path / "job.yaml"
    job.write_bytes(content)
    code = cli.main([command, "-f", str(job), "--nodes", "examples/clusters/dgx-h100.yaml"])
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err
    if command == "plan" or "documents" not in message:
        assert message in err, err


# Field names kubectl cannot misread.


def _property_names(schema: dict[str, Any], where: str = "spec") -> list[tuple[str, str]]:
    out = []
    for name, sub in (schema.get("properties") or {}).items():
        out.append((f"{where}.{name}", name))
        out += _property_names(sub, f"{where}.{name}")
    if "items" in schema:
        out += _property_names(schema["items"], f"{where}[]")
    return out


def test_no_field_name_is_a_yaml11_boolean() -> None:
    from verl_operator.crdgen import YAML11_BOOLS

    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    names = _property_names(schema)
    assert ("spec.spec.rollout.responsesPerPrompt", "responsesPerPrompt") in names
    assert [path for path, name in names if name in YAML11_BOOLS] == []


def test_the_old_rollout_n_key_is_an_unknown_field() -> None:
    problems = admission_problems(spec(rollout={"n": 4}), None, NODES)
    assert any(p.startswith("spec.rollout.n: Extra inputs are not permitted") for p in problems), problems


def test_responses_per_prompt_describes_verls_rollout_n() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert (
        "verl's rollout.n"
        in schema["properties"]["rollout"]["properties"]["responsesPerPrompt"]["description"]
    )


# Suspend is validated like any other update; pod-shaping fields are immutable while the job runs.


@pytest.mark.parametrize(
    ("new", "old", "fragments"),
    [
        pytest.param(
            spec(suspend=True, resources={"gpus": 10000, "gpusPerNode": 8}, overrides=["not an override"]),
            spec(),
            ["spec.overrides[0]: 'not an override'"],
            id="suspend-with-garbage",
        ),
        pytest.param(
            spec(suspend=True, resources={"gpus": 10000, "gpusPerNode": 8}),
            spec(),
            ["spec.resources.gpus: 10000 GPUs at 8 per node do not fit"],
            id="suspend-with-10000-gpus",
        ),
        pytest.param(
            spec(suspend=True, data={"trainBatchSize": 100}, rollout={"responsesPerPrompt": 1}),
            spec(suspend=True),
            ["use trainBatchSize 96 or 112"],
            id="edit-while-suspended",
        ),
        pytest.param(spec(suspend=True), spec(), [], id="suspend-only"),
        pytest.param(
            spec(resources={"gpus": 64}), spec(resources={"gpus": 64}, suspend=True), [], id="resume-only"
        ),
        pytest.param(
            spec(suspend=True, data={"trainBatchSize": 128}), spec(), [], id="suspend-with-valid-change"
        ),
    ],
)
def test_suspend_updates_are_validated(
    new: dict[str, Any], old: dict[str, Any], fragments: list[str]
) -> None:
    problems = admission_problems(new, old, NODES)
    if not fragments:
        assert problems == []
    for fragment in fragments:
        assert any(fragment in p for p in problems), problems


def test_every_pod_shaping_field_has_an_immutability_rule() -> None:
    from verl_operator.crdgen import MUTABLE_WHILE_RUNNING

    root = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    guarded = {
        r["fieldPath"] for r in root["x-kubernetes-validations"] if "cannot change while" in r["message"]
    }
    fields = set(root["properties"]["spec"]["properties"])
    assert guarded == {f".spec.{f}" for f in fields - MUTABLE_WHILE_RUNNING}
    assert {
        "suspend",
        "backoffLimit",
    } <= MUTABLE_WHILE_RUNNING and "resources" in fields - MUTABLE_WHILE_RUNNING


def _unbounded(node: dict[str, Any], where: str) -> list[str]:
    """The lists without maxItems and strings without maxLength (nor an enum) in a CRD schema node."""
    out: list[str] = []
    kind = node.get("type")
    if kind == "array":
        out += [] if "maxItems" in node else [where]
        out += _unbounded(node["items"], f"{where}[]")
    elif kind == "string" and "maxLength" not in node and "enum" not in node:
        out.append(where)
    for key, child in (node.get("properties") or {}).items():
        out += _unbounded(child, f"{where}.{key}")
    if isinstance(node.get("additionalProperties"), dict):
        out += _unbounded(node["additionalProperties"], f"{where}[*]")
    return out


def test_every_list_and_string_of_the_spec_is_bounded() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert _unbounded(schema, "spec") == []


def _largest(node: dict[str, Any]) -> int:
    """The most characters the typed strings under ``node`` can hold (free-form objects count nothing)."""
    kind = node.get("type")
    if kind == "array":
        return int(node["maxItems"]) * _largest(node["items"])
    if kind == "string":
        return int(node.get("maxLength", max((len(str(e)) for e in node.get("enum", [""])), default=0)))
    total = sum(_largest(child) for child in (node.get("properties") or {}).values())
    if isinstance(node.get("additionalProperties"), dict):
        total += int(node.get("maxProperties", 0)) * (
            limits.MAX_LABEL_KEY + _largest(node["additionalProperties"])
        )
    return total


def test_the_bounded_strings_of_a_spec_fit_far_below_etcds_limit() -> None:
    """etcd refuses a request past 1.5 MiB: every typed string at its bound stays under 1.25 MiB, which leaves
    room for the free-form objects and the status."""
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert _largest(schema) < 1.25 * 2**20
