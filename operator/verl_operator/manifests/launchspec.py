"""The job's launch spec (``launch.json``): the contract's :class:`~verl_contract.launch_spec.LaunchSpec`
filled from the plan, its placement and the VerlJob."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_contract.launch_spec import (
    API_VERSION,
    DEFAULT_MODULE,
    KIND,
    RAY_DASHBOARD_PORT,
    RAY_GCS_PORT,
    Checkpoint,
    Expect,
    HeadAddress,
    JobRef,
    LaunchSpec,
)
from verl_operator.api.plan import Plan
from verl_operator.api.spec import VerlJobSpec
from verl_operator.manifests.names import ChildNames
from verl_operator.planner.mesh import nvlink_group_per_node, pod_cpu
from verl_operator.planner.pools import megatron_config_name

#: Ray's client server port on the head (``ray://``); not part of the launch contract.
RAY_CLIENT_PORT = 10001
#: The self-contained launcher (a zipapp) inside the operator image, and where Ray pods get a copy of it.
LAUNCHER_IN_OPERATOR_IMAGE = "/opt/verl-operator/share/verl-launcher.pyz"
LAUNCHER_DIR = "/opt/verl-launcher"
LAUNCHER_PYZ = f"{LAUNCHER_DIR}/verl-launcher.pyz"
#: The interpreter verl runs with (the image's ``python3``) and ``-m``: the module follows.
PYTHON_MODULE = ("python3", "-m")
#: verl's Hydra config of the Megatron engine (the FSDP jobs use main_ppo's default, ppo_trainer).
MEGATRON_CONFIG_NAME = "ppo_megatron_trainer"


def entrypoint(training_engine: str, module: str = DEFAULT_MODULE) -> tuple[str, ...]:
    """verl's command: ``python3 -m <module>`` (``spec.verl.entrypoint``), with the module's Megatron config
    for the Megatron engine: ``--config-name=ppo_megatron_trainer``, or a recipe's own
    (``fully_async_ppo_megatron_trainer``, ``one_step_off_ppo_megatron_trainer``: ``planner/pools.py``)."""
    command = (*PYTHON_MODULE, module)
    if training_engine == "megatron":
        return (*command, f"--config-name={megatron_config_name(module)}")
    return command


#: Pod network interface of a standard Kubernetes pod; NCCL and Gloo otherwise may pick a wrong one
#: (verl issues #967, #597).
DEFAULT_NETWORK_ENV = {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}


@dataclass(frozen=True)
class LaunchPlan:
    """The parts of a plan and its placement that the children depend on.

    Attributes:
        verl_version: verl release line (``0.6`` / ``0.9``).
        nnodes: Ray pods (nodes).
        gpus_per_node: GPUs each pod holds.
        overrides: The full verl override list of the plan.
        nvlink_group_size: GPUs per NVLink group (1 = none required).
        nvlink_group_per_node: GPUs of each node in one NVLink group (the plan's; None: a plan of an earlier
            release, derived by the Mesh's rule).
        cpu_per_node: CPU request of each pod (the plan's; None: a plan of an earlier release, derived by the
            Mesh's rule from ``resources.cpuPerNode``).
        require_nvlink: ``spec.placement.nvlink == "required"``.
        gpu_product: GPU product of the plan's node pool, if known.
        gpu_memory_mib: GPU memory of the plan's node pool, if known.
        product_selector: The pool's product label as its nodes carry it (``NodePoolPlan.product_selector``).
        nodes: Chosen node names, index 0 hosts the head; empty when a scheduler of its own places the pods.
        launcher_image: The operator's image, whose launcher an init container copies into each Ray pod
            (``spec.verl.launcher: inject``); None runs ``verl-launcher`` from the job's image.
    """

    verl_version: str
    nnodes: int
    gpus_per_node: int
    overrides: tuple[str, ...]
    nvlink_group_size: int = 1
    nvlink_group_per_node: int | None = None
    cpu_per_node: str | None = None
    require_nvlink: bool = False
    gpu_product: str | None = None
    gpu_memory_mib: int | None = None
    product_selector: tuple[tuple[str, str], ...] = ()
    nodes: tuple[str, ...] = ()
    launcher_image: str | None = None
    #: The training engine (``Plan.training``): ``megatron`` runs verl's ppo_megatron_trainer config.
    training_engine: str = "fsdp"
    #: The rollout engine (``Plan.rollout.name``): ``vllm``, ``sglang`` or ``trtllm``.
    rollout_engine: str = "vllm"
    #: The Python module verl runs (``spec.verl.entrypoint``).
    module: str = DEFAULT_MODULE
    #: The pool(s) of each pod by index (:func:`pod_pools`); empty: a plan without pools.
    pools: tuple[str, ...] = ()

    @classmethod
    def from_plan(
        cls, plan: Plan, spec: VerlJobSpec, nodes: Sequence[str] = (), launcher_image: str | None = None
    ) -> LaunchPlan:
        """Build from the planner's plan; the GPU expectations come from the plan's node pool.

        The pool is what the plan was computed for, so ``launch.json`` does not change when a node leaves
        the cluster, and jobs placed by Kueue or Volcano (``nodes`` empty) get the same expectations.
        """
        pool = plan.node_pool
        return cls(
            verl_version=plan.verl_version,
            nnodes=plan.nnodes,
            gpus_per_node=plan.gpus_per_node,
            overrides=tuple(plan.overrides),
            nvlink_group_size=plan.nvlink_group_size,
            nvlink_group_per_node=plan.nvlink_group_per_node,
            cpu_per_node=plan.cpu_per_node,
            require_nvlink=spec.placement.nvlink == "required",
            gpu_product=pool.gpu_product or None,
            gpu_memory_mib=pool.gpu_memory_mib or None,
            product_selector=tuple(sorted(pool.product_selector.items())),
            nodes=tuple(nodes),
            launcher_image=launcher_image,
            training_engine=plan.training.engine if plan.training is not None else "fsdp",
            rollout_engine=plan.rollout.name,
            module=spec.verl.entrypoint,
            pools=pod_pools(plan),
        )

    @property
    def node_nvlink_group(self) -> int:
        """GPUs of each node in one NVLink group: what the launcher checks on every node."""
        if self.nvlink_group_per_node is not None:
            return self.nvlink_group_per_node
        return nvlink_group_per_node(self.nvlink_group_size, self.gpus_per_node)

    def cpu_request(self, spec: VerlJobSpec) -> str:
        """The CPU request of each pod: the plan's, else the Mesh's rule on ``resources.cpuPerNode``."""
        return self.cpu_per_node or pod_cpu(spec.resources.cpu_per_node, self.gpus_per_node)

    @classmethod
    def from_plan_json(
        cls,
        plan: Mapping[str, Any],
        spec: VerlJobSpec,
        nodes: Sequence[str] = (),
        launcher_image: str | None = None,
    ) -> LaunchPlan:
        """:meth:`from_plan` of the camelCase plan dict (``PlanResult.to_json_dict()["plan"]``)."""
        return cls.from_plan(Plan.model_validate(plan), spec, nodes, launcher_image)


def pod_pools(plan: Plan) -> tuple[str, ...]:
    """The pool(s) of each of the plan's pods, by index: a standalone rollout pool on nodes of its own takes the
    pods after the trainer pool's (placement puts the trainer's nodes first); ``both`` where a pod's GPUs
    serve the trainer and the rollout (a one-pool mode, or both pools on every node); empty without pools."""
    pools = plan.pools
    if pools is None:
        return ()
    if pools.rollout is None or pools.shared_nodes:
        return ("both",) * plan.nnodes
    trainer = min(pools.trainer.nnodes, plan.nnodes)
    return ("trainer",) * trainer + ("rollout",) * (plan.nnodes - trainer)


def job_identity(job: Mapping[str, Any]) -> tuple[str, str, str]:
    """``(name, namespace, uid)`` of a VerlJob body."""
    meta = job.get("metadata", {})
    return str(meta["name"]), str(meta.get("namespace") or "default"), str(meta.get("uid", ""))


def build_launch_spec(job: Mapping[str, Any], spec: VerlJobSpec, plan: LaunchPlan) -> LaunchSpec:
    """The job's launch spec; :meth:`LaunchSpec.to_json` is ``launch.json``.

    Args:
        job: The VerlJob body (metadata is read).
        spec: The parsed spec.
        plan: The plan and placement.

    Returns:
        The contract's model (the bootstrap deadlines are the contract's defaults).
    """
    name, namespace, uid = job_identity(job)
    return LaunchSpec(
        api_version=API_VERSION,
        kind=KIND,
        job=JobRef(name=name, namespace=namespace, uid=uid),
        verl_version=plan.verl_version,
        nnodes=plan.nnodes,
        gpus_per_node=plan.gpus_per_node,
        head=HeadAddress(
            host=ChildNames(name, namespace).head_host, port=RAY_GCS_PORT, dashboard_port=RAY_DASHBOARD_PORT
        ),
        entrypoint=entrypoint(plan.training_engine, plan.module),
        overrides=plan.overrides,
        env=dict(DEFAULT_NETWORK_ENV),
        expect=Expect(
            gpu_product=plan.gpu_product,
            gpu_memory_mib=plan.gpu_memory_mib,
            require_nvlink=plan.require_nvlink,
            # Per node: a group that spans nodes of one clique needs each node's GPUs linked.
            nvlink_group_size=plan.node_nvlink_group,
        ),
        checkpoint=Checkpoint(dir=spec.checkpoint.dir, resume=spec.checkpoint.resume),
    )
