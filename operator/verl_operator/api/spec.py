"""Pydantic models of the ``VerlJob`` custom resource (``verl-operator.io/v1alpha1``).

Conventions:
- camelCase on the wire (``trainBatchSize``), snake_case in Python (``train_batch_size``).
- Frozen and ``extra="forbid"``: an unknown field is an error, never silently dropped.
- ``None`` means "the planner decides"; a value means "pinned": validated, never silently changed.
- Pass-through Kubernetes objects (tolerations, volumes, env) are plain dicts: the API server validates
  them when the operator creates the pods.
- Every field has a description: the generated CRD carries it, so ``kubectl explain`` helps.

Past 400 lines on purpose: the whole spec, one small model per section (no logic beyond a few properties),
in the order the generated CRD lists them; a section that grows logic of its own moves to its own module
(as the status did, :mod:`verl_operator.api.status`).
"""

from __future__ import annotations

from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from verl_contract.launch_spec import DEFAULT_MODULE, MODULE_PATTERN
from verl_operator.api import limits as L
from verl_operator.api.base import ApiModel
from verl_operator.api.image_ref import image_problem
from verl_operator.api.quantity import Bounds, QuantityError, bounded_quantity
from verl_operator.api.settings_registry import SETTINGS

GROUP = "verl-operator.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "VerlJob"
PLURAL = "verljobs"

#: The verl release lines the planner knows the rules and config dialect of, oldest first.
#: "0.6" is the SPMD rollout era (``rollout.mode=sync``), "0.9" the server rollout era.
SUPPORTED_VERL_VERSIONS: tuple[str, ...] = ("0.6", "0.9")

VerlVersion = Literal["0.6", "0.9"]
#: Who places a job's pods: see :attr:`SchedulingSpec.gang`.
Gang = Literal["builtin", "kueue", "volcano"]

#: A path or file name (bounded: see ``limits``).
PathStr = Annotated[str, Field(max_length=L.MAX_PATH)]
#: A label value.
LabelValue = Annotated[str, Field(max_length=L.MAX_LABEL_VALUE)]
#: A raw verl override.
OverrideStr = Annotated[str, Field(max_length=L.MAX_OVERRIDE_LENGTH)]
#: A data file path or URL.
DataPath = Annotated[str, Field(max_length=L.MAX_DATA_PATH)]
#: A label key (``prefix/name``); a bound the webhook checks (a CRD schema cannot bound map keys).
LabelKey = Annotated[str, Field(min_length=1, max_length=L.MAX_LABEL_KEY)]
#: A short string inside a security context.
SecurityStr = Annotated[StrictStr, Field(min_length=1, max_length=L.MAX_SECURITY_STRING)]
#: A numeric user or group id.
Id = Annotated[StrictInt, Field(ge=0, le=L.MAX_ID)]


def _quantity(bounds: Bounds) -> AfterValidator:
    """Parse a quantity exactly (:mod:`verl_operator.api.quantity`) and keep it within ``bounds``."""

    def check(text: str) -> str:
        try:
            bounded_quantity(text, bounds)
        except QuantityError as exc:
            raise PydanticCustomError("quantity", str(exc)) from exc
        return text

    return AfterValidator(check)


def _image(text: str) -> str:
    """An image reference the kubelet parses (:mod:`verl_operator.api.image_ref`)."""
    problem = image_problem(text)
    if problem is not None:
        raise PydanticCustomError("image_reference", "{problem}", {"problem": problem})
    return text


_QUANTITY_TEXT = Field(max_length=L.MAX_QUANTITY, pattern=L.QUANTITY_PATTERN)
#: A Kubernetes resource quantity without a sign: the schema checks the grammar, the models the value.
Quantity = Annotated[str, _QUANTITY_TEXT]
CpuQuantity = Annotated[
    str, _QUANTITY_TEXT, _quantity(Bounds(Decimal(L.MAX_CPU_CORES), "CPU cores", shown=str(L.MAX_CPU_CORES)))
]
MemoryQuantity = Annotated[
    str, _QUANTITY_TEXT, _quantity(Bounds(Decimal(L.MAX_MEMORY_BYTES), "bytes", shown="1Pi"))
]


