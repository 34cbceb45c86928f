"""The second hostile-input campaign: the classes of "admitted means it runs" with values no earlier test
uses. Each table row is one case; a row of a refused input checks the rule, the field and the message, a row
of a valid input checks that it is planned. The campaign's counts are in docs/operator.md ("Admitted means
it runs", the campaigns).

1. Images the kubelet refuses or can never pull, and waiting reasons as the kubelet spells them.
2. Shapes megatron-core and vLLM split unevenly; Hydra's grammar (compared with hydra-core 1.3.2's own
   ``OverridesParser`` when the rows were written); overrides that undo a spec field.
3. Quota refusals the dry run meets: which object is in the way, and whether admission denies.
4. One GPU model in another label style (the cloud's instance type alone) pooled with the same GPUs.
5. Status fields other than the phase patched by hand: never acted on, derived again.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_nodes
from test_controller_forged_status import forge
from test_controller_pod_start import IMAGE, conditions, started, waiting
from test_controller_transitions import HEAD, RUNNING, SPEC, WORKER, World, pods_are, with_spec
from test_gpu_pools import H100_JOB, fill_dgx_nodes, fixture_nodes

from verl_operator.api.image_ref import image_problem
from verl_operator.api.plan import PlanResult
from verl_operator.api.spec import VerlJobSpec
from verl_operator.controller.podstart import STARTABLE
from verl_operator.controller.refused import ChildBlocked, classify
from verl_operator.planner.cluster import select
from verl_operator.planner.facts import node_facts
from verl_operator.planner.job import plan_job
from verl_operator.planner.overrides import OverrideError, parse_override

QWEN7B: dict[str, Any] = {
    "modelType": "qwen2",
    "layers": 28,
    "hiddenSize": 3584,
    "attentionHeads": 28,
    "kvHeads": 4,
    "headDim": 128,
    "intermediateSize": 18944,
    "vocabSize": 152064,
    "maxPositionEmbeddings": 32768,
}
MOE: dict[str, Any] = {
    **QWEN7B,
    "modelType": "qwen3_moe",
    "layers": 48,
    "hiddenSize": 2048,
    "attentionHeads": 32,
    "intermediateSize": 6144,
    "numExperts": 128,
    "numExpertsPerTok": 8,
    "moeIntermediateSize": 768,
}


# -- 1. images and waiting reasons ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("image", "problem"),
    [
        pytest.param("ghcr.io:99999/x/verl:1", "has port 99999, outside 1-65535", id="port-above-65535"),
        pytest.param("ghcr.io:65536/x/verl:1", "has port 65536", id="port-65536"),
        pytest.param("ghcr.io:0/x/verl:1", "has port 0", id="port-0"),
        pytest.param(
            "x/verl@sha256:" + "a" * 32, "sha256 digest has 32 hex digits, not 64", id="digest-short"
        ),
        pytest.param("x/verl@sha256:" + "a" * 63, "has 63 hex digits, not 64", id="digest-63"),
        pytest.param("x/verl@sha256:" + "A" * 64, "upper-case hex digits", id="digest-upper-case"),
        pytest.param(
            "x/verl@md5:" + "a" * 32, "algorithm 'md5' is not one the kubelet knows", id="digest-md5"
        ),
        pytest.param(
            "x/verl@sha512:" + "a" * 64, "sha512 digest has 64 hex digits, not 128", id="sha512-short"
        ),
        pytest.param(
            "f" * 64, "64 hex digits, which the kubelet reads as an image ID", id="image-id-as-name"
        ),
        pytest.param("ghcr.io//verl:1", "not a valid image path", id="double-slash-after-registry"),
        pytest.param("ghcr.io/x/verl:1:", "the tag ''", id="trailing-colon-after-tag"),
        pytest.param("localhost:/x:1", "the registry 'localhost:'", id="registry-trailing-colon"),
        pytest.param("ghcr..io/x:1", "the registry 'ghcr..io'", id="registry-empty-label"),
        pytest.param("-ghcr.io/x:1", "the registry '-ghcr.io'", id="registry-leading-dash"),
        pytest.param("ghcr.io/x/verl:1 ", "the tag '1 '", id="trailing-space"),
        pytest.param("ghcr.io/x/verl@", "the digest ''", id="empty-digest"),
        pytest.param("docker.io/Library/ubuntu", "use docker.io/library/ubuntu", id="upper-case-library"),
        pytest.param("ghcr.io/x/verl.:1", "not a valid image path", id="trailing-dot"),
        pytest.param("ghcr.io/x/ve___rl:1", "not a valid image path", id="triple-underscore"),
        pytest.param("x/verl:.1", "the tag '.1'", id="tag-leading-dot"),
        pytest.param("ghcr.io:443/x/verl:1", None, id="port-443"),
        pytest.param("x/verl:1@sha256:" + "b" * 64, None, id="tag-and-digest"),
        pytest.param("x/verl@sha512:" + "c" * 128, None, id="sha512"),
        pytest.param("f" * 64 + ":1", None, id="hex-name-with-tag"),
    ],
)
def test_images_the_kubelet_refuses_or_never_pulls(image: str, problem: str | None) -> None:
    found = image_problem(image)
    if problem is None:
        assert found is None, found
    else:
        assert found is not None and problem in found, found


@pytest.mark.parametrize(
    ("reason", "message", "condition", "permanent"),
    [
        pytest.param("ImageInspectError", "failed to inspect image", "ImagePullFailed", False, id="inspect"),
        pytest.param(
            "SignatureValidationFailed", "image signature not trusted", "InvalidImage", True, id="signature"
        ),
        pytest.param(
            "RunContainerError", 'exec: "verl-launcher": not found', "ContainerCreateFailed", False, id="run"
        ),
        pytest.param(
            "PreCreateHookError", "hook refused", "ContainerCreateFailed", False, id="pre-create-hook"
        ),
        pytest.param("RegistryUnavailable", "dial tcp: i/o timeout", "ImagePullFailed", False, id="registry"),
        pytest.param(
            "CreateContainerConfigError",
            "couldn't find key token in Secret team/hf",
            "ContainerConfigInvalid",
            False,
            id="missing-secret-key",
        ),
        pytest.param(
            "ErrImagePull",
            "pull access denied, repository does not exist",
            "ImagePullFailed",
            False,
            id="denied",
        ),
    ],
)
def test_waiting_reasons_as_the_kubelet_spells_them(
    reason: str, message: str, condition: str, permanent: bool
) -> None:
    world = started(with_spec(startDeadlineSeconds=120))
    waiting(world, WORKER, reason, message)
    world.reconcile()
    status = world.status()
    found = conditions(world)[STARTABLE]
    assert (found["status"], found["reason"]) == ("False", condition), found
    assert f"image {IMAGE}): {reason}: {message}" in found["message"]
    if permanent:
        assert (status["phase"], status["reason"]) == ("Failed", condition)
        assert world.kube.pods() == {}
    else:
        assert (status["phase"], status["reason"]) == ("Starting", condition)
        world.now += 120
        world.reconcile()
        assert (world.status()["phase"], world.status()["reason"]) == ("Failed", "StartDeadlineExceeded")
        assert world.kube.pods() == {}


# -- 2. shapes, Hydra's grammar, overrides that undo the spec ------------------------------------------------
def plan(sections: dict[str, Any], gpus: int = 8) -> PlanResult:
    doc: dict[str, Any] = {
        "verl": {"image": "example.com/verl:0.9.1"},
        "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
    }
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    spec = VerlJobSpec.model_validate({**doc, "resources": {"gpus": gpus}})
    return plan_job(spec, make_nodes(gpus // 8))


def shaped(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {"path": "/models/custom", "shape": {**base, **changes}}


def megatron(**sizes: int) -> dict[str, Any]:
    names = {"tp": "tensorParallelSize", "pp": "pipelineParallelSize", "vpp": "virtualPipelineParallelSize"}
    names |= {"ep": "expertParallelSize", "cp": "contextParallelSize"}
    return {"engine": "megatron", "megatron": {names[k]: v for k, v in sizes.items()}}


def refused(result: PlanResult, rule: str, field: str, *words: str) -> None:
    """The plan is refused by ``rule`` at ``field`` with every word in the message."""
    assert result.plan is None
    found = [v for v in result.violations if v.rule == rule]
    assert found, [v.one_line() for v in result.violations]
    assert found[0].field == field, found[0].one_line()
    for word in words:
        assert word in found[0].message, found[0].one_line()


SHAPES = [
    pytest.param(
        {"model": shaped(QWEN7B, intermediateSize=18946), "parallelism": megatron(tp=4)},
        ("megatron-tp-heads", "spec.parallelism.megatron.tensorParallelSize"),
        ["intermediateSize 18946 does not divide by TP 4 (18946 % 4 = 2)"],
        "use TP 2",
        id="ffn-vs-megatron-tp",
    ),
    pytest.param(
        {"model": shaped(QWEN7B, intermediateSize=18946), "rollout": {"tensorParallelSize": 4}},
        ("rollout-tp-heads", "spec.rollout.tensorParallelSize"),
        ["intermediateSize 18946 is not divisible by tensorParallelSize 4", "RowParallelLinear"],
        "use tensorParallelSize 2",
        id="ffn-vs-rollout-tp",
    ),
    pytest.param(
        {"model": shaped(QWEN7B, attentionHeads=24, kvHeads=3), "rollout": {"tensorParallelSize": 2}},
        ("rollout-tp-heads", "spec.rollout.tensorParallelSize"),
        ["3 KV heads neither divide by tensorParallelSize 2 nor divide it"],
        "use tensorParallelSize 1",
        id="kv-heads-vs-rollout-tp",
    ),
    pytest.param(
        {"model": shaped(QWEN7B, attentionHeads=20, kvHeads=4), "rollout": {"tensorParallelSize": 8}},
        ("rollout-tp-heads", "spec.rollout.tensorParallelSize"),
        ["20 attention heads are not divisible by tensorParallelSize 8"],
        "use tensorParallelSize 4",
        id="heads-vs-rollout-tp",
    ),
    pytest.param(
        {"model": shaped(MOE, numExperts=100), "parallelism": megatron(ep=8)},
        ("megatron-experts-divisible", "spec.parallelism.megatron.expertParallelSize"),
        ["100 experts do not divide by EP 8 (100 % 8 = 4)"],
        "use EP 5 or 10",
        id="experts-vs-ep",
    ),
    pytest.param(
        {"model": shaped(QWEN7B, layers=30), "parallelism": megatron(pp=2, vpp=4)},
        ("megatron-layers-divisible", "spec.parallelism.megatron.virtualPipelineParallelSize"),
        ["30 layers do not divide into PP 2 x VPP 4 = 8 stages"],
        "use VPP 3 or 5",
        id="layers-vs-pp-vpp",
    ),
    pytest.param(
        {"model": shaped(QWEN7B, kvHeads=56)},
        ("model-shape-kv-heads", "spec.model.shape.kvHeads"),
        ["attentionHeads 28 is not divisible by kvHeads 56"],
        "use kvHeads",
        id="kv-heads-above-heads",
    ),
    pytest.param(
        {"model": shaped(QWEN7B, maxPositionEmbeddings=512)},
        ("max-model-len", "spec.data.maxResponseLength"),
        ["exceeds the model's max_position_embeddings 512"],
        "maxPromptLength + maxResponseLength <= 512",
        id="positions-below-length",
    ),
    pytest.param({"model": shaped(QWEN7B), "rollout": {"tensorParallelSize": 4}}, None, [], "", id="ffn-ok"),
    pytest.param(
        {"model": shaped(MOE, numExperts=96), "parallelism": megatron(ep=8)}, None, [], "", id="ep-ok"
    ),
]


@pytest.mark.parametrize(("sections", "where", "words", "suggestion"), SHAPES)
def test_shapes_the_engines_split_unevenly(
    sections: dict[str, Any], where: tuple[str, str] | None, words: list[str], suggestion: str
) -> None:
    result = plan(sections)
    if where is None:
        assert result.plan is not None, [v.one_line() for v in result.violations]
        return
    refused(result, *where, *words)
    found = next(v for v in result.violations if v.rule == where[0])
    assert any(suggestion in s for s in found.suggestions), found.suggestions


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        pytest.param("trainer.project_name=${oc.env:USER}", "${oc.env:USER}", id="interpolation"),
        pytest.param("trainer.experiment_name=run_${now:%Y}", "run_${now:%Y}", id="interpolation-in-text"),
        pytest.param("trainer.experiment_name='it\\'s'", "it's", id="escaped-quote"),
        pytest.param('trainer.experiment_name="x=y"', "x=y", id="quoted-equal"),
        pytest.param("trainer.experiment_name=a\\,b", "a,b", id="escaped-comma"),
        pytest.param("trainer.experiment_name=a b", "a b", id="inner-space"),
        pytest.param("~trainer.logger=[console]", ["console"], id="delete-with-value"),
        pytest.param("trainer.logger=[[a]]", [["a"]], id="nested-list"),
        pytest.param("trainer.logger=[]", [], id="empty-list"),
        pytest.param("trainer.nnodes=int(1.5)", 1, id="int-of-float"),
        pytest.param("trainer.nnodes=int(true)", 1, id="int-of-bool"),
        pytest.param("trainer.nnodes=int([1,2])", [1, 2], id="int-of-list"),
        pytest.param("trainer.nnodes=int( 1 )", 1, id="cast-spaces"),
        pytest.param("trainer.val_before_train=bool(0)", False, id="bool-of-0"),
        pytest.param("trainer.logger=sort([b,a],reverse=true)", ["b", "a"], id="sort-reverse"),
        pytest.param("trainer.nnodes=0x10", "0x10", id="hex-is-a-string"),
        pytest.param("trainer.nnodes=01", "01", id="leading-zero-is-a-string"),
        pytest.param("trainer.nnodes=1.", 1.0, id="trailing-dot-float"),
        pytest.param("trainer.nnodes=NULL", None, id="upper-case-null"),
        pytest.param("trainer.nnodes=Infinity", "Infinity", id="infinity-is-a-string"),
        pytest.param("trainer.nnodes=", "", id="empty-value"),
        pytest.param("trainer.x={a b:1}", {"a b": 1}, id="dict-key-with-a-space"),
        pytest.param("trainer.x={ a  b : 1 }", {"a  b": 1}, id="dict-key-inner-spaces-kept"),
        pytest.param("trainer.x={a\tb:{c d:[e f]}}", {"a\tb": {"c d": ["e f"]}}, id="dict-key-with-a-tab"),
        pytest.param("trainer.x={a\\ b:1}", {"a b": 1}, id="dict-key-escaped-space"),
        pytest.param("trainer.x={1 2:3}", {"1 2": 3}, id="dict-key-of-two-numbers"),
    ],
)
def test_hydra_values_new_edges(raw: str, value: Any) -> None:
    assert parse_override(raw).value == value


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param("trainer.nnodes=str(1,2)", "str() of 2 values is a sweep", id="cast-of-two-is-a-sweep"),
        pytest.param("trainer.nnodes=int(1,2)", "int() of 2 values is a sweep", id="int-of-two"),
        pytest.param("trainer.val_before_train=bool(true,false)", "bool() of 2 values", id="bool-of-two"),
        pytest.param("trainer.nnodes=interval(1,2)", "interval(...) is a sweep", id="interval"),
        pytest.param("trainer.nnodes=int(null)", "int() of null", id="int-of-null"),
        pytest.param("trainer.nnodes=int(1,value=3)", "cannot use both", id="positional-and-named"),
        pytest.param("+++trainer.x=1", "is not a key", id="three-pluses"),
        pytest.param("trainer.logger=[console,]", "a value expected", id="list-trailing-comma"),
        pytest.param("trainer.x={a:1,}", "a dict key expected", id="dict-trailing-comma"),
        pytest.param("trainer..nnodes=1", "'.' at character 8", id="double-dot-key"),
        pytest.param(
            "trainer.x={a b.c:1}", "the dict key 'a b.c' is not a name", id="dict-key-space-and-dot"
        ),
        pytest.param("trainer.01=1", "not allowed in a key", id="leading-zero-key"),
        pytest.param("trainer.nnodes=1=2", "unexpected '=2'", id="second-equal"),
        pytest.param("trainer.experiment_name=a#b", "'#' at character 2", id="hash"),
        pytest.param("trainer.experiment_name=${", "unexpected '{'", id="open-interpolation"),
        pytest.param(" trainer.nnodes=1", "a space at character 1", id="leading-space"),
    ],
)
def test_hydra_refusals_new_edges(raw: str, message: str) -> None:
    with pytest.raises(OverrideError) as exc:
        parse_override(raw)
    assert message in str(exc.value)


CONFLICTS = [
    pytest.param(
        {"overrides": ["actor_rollout_ref.rollout.prompt_length=4096"]},
        ("rollout-prompt-length", "spec.overrides[0] (actor_rollout_ref.rollout.prompt_length)"),
        ["prompt_length 4096 exceeds maxPromptLength 512", "4096 + 512 = 4608"],
        id="rollout-prompt-length-above",
    ),
    pytest.param(
        {"overrides": ["actor_rollout_ref.rollout.max_model_len=128"]},
        ("max-model-len", "spec.overrides[0] (actor_rollout_ref.rollout.max_model_len)"),
        ["max_model_len 128 is below maxPromptLength 512"],
        id="max-model-len-below-prompt",
    ),
    pytest.param(
        {"overrides": ["actor_rollout_ref.rollout.pipeline_model_parallel_size=0"]},
        ("rollout-parallelism", "spec.overrides[0] (actor_rollout_ref.rollout.pipeline_model_parallel_size)"),
        ["makes it 0 GPUs"],
        id="rollout-pp-0",
    ),
    pytest.param(
        {"checkpoint": {"dir": "/ckpt"}, "overrides": ["trainer.default_local_dir=/scratch"]},
        ("override-conflict", "spec.checkpoint.dir"),
        ["spec.checkpoint.dir = '/ckpt' but spec.overrides[0] (trainer.default_local_dir) = '/scratch'"],
        id="checkpoint-dir",
    ),
    pytest.param(
        {"checkpoint": {"dir": "/ckpt"}, "overrides": ["trainer={default_local_dir:/scratch}"]},
        ("override-conflict", "spec.checkpoint.dir"),
        ["(trainer.default_local_dir, in trainer={...}) = '/scratch'"],
        id="checkpoint-dir-in-a-dict",
    ),
    pytest.param(
        {"checkpoint": {"dir": "/ckpt"}, "overrides": ["~trainer.default_local_dir"]},
        ("override-conflict", "spec.checkpoint.dir"),
        ["deletes trainer.default_local_dir, which the launcher sets from spec.checkpoint"],
        id="checkpoint-dir-deleted",
    ),
    pytest.param(
        {"checkpoint": {"dir": "/ckpt"}, "overrides": ["trainer.resume_mode=disable"]},
        ("override-conflict", "spec.checkpoint.resume"),
        ["every restart of the job would start over"],
        id="resume-disable",
    ),
    pytest.param(
        {"checkpoint": {"dir": "/ckpt", "resume": False}, "overrides": ["trainer.resume_mode=auto"]},
        ("override-conflict", "spec.checkpoint.resume"),
        ["the first attempt would resume from old checkpoints"],
        id="resume-auto-under-resume-false",
    ),
    pytest.param(
        {"overrides": ["actor_rollout_ref.model={path:/models/other}"]},
        ("override-conflict", "spec.model.path"),
        ["(actor_rollout_ref.model.path, in actor_rollout_ref.model={...}) = '/models/other'"],
        id="model-path-in-a-dict",
    ),
    pytest.param(
        {"rollout": {"name": "vllm"}, "overrides": ["actor_rollout_ref.rollout.name=sglang"]},
        ("override-conflict", "spec.rollout.name"),
        ["spec.rollout.name = 'vllm'"],
        id="rollout-name",
    ),
    pytest.param(
        {"rollout": {"responsesPerPrompt": 4}, "overrides": ["actor_rollout_ref.rollout.n=6"]},
        ("override-conflict", "spec.rollout.responsesPerPrompt"),
        ["= 4 but spec.overrides[0] (actor_rollout_ref.rollout.n) = 6"],
        id="rollout-n",
    ),
    pytest.param(
        {"data": {"maxPromptLength": 512}, "overrides": ["data.max_prompt_length=2048"]},
        ("override-conflict", "spec.data.maxPromptLength"),
        ["= 512 but spec.overrides[0] (data.max_prompt_length) = 2048"],
        id="data-prompt-length",
    ),
    pytest.param(
        {
            "rollout": {"gpuMemoryUtilization": 0.5},
            "overrides": ["actor_rollout_ref.rollout.gpu_memory_utilization=0.9"],
        },
        ("override-conflict", "spec.rollout.gpuMemoryUtilization"),
        ["= 0.5 but"],
        id="gpu-memory-utilization",
    ),
    pytest.param(
        {"overrides": ["trainer.nnodes=${trainer.n_gpus_per_node}"]},
        ("override-type", "spec.overrides[0] (trainer.nnodes)"),
        ["is not an integer"],
        id="nnodes-interpolation",
    ),
    pytest.param(
        {"overrides": ["trainer.nnodes=str(1)"]},
        ("override-type", "spec.overrides[0] (trainer.nnodes)"),
        ["'1' is not an integer"],
        id="nnodes-str-cast",
    ),
    pytest.param(
        {"overrides": ["trainer.n_gpus_per_node=float(8)"]},
        ("override-type", "spec.overrides[0] (trainer.n_gpus_per_node)"),
        ["8.0 is not an integer"],
        id="gpus-per-node-float-cast",
    ),
    pytest.param(
        {"model": {"dtype": "float16"}, "overrides": ["actor_rollout_ref.ref.fsdp_config.dtype=bf16"]},
        ("override-conflict", "spec.model.dtype"),
        ["(actor_rollout_ref.ref.fsdp_config.dtype) = 'bf16'"],
        id="ref-dtype-bf16",
    ),
    pytest.param(
        {"model": {"dtype": "bfloat16"}, "overrides": ["actor_rollout_ref.actor.fsdp_config.dtype=half"]},
        ("override-conflict", "spec.model.dtype"),
        ["= 'half'"],
        id="actor-dtype-half-under-bf16",
    ),
    pytest.param(
        {"model": {"dtype": "float16"}, "overrides": ["actor_rollout_ref.rollout={dtype:float32}"]},
        ("override-conflict", "spec.model.dtype"),
        ["(actor_rollout_ref.rollout.dtype, in actor_rollout_ref.rollout={...}) = 'float32'"],
        id="rollout-dtype-fp32-in-a-dict",
    ),
]


@pytest.mark.parametrize(("sections", "where", "words"), CONFLICTS)
def test_overrides_that_would_fail_at_start_or_undo_the_spec(
    sections: dict[str, Any], where: tuple[str, str], words: list[str]
) -> None:
    refused(plan(sections), *where, *words)


@pytest.mark.parametrize(
    ("sections", "emitted"),
    [
        pytest.param(
            {"overrides": ["actor_rollout_ref.rollout.prompt_length=256"]},
            "actor_rollout_ref.rollout.prompt_length=256",
            id="rollout-prompt-length-below",
        ),
        pytest.param(
            {"checkpoint": {"dir": "/ckpt"}, "overrides": ["trainer.default_local_dir=/ckpt/"]},
            "trainer.default_local_dir=/ckpt/",
            id="checkpoint-dir-same",
        ),
        pytest.param(
            {"checkpoint": {"dir": "/ckpt"}, "overrides": ["trainer.resume_mode=auto"]},
            "trainer.resume_mode=auto",
            id="resume-auto-under-resume",
        ),
        pytest.param({"overrides": ["trainer.nnodes=int('1')"]}, "trainer.nnodes=1", id="nnodes-int-cast"),
        pytest.param(
            {"overrides": ["actor_rollout_ref.rollout.max_model_len=1024"]},
            "actor_rollout_ref.rollout.max_model_len=1024",
            id="max-model-len-covers",
        ),
    ],
)
def test_the_nearest_valid_overrides_are_planned(sections: dict[str, Any], emitted: str) -> None:
    result = plan(sections)
    assert result.plan is not None, [v.one_line() for v in result.violations]
    assert emitted in result.plan.overrides


# -- 3. quota refusals ---------------------------------------------------------------------------------------
POD = {"kind": "Pod", "metadata": {"name": "j-r0-head", "namespace": "team"}}
CONFIGMAP = {"kind": "ConfigMap", "metadata": {"name": "j-launch", "namespace": "team"}}
SERVICE = {"kind": "Service", "metadata": {"name": "j-ray", "namespace": "team"}}


@pytest.mark.parametrize(
    ("manifest", "message", "blocker", "cause", "denies"),
    [
        pytest.param(
            POD,
            'pods "j-r0-head" is forbidden: failed quota: limits: must specify limits.cpu for: '
            "install-launcher,ray; limits.memory for: ray",
            "ResourceQuota team/limits",
            "requires every container to set what it limits (limits.cpu for: install-launcher,ray",
            True,
            id="limits-must-be-specified",
        ),
        pytest.param(
            CONFIGMAP,
            'configmaps "j-launch" is forbidden: exceeded quota: objs, requested: configmaps=1, used: '
            "configmaps=0, limited: configmaps=0",
            "ResourceQuota team/objs",
            "is exceeded",
            True,
            id="configmaps-0",
        ),
        pytest.param(
            SERVICE,
            'services "j-ray" is forbidden: exceeded quota: objs, requested: count/services=1, used: '
            "count/services=0, limited: count/services=0",
            "ResourceQuota team/objs",
            "is exceeded",
            True,
            id="count-services-0",
        ),
        pytest.param(
            POD,
            'pods "j-r0-head" is forbidden: exceeded quota: gpus, requested: limits.nvidia.com/gpu=8, used: '
            "limits.nvidia.com/gpu=8, limited: limits.nvidia.com/gpu=15",
            "ResourceQuota team/gpus",
            "is exceeded",
            False,
            id="limits-gpu-used-by-others",
        ),
        pytest.param(
            POD,
            'pods "j-r0-head" is forbidden: exceeded quota: eph, requested: requests.ephemeral-storage=20Gi, '
            "used: requests.ephemeral-storage=0, limited: requests.ephemeral-storage=10Gi",
            "ResourceQuota team/eph",
            "is exceeded",
            True,
            id="ephemeral-storage-below-the-pod",
        ),
    ],
)
def test_quota_refusals_name_the_quota(
    manifest: dict[str, Any], message: str, blocker: str, cause: str, denies: bool
) -> None:
    found = classify(403, message, manifest)
    assert isinstance(found, ChildBlocked)
    assert (found.blocker, found.denies_admission) == (blocker, denies)
    assert cause in found.cause


# -- 4. one GPU model in the instance-type style -------------------------------------------------------------
def node(name: str, labels: dict[str, str], gpus: int = 8) -> dict[str, Any]:
    allocatable = {"nvidia.com/gpu": str(gpus), "cpu": "96", "memory": "1Ti"}
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": "True"}]},
    }


@pytest.mark.parametrize(
    ("labels", "pooled"),
    [
        pytest.param({"node.kubernetes.io/instance-type": "p5.48xlarge"}, True, id="eks-p5"),
        pytest.param(
            {"node.kubernetes.io/instance-type": "Standard_ND96isr_H100_v5"}, True, id="aks-nd-h100-v5"
        ),
        pytest.param({"node.kubernetes.io/instance-type": "BM.GPU.H100.8"}, True, id="oci-bm-gpu-h100"),
        pytest.param({"cloud.google.com/gke-accelerator": "nvidia-h100-mega-80gb"}, True, id="gke-a3-mega"),
        pytest.param(
            {"nvidia.com/gpu.product": "nvidia-h100-80gb-hbm3"}, True, id="gfd-lower-case-no-memory"
        ),
        pytest.param(
            {"karpenter.k8s.aws/instance-gpu-name": "h100", "karpenter.k8s.aws/instance-gpu-memory": "81559"},
            True,
            id="karpenter-nvml-memory",
        ),
        pytest.param(
            {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": str(81559 << 20)},
            True,
            id="gfd-memory-in-bytes",
        ),
        pytest.param({"nvidia.com/gpu.product": "NVIDIA-H100-SXM5-80GB"}, True, id="pci-ids-name-sxm5"),
        pytest.param({"nvidia.com/gpu.product": "NVIDIA-H100-SXM-80GB"}, True, id="catalog-name-sxm"),
        pytest.param({"nvidia.com/gpu.product": "H100-80GB-SXM5"}, True, id="words-in-another-order"),
        pytest.param({"nvidia.com/gpu.product": "NVIDIA-H100-PCIe-80GB"}, False, id="pcie-is-another-part"),
        pytest.param(
            {"nvidia.com/gpu.product": "NVIDIA-H100-SXM5-94GB"}, False, id="sxm5-94gb-is-another-part"
        ),
        pytest.param({"beta.kubernetes.io/instance-type": "p5.48xlarge"}, True, id="beta-instance-type"),
        pytest.param(
            {"beta.kubernetes.io/instance-type": "Standard_ND96isr_H100_v5"},
            True,
            id="beta-instance-type-aks",
        ),
        pytest.param(
            {
                "node.kubernetes.io/instance-type": "p4d.24xlarge",
                "beta.kubernetes.io/instance-type": "p5.48xlarge",
            },
            False,
            id="the-new-instance-type-wins",
        ),
        pytest.param({"beta.kubernetes.io/instance-type": "m5.large"}, False, id="beta-no-gpu-instance-type"),
        pytest.param({"node.kubernetes.io/instance-type": "p4d.24xlarge"}, False, id="eks-p4d-is-an-a100"),
        pytest.param({"node.kubernetes.io/instance-type": "m5.large"}, False, id="no-gpu-instance-type"),
    ],
)
def test_one_gpu_model_is_one_pool_in_yet_another_label_style(labels: dict[str, str], pooled: bool) -> None:
    dgx = fixture_nodes("gpu-operator-dgx-h100", 1, "dgx")
    pools, excluded = select(
        [node_facts(n) for n in [*dgx, node("other", labels)]],
        VerlJobSpec.model_validate(
            {"verl": {"image": "x"}, "model": {"path": "Qwen/Qwen2.5-7B-Instruct"}, "resources": {"gpus": 16}}
        ),
    )
    together = [[n.name for n in p.nodes] for p in pools if "dgx-0" in [n.name for n in p.nodes]]
    assert (together == [["dgx-0", "other"]]) is pooled, (pools, excluded)


def test_idle_instance_type_h100s_take_a_job_while_the_gfd_ones_are_full() -> None:
    world = World(
        nodes=[
            *fixture_nodes("gpu-operator-dgx-h100", 2, "dgx"),
            node("p5-0", {"node.kubernetes.io/instance-type": "p5.48xlarge"}),
        ]
    )
    fill_dgx_nodes(world, 2)
    world.submit(H100_JOB)
    world.reconcile()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Starting", "Placed"), status["message"]
    assert status["placement"]["nodes"] == ["p5-0"]


# -- 5. forged status fields other than the phase ------------------------------------------------------------
def running_world(spec: dict[str, Any] = SPEC) -> World:
    world = World()
    world.submit(spec)
    for step in RUNNING:
        step(world)
    world.reconcile()
    assert world.status()["phase"] == "Running"
    return world


FORGED = [
    pytest.param(
        SPEC,
        {"placement": {"attempt": 0, "nodes": ["gpu-9", "gpu-8"], "gpusPerNode": 8, "ungated": True}},
        "status.placement.nodes gpu-9, gpu-8: the attempt's pods run on gpu-0, gpu-1",
        id="placement-nodes",
    ),
    pytest.param(
        with_spec(activeDeadlineSeconds=3600),
        {"startTime": "2020-01-01T00:00:00Z"},
        "status.startTime 2020-01-01T00:00:00Z: the job was created at",
        id="start-time-before-creation",
    ),
    pytest.param(
        with_spec(activeDeadlineSeconds=3600),
        {"startTime": "2031-01-01T00:00:00Z"},
        "status.startTime 2031-01-01T00:00:00Z",
        id="start-time-in-the-future",
    ),
    pytest.param(SPEC, {"restarts": 99}, "status.restarts 99: attempt 0", id="restarts"),
    pytest.param(
        SPEC,
        {"attempt": 1},
        "status.attempt 1: the placement and the running pods are attempt 0",
        id="attempt",
    ),
    pytest.param(
        SPEC,
        {"completionTime": "2027-01-15T08:00:00Z"},
        "status.completionTime",
        id="completion-time-running",
    ),
    pytest.param(SPEC, {"phase": "Pending", "reason": "QuotaExceeded"}, None, id="phase-pending"),
    pytest.param(SPEC, {"phase": "Suspended"}, None, id="phase-suspended"),
    pytest.param(SPEC, {"phase": "Invalid", "reason": "PodsRefused"}, None, id="phase-invalid"),
    pytest.param(
        SPEC,
        {
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "Forged",
                    "message": "x",
                    "lastTransitionTime": "2020-01-15T08:00:00Z",
                }
            ]
        },
        None,
        id="condition-failed",
    ),
    pytest.param(
        SPEC,
        {
            "conditions": [
                {
                    "type": STARTABLE,
                    "status": "False",
                    "reason": "ImagePullFailed",
                    "message": "x",
                    "lastTransitionTime": "2020-01-15T08:00:00Z",
                }
            ]
        },
        None,
        id="condition-startable-old",
    ),
]


@pytest.mark.parametrize(("spec", "forged", "event"), FORGED)
def test_a_forged_status_field_moves_nothing(
    spec: dict[str, Any], forged: dict[str, Any], event: str | None
) -> None:
    world = running_world(spec)
    pods = {name: pod["metadata"]["uid"] for name, pod in world.kube.pods().items()}
    forge(world, **forged)
    for _ in range(3):
        world.now += 30
        world.reconcile()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Running", "AllPodsRunning"), status["message"]
    assert {name: pod["metadata"]["uid"] for name, pod in world.kube.pods().items()} == pods
    assert status.get("restarts", 0) == 0 and "completionTime" not in status
    assert status["placement"]["nodes"] == ["gpu-0", "gpu-1"] and status["nodes"] == "gpu-0,gpu-1"
    assert status["startTime"] <= "2027-01-15T08:01:30Z"
    overwritten = [e[2] for e in world.kube.events if e[1] == "StatusOverwritten"]
    if event is not None:
        assert len(overwritten) == 1 and event in overwritten[0], overwritten


def test_a_forged_restart_count_leaves_the_backoff_limit_to_the_real_failures() -> None:
    world = running_world(with_spec(backoffLimit=2))
    forge(world, restarts=5)
    world.reconcile()
    pods_are("Failed", WORKER, exit_code=1)(world)
    world.reconcile()
    status = world.status()
    assert status["phase"] != "Failed", status["message"]
    assert status["restarts"] == 1 and HEAD not in world.kube.pods()


def test_a_start_time_within_the_clocks_allowance_is_the_operator_s() -> None:
    """A start a minute before the job's creation (another replica's clock behind the API server's) is not
    taken for a forged one: no event, the time kept."""
    world = running_world(with_spec(activeDeadlineSeconds=3600))
    forge(world, startTime="2027-01-15T07:59:00Z")
    world.now += 30
    world.reconcile()
    assert world.status()["startTime"] == "2027-01-15T07:59:00Z"
    assert not [e for e in world.kube.events if e[1] == "StatusOverwritten"]