class Algorithm(StrEnum):
    """The RL algorithm (verl ``algorithm.adv_estimator``). ``ppo`` (GAE) brings a critic model."""

    GRPO = "grpo"
    PPO = "ppo"
    RLOO = "rloo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REMAX = "remax"
    GRPO_PASSK = "grpo_passk"

    @property
    def needs_critic(self) -> bool:
        return self is Algorithm.PPO


class VerlSpec(ApiModel):
    image: Annotated[str, AfterValidator(_image)] = Field(
        min_length=1,
        max_length=L.MAX_IMAGE,
        description=(
            "Container image with verl and the rollout engine (vLLM, SGLang or TensorRT-LLM): Python 3.10+, ray "
            "with pydantic 2 (ray[default]), verl, and nvidia-smi on GPU nodes. It needs no part of this project unless launcher is image."
        ),
    )
    version: VerlVersion = Field(
        default="0.9",
        description=(
            "verl release line inside the image; selects the config dialect and the rules. "
            "0.6 = SPMD rollout era (rollout.mode=sync), 0.9 = server rollout era (rollout.mode=async)."
        ),
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="Pull policy for the image (Kubernetes default when omitted)."
    )
    launcher: Literal["inject", "image"] = Field(
        default="inject",
        description=(
            "Where the Ray containers get verl-launcher. inject: an init container from the operator's image "
            "copies a self-contained launcher into the pod, which runs it with the image's python3 (any verl "
            "image works). image: the image has verl-launcher on PATH. With an operator that has no "
            "--launcher-image (run outside the cluster), inject behaves as image."
        ),
    )
    entrypoint: str = Field(
        default=DEFAULT_MODULE,
        min_length=1,
        max_length=L.MAX_MODULE,
        pattern=MODULE_PATTERN,
        description=(
            "The Python module verl runs (python3 -m <entrypoint>, an argv item, never a shell word): "
            "verl.trainer.main_ppo, or another trainer's main module such as "
            "verl.experimental.fully_async_policy.fully_async_main. A dotted module name."
        ),
    )
    trainer_mode: Literal["sync", "colocate_async", "separate_async"] | None = SETTINGS.field("trainer_mode")


class ModelShape(ApiModel):
    """Architecture numbers of the model (from its HF ``config.json``)."""

    model_type: str | None = Field(
        default=None, max_length=L.MAX_NAME, description="HF model_type, e.g. qwen2, llama, qwen3_moe."
    )
    layers: int = Field(ge=1, le=L.MAX_LAYERS, description="num_hidden_layers.")
    hidden_size: int = Field(ge=1, le=L.MAX_HIDDEN, description="hidden_size.")
    attention_heads: int = Field(ge=1, le=L.MAX_HEADS, description="num_attention_heads.")
    kv_heads: int = Field(
        ge=1, le=L.MAX_HEADS, description="num_key_value_heads (equal to attentionHeads without GQA)."
    )
    head_dim: int | None = Field(
        default=None, ge=1, le=L.MAX_HEADS, description="head_dim (default hiddenSize / attentionHeads)."
    )
    intermediate_size: int = Field(
        ge=1, le=16 * L.MAX_HIDDEN, description="intermediate_size of the dense MLP."
    )
    vocab_size: int = Field(ge=1, le=L.MAX_VOCAB, description="vocab_size.")
    max_position_embeddings: int = Field(
        ge=1, le=L.MAX_TOKENS, description="max_position_embeddings: the longest sequence."
    )
    tie_word_embeddings: bool = Field(default=False, description="tie_word_embeddings.")
    num_experts: int | None = Field(
        default=None, ge=1, le=L.MAX_EXPERTS, description="MoE: routed experts per layer."
    )
    num_experts_per_tok: int | None = Field(
        default=None, ge=1, le=L.MAX_EXPERTS, description="MoE: experts each token uses (top-k)."
    )
    moe_intermediate_size: int | None = Field(
        default=None, ge=1, le=L.MAX_HIDDEN, description="MoE: intermediate size of an expert."
    )
    shared_experts: int | None = Field(
        default=None, ge=0, le=L.MAX_EXPERTS, description="MoE: shared experts per layer."
    )
    first_k_dense_replace: int | None = Field(
        default=None, ge=0, le=L.MAX_LAYERS, description="MoE: leading dense layers."
    )
    kv_lora_rank: int | None = Field(
        default=None, ge=1, le=L.MAX_HIDDEN, description="MLA: kv_lora_rank (DeepSeek-V3 style)."
    )
    q_lora_rank: int | None = Field(default=None, ge=1, le=L.MAX_HIDDEN, description="MLA: q_lora_rank.")
    qk_rope_head_dim: int | None = Field(
        default=None, ge=1, le=L.MAX_HEADS, description="MLA: qk_rope_head_dim."
    )
    qk_nope_head_dim: int | None = Field(
        default=None, ge=1, le=L.MAX_HEADS, description="MLA: qk_nope_head_dim."
    )
    v_head_dim: int | None = Field(default=None, ge=1, le=L.MAX_HEADS, description="MLA: v_head_dim.")

    @property
    def effective_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.attention_heads


class ModelSpec(ApiModel):
    path: str = Field(
        min_length=1,
        max_length=L.MAX_PATH,
        description="HF model id or a path inside a mounted volume (actor_rollout_ref.model.path).",
    )
    shape: ModelShape | None = Field(
        default=None,
        description="Architecture numbers; optional when path names a model in the built-in catalog.",
    )
    dtype: Literal["bfloat16", "float16"] = Field(
        default="bfloat16",
        description=(
            "Compute dtype of training and rollout (verl's default bfloat16). bfloat16 needs GPUs of compute "
            "capability 8.0 or newer (vLLM refuses it below); float16 runs on V100 and T4 too."
        ),
    )


class CriticSpec(ApiModel):
    model: ModelSpec | None = Field(
        default=None,
        description=(
            "The critic's model (critic.model.path), for algorithm ppo; defaults to spec.model. Its shape "
            "sizes the critic's memory."
        ),
    )


class DataSpec(ApiModel):
    train_files: list[DataPath] = SETTINGS.field("train_files")
    val_files: list[DataPath] = SETTINGS.field("val_files")
    train_batch_size: int | None = SETTINGS.field("train_batch_size")
    max_prompt_length: int = SETTINGS.field("max_prompt_length")
    max_response_length: int = SETTINGS.field("max_response_length")
    mean_prompt_length: int | None = Field(
        default=None,
        ge=1,
        le=L.MAX_TOKENS,
        description=(
            "Mean prompt length of the data in tokens, for the memory estimate only: with padding removed "
            "(use_remove_padding) a micro-batch holds its sequences' real tokens. Omitted: the maximum."
        ),
    )
    mean_response_length: int | None = Field(
        default=None,
        ge=1,
        le=L.MAX_TOKENS,
        description=(
            "Mean response length in tokens the model is expected to generate, for the memory estimate only "
            "(as meanPromptLength). Omitted: the maximum, the worst case."
        ),
    )


class ResourcesSpec(ApiModel):
    gpus: int = Field(
        ge=1,
        le=L.MAX_GPUS,
        description=(
            "Total GPUs for the job (trainer.nnodes x trainer.n_gpus_per_node; with a standalone rollout pool, "
            "both pools' GPUs)."
        ),
    )
    gpus_per_node: int | None = SETTINGS.field("n_gpus_per_node")
    rollout_gpus: int | None = Field(
        default=None,
        ge=1,
        le=L.MAX_GPUS,
        description=(
            "GPUs of the standalone rollout pool, out of gpus (the trainer pool gets the rest), for the modes "
            "that have one (verl.trainerMode separate_async, the fully_async and one_step_off entry points): "
            "whole nodes of each pool, or both pools on one node. Omitted: the pool keys in overrides, else "
            "the planner splits the GPUs (a previous run's measured phase times, else its throughput model)."
        ),
    )
    gpu_product: str | None = Field(
        default=None,
        max_length=L.MAX_LABEL_VALUE,
        description="Required GPU product, as in the nvidia.com/gpu.product label (e.g. NVIDIA-H100-80GB-HBM3).",
    )
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=L.MAX_OBJECTS,
        description="Extra node labels every chosen node must carry.",
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=L.MAX_OBJECTS,
        description="Tolerations added to every pod (core/v1 Toleration).",
    )
    cpu_per_node: CpuQuantity | None = Field(
        default=None,
        description="CPU request of each Ray pod (default: enough for verl's placement group, 3 per GPU + 2).",
    )
    memory_per_node: MemoryQuantity | None = Field(
        default=None,
        description="Memory request of each Ray pod (e.g. 512Gi; default 16Gi per GPU); candidate nodes must offer it.",
    )
    shm_size: MemoryQuantity | None = Field(
        default=None, description="Size of the /dev/shm memory volume (default 64Gi)."
    )
    gpu_memory_mib: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,  # 1 TiB: far above any GPU (a B200 has 180 GiB)
        alias="gpuMemoryMiB",
        description=(
            "Memory of one GPU in MiB, for nodes whose labels do not say it (no nvidia.com/gpu.memory label "
            "and a product outside the built-in table, e.g. a bare nvidia.com/gpu=present node); a label wins."
        ),
    )


class RolloutSpec(ApiModel):
    # Rollout engines: vllm, sglang (both lines), trtllm (verl 0.9 only).
    name: Literal["vllm", "sglang", "trtllm"] | None = SETTINGS.field("rollout_name")
    mode: Literal["spmd", "server"] | None = Field(
        default=None,
        description="spmd (verl <= 0.6, rollout.mode=sync) or server (verl >= 0.7); defaults to the version's.",
    )
    responses_per_prompt: int | None = SETTINGS.field("rollout_n")
    tensor_parallel_size: int | None = SETTINGS.field("rollout_tp")
    gpu_memory_utilization: float | None = SETTINGS.field("gpu_memory_utilization")


class MegatronSpec(ApiModel):
    """The Megatron engine's parallel sizes: the planner chooses those left out."""

    tensor_parallel_size: int | None = SETTINGS.field("megatron_tp")
    pipeline_parallel_size: int | None = SETTINGS.field("megatron_pp")
    virtual_pipeline_parallel_size: int | None = SETTINGS.field("megatron_vpp")
    context_parallel_size: int | None = SETTINGS.field("megatron_cp")
    expert_parallel_size: int | None = SETTINGS.field("megatron_ep")
    expert_tensor_parallel_size: int | None = SETTINGS.field("megatron_etp")


class ParallelismSpec(ApiModel):
    sequence_parallel_size: int | None = SETTINGS.field("sequence_parallel_size")
    fsdp_size: int | None = SETTINGS.field("fsdp_size")
    # -- the Megatron engine --
    engine: Literal["fsdp", "megatron"] | None = SETTINGS.field("training_engine")
    megatron: MegatronSpec | None = Field(default=None, description=MegatronSpec.__doc__)


class BatchingSpec(ApiModel):
    ppo_mini_batch_size: int | None = SETTINGS.field("ppo_mini_batch_size")
    ppo_micro_batch_size_per_gpu: int | None = SETTINGS.field("ppo_micro_batch_size_per_gpu")
    log_prob_micro_batch_size_per_gpu: int | None = SETTINGS.field("log_prob_micro_batch_size_per_gpu")
    dynamic_batch_size: bool | None = SETTINGS.field("dynamic_batch_size")
    max_token_len_per_gpu: int | None = SETTINGS.field("max_token_len_per_gpu")


class OffloadSpec(ApiModel):
    params: bool | None = SETTINGS.field("param_offload")
    optimizer: bool | None = SETTINGS.field("optimizer_offload")


class PlacementSpec(ApiModel):
    nvlink: Literal["required", "preferred"] = Field(
        default="preferred",
        description="required: rollout TP and sequence-parallel groups must sit inside one NVLink domain.",
    )
    topology_key: str | None = Field(
        default=None,
        max_length=L.MAX_NAME,
        description="Node label that names a network domain (e.g. a rack or block label).",
    )
    topology_policy: Literal["required", "preferred"] | None = Field(
        default=None, description="required: all nodes in one topologyKey domain; preferred: try that first."
    )


class SchedulingSpec(ApiModel):
    queue_name: str | None = Field(
        default=None,
        max_length=L.MAX_LABEL_VALUE,
        description="Hand the job to Kueue: sets the kueue.x-k8s.io/queue-name label.",
    )
    scheduler: Literal["builtin", "volcano"] = Field(
        default="builtin", description="Gang placement: builtin (scheduling gates) or volcano (PodGroup)."
    )
    priority_class_name: str | None = Field(
        default=None, max_length=L.MAX_NAME, description="priorityClassName of the pods."
    )

    @property
    def gang(self) -> Gang:
        """Who places the pods, all or nothing (the one place this is decided).

        ``kueue`` when ``queueName`` is set (Kueue's pod-group integration admits and places them, whatever
        ``scheduler`` says), else ``volcano`` (a PodGroup and ``schedulerName: volcano``), else ``builtin``
        (the operator chooses the nodes and holds the pods by a scheduling gate until every one exists).
        """
        if self.queue_name is not None:
            return "kueue"
        return "volcano" if self.scheduler == "volcano" else "builtin"


class CheckpointSpec(ApiModel):
    dir: str | None = Field(
        default=None,
        max_length=L.MAX_PATH,
        description="Checkpoint directory on a mounted volume (trainer.default_local_dir).",
    )
    resume: bool = Field(
        default=True, description="Resume from the latest checkpoint on restart (resume_mode=auto)."
    )


class StallSpec(ApiModel):
    """When a running job counts as hung, and what the operator does then (docs/operator.md, "Progress")."""

    ray_forming_seconds: int = Field(
        default=900,
        ge=30,
        le=L.MAX_SECONDS,
        description="Pods run but the Ray cluster has not formed (every node joined and checked) after this long.",
    )
    verl_start_seconds: int = Field(
        default=600,
        ge=30,
        le=L.MAX_SECONDS,
        description="The Ray cluster formed but verl has not started after this long.",
    )
    first_step_seconds: int = Field(
        default=3600,
        ge=30,
        le=L.MAX_SECONDS,
        description="verl started (model load, rollout engine start-up, first generation) but logged no step after this long.",
    )
    step_factor: float = Field(
        default=5.0,
        ge=1.5,
        le=100.0,
        description="After the first step: no new step within stepFactor x the median recent step time is a stall.",
    )
    min_step_seconds: int = Field(
        default=900,
        ge=30,
        le=L.MAX_SECONDS,
        description="The floor of that deadline (a checkpoint or validation step takes longer than a step).",
    )
    action: Literal["none", "restart", "fail"] = Field(
        default="none",
        description=(
            "What a stall does besides the Stalled condition and a Warning event: none; restart (a new Ray "
            "cluster, counted against backoffLimit; verl resumes from its last checkpoint); fail."
        ),
    )


class MonitoringSpec(ApiModel):
    """How the operator follows a running job's steps (read from the head pod's progress endpoint)."""

    enabled: bool = Field(
        default=True, description="Read the head pod's progress endpoint into status.progress."
    )
    status_interval_seconds: int = Field(
        default=30,
        ge=5,
        le=L.MAX_SECONDS,
        description="At most one progress status write per job in this many seconds (conditions change at once).",
    )
    stall: StallSpec = Field(default_factory=StallSpec, description=StallSpec.__doc__)


class _PassThrough(BaseModel):
    """A core/v1 object passed to the pods: the fields the operator reads or that users get wrong are typed
    (strict: ``"true"`` is not a boolean, as for the API server), any other field is kept as written
    (``x-kubernetes-preserve-unknown-fields``) for the API server to judge in the dry run."""

    model_config = ConfigDict(
        frozen=True,
        extra="allow",
        alias_generator=to_camel,
        populate_by_name=False,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )

    def to_wire(self) -> dict[str, Any]:
        """The camelCase dict as written (unset fields left out, unknown fields kept)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


#: The profile types of seccomp and AppArmor.
ProfileType = Literal["RuntimeDefault", "Localhost", "Unconfined"]


class Capabilities(_PassThrough):
    add: list[SecurityStr] | None = Field(
        default=None, max_length=L.MAX_SECURITY_ITEMS, description="Capabilities to add (admin policy)."
    )
    drop: list[SecurityStr] | None = Field(
        default=None,
        max_length=L.MAX_SECURITY_ITEMS,
        description="Capabilities to drop, besides the default ALL (which stays unless the policy allows less).",
    )


class Profile(_PassThrough):
    """A seccomp or AppArmor profile."""

    type: ProfileType = Field(description="RuntimeDefault, Localhost or Unconfined (admin policy).")
    localhost_profile: SecurityStr | None = Field(default=None, description="The profile's file (Localhost).")


class SELinuxOptions(_PassThrough):
    user: SecurityStr | None = Field(default=None, description="SELinux user.")
    role: SecurityStr | None = Field(default=None, description="SELinux role.")
    type: SecurityStr | None = Field(
        default=None, description="SELinux type (spc_t is denied by the policy)."
    )
    level: SecurityStr | None = Field(default=None, description="SELinux level.")


class Sysctl(_PassThrough):
    name: SecurityStr = Field(description="The sysctl (the safe set unless the policy allows more).")
    value: Annotated[StrictStr, Field(max_length=L.MAX_SECURITY_STRING)] = Field(description="Its value.")


class _CommonSecurityContext(_PassThrough):
    run_as_user: Id | None = Field(default=None, description="UID the processes run as.")
    run_as_group: Id | None = Field(default=None, description="GID the processes run as.")
    run_as_non_root: StrictBool | None = Field(default=None, description="Refuse to start as root.")
    seccomp_profile: Profile | None = Field(default=None, description="The seccomp profile.")
    app_armor_profile: Profile | None = Field(default=None, description="The AppArmor profile.")
    se_linux_options: SELinuxOptions | None = Field(default=None, description="SELinux labels.")


class PodSecurityContext(_CommonSecurityContext):
    """core/v1 PodSecurityContext (typed fields; others kept for the API server)."""

    fs_group: Id | None = Field(default=None, description="Group that owns the pod's volumes.")
    supplemental_groups: list[Id] | None = Field(
        default=None, max_length=L.MAX_SECURITY_ITEMS, description="Extra groups of the processes."
    )
    sysctls: list[Sysctl] | None = Field(
        default=None, max_length=L.MAX_SECURITY_ITEMS, description="Namespaced sysctls (admin policy)."
    )


class ContainerSecurityContext(_CommonSecurityContext):
    """core/v1 SecurityContext (typed fields; others kept for the API server)."""

    privileged: StrictBool | None = Field(default=None, description="Privileged container (admin policy).")
    allow_privilege_escalation: StrictBool | None = Field(
        default=None, description="no_new_privs off (admin policy)."
    )
    read_only_root_filesystem: StrictBool | None = Field(
        default=None, description="Read-only root file system."
    )
    capabilities: Capabilities | None = Field(default=None, description="Capabilities to add and drop.")
    proc_mount: SecurityStr | None = Field(default=None, description="Default or Unmasked.")


class EnvVar(ApiModel):
    """core/v1 EnvVar: a name and either a value or a valueFrom source."""

    name: StrictStr = Field(min_length=1, max_length=L.MAX_NAME, description="The variable's name.")
    value: Annotated[StrictStr, Field(max_length=L.MAX_ENV_VALUE)] | None = Field(
        default=None, description="Its value (a string: quote numbers and booleans)."
    )
    value_from: dict[str, Any] | None = Field(
        default=None, description="core/v1 EnvVarSource: a Secret, ConfigMap, field or resource reference."
    )


class SecuritySpec(ApiModel):
    """How the Ray pods run. The defaults pass Pod Security ``restricted`` except ``runAsNonRoot``, which
    depends on the image's user: set ``podSecurityContext.runAsNonRoot: true`` (and ``runAsUser``) for an
    image that runs as a non-root user."""

    service_account_name: str | None = Field(
        default=None,
        max_length=L.MAX_NAME,
        description=(
            "ServiceAccount of the Ray pods. Default: <job>-ray, created by the operator with no permissions "
            "(never the namespace's default ServiceAccount)."
        ),
    )
    automount_service_account_token: bool = Field(
        default=False,
        description="Mount the ServiceAccount's API token in the Ray pods (verl and Ray need none).",
    )
    pod_security_context: PodSecurityContext = Field(
        default_factory=PodSecurityContext,
        description=(
            "core/v1 PodSecurityContext of the Ray pods, merged deeply over the default "
            "{seccompProfile: {type: RuntimeDefault}} (e.g. runAsNonRoot, runAsUser, runAsGroup, fsGroup)."
        ),
    )
    container_security_context: ContainerSecurityContext = Field(
        default_factory=ContainerSecurityContext,
        description=(
            "core/v1 SecurityContext of the Ray container, merged deeply over the default "
            "{allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}: capabilities.add adds to it, and "
            "drop: [ALL] stays unless the admin policy allows keeping capabilities."
        ),
    )


class VerlJobSpec(ApiModel):
    verl: VerlSpec = Field(description="The verl image and release line.")
    model: ModelSpec = Field(description="The policy model.")
    algorithm: Algorithm = SETTINGS.field("adv_estimator")
    data: DataSpec = Field(default_factory=DataSpec, description="Datasets and batch/length settings.")
    resources: ResourcesSpec = Field(description="GPUs and node selection.")
    rollout: RolloutSpec = Field(
        default_factory=RolloutSpec, description="Rollout settings (vLLM, SGLang or TensorRT-LLM)."
    )
    critic: CriticSpec = Field(default_factory=CriticSpec, description="The critic (algorithm ppo).")
    parallelism: ParallelismSpec = Field(default_factory=ParallelismSpec, description="Training parallelism.")
    batching: BatchingSpec = Field(default_factory=BatchingSpec, description="Mini/micro batch settings.")
    offload: OffloadSpec = Field(default_factory=OffloadSpec, description="CPU offload of actor/ref state.")
    placement: PlacementSpec = Field(
        default_factory=PlacementSpec, description="NVLink and network topology."
    )
    scheduling: SchedulingSpec = Field(
        default_factory=SchedulingSpec, description="Queueing and gang scheduling."
    )
    checkpoint: CheckpointSpec = Field(
        default_factory=CheckpointSpec, description="Checkpointing and resume."
    )
    overrides: list[OverrideStr] = Field(
        default_factory=list,
        max_length=L.MAX_OVERRIDES,
        description=(
            "Raw verl Hydra overrides as on verl's command line (key=value). Keys the planner owns are read "
            "as pinned inputs; a conflict with a structured field is a violation."
        ),
    )
    security: SecuritySpec = Field(
        default_factory=SecuritySpec, description="ServiceAccount and security contexts of the Ray pods."
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=L.MAX_ENV,
        description="Extra environment variables for the Ray pods (core/v1 EnvVar).",
    )
    volumes: list[dict[str, Any]] = Field(
        default_factory=list, max_length=L.MAX_OBJECTS, description="Extra pod volumes (core/v1 Volume)."
    )
    volume_mounts: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=L.MAX_OBJECTS,
        description="Mounts of those volumes in the Ray containers (core/v1 VolumeMount).",
    )
    suspend: bool = Field(
        default=False, description="true deletes the pods and keeps the job; false resumes."
    )
    backoff_limit: int = Field(
        default=0, ge=0, le=L.MAX_BACKOFF, description="Whole-cluster restarts allowed after a failure."
    )
    active_deadline_seconds: int | None = Field(
        default=None, ge=1, le=L.MAX_SECONDS, description="Fail the job when it has run longer than this."
    )
    start_deadline_seconds: int = Field(
        default=600,
        ge=1,
        le=L.MAX_SECONDS,
        description=(
            "Fail the job and give its GPUs back when a Ray container has waited this long with a transient "
            "start error (ErrImagePull, ImagePullBackOff, CreateContainerConfigError, CreateContainerError); "
            "an invalid image reference (InvalidImageName) fails it at once."
        ),
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=L.MAX_SECONDS,
        description="Delete the finished job this many seconds after it ends.",
    )
    monitoring: MonitoringSpec = Field(
        default_factory=MonitoringSpec,
        description="Progress in status.progress and stall detection (deadlines and the action).",
    )


class VerlJob(ApiModel):
    """A whole VerlJob object as read from YAML or the API server (status is ignored by the planner)."""

    api_version: Literal["verl-operator.io/v1alpha1"] = Field(
        default="verl-operator.io/v1alpha1", alias="apiVersion"
    )
    kind: Literal["VerlJob"] = Field(default="VerlJob")
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: VerlJobSpec
    status: dict[str, Any] | None = Field(default=None)
