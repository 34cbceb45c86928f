"""The typed ``status`` of a VerlJob: written only by the operator, parsed once per reconcile pass.

The CRD's status schema and the phase list are generated from these models (``make crds``; a unit test
fails when the checked-in CRD drifts). ``plan`` is the planner's :class:`~verl_operator.api.plan.Plan`, the
same value ``verl-operator plan -o json`` prints, so the reconciler, the launch spec and placement read it
typed instead of through hand-written dict readers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.config import JsonDict

from verl_operator.api.base import ApiModel
from verl_operator.api.plan import Plan, Violation

Phase = Literal["Invalid", "Pending", "Starting", "Running", "Succeeded", "Failed", "Suspended"]
ConditionStatus = Literal["True", "False", "Unknown"]
#: Who places the pods of an attempt when the operator does not: Kueue (queueName) or Volcano (PodGroup).
Handoff = Literal["Kueue", "Volcano"]

#: Every phase, in lifecycle order (the CRD's enum, the metrics' label values).
PHASES: tuple[str, ...] = get_args(Phase)
#: Phases after which nothing runs again (only cleanup and the TTL).
FINISHED_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed"})
#: Phases in which a placed job has (or is creating) Ray pods built from the current spec and holds
#: (reserves) its nodes' GPUs.
ACTIVE_PHASES: frozenset[str] = frozenset({"Starting", "Running"})

_TIME: JsonDict = {"format": "date-time"}


class Condition(ApiModel):
    """One condition in the ``metav1.Condition`` shape."""

    type: str = Field(description="Condition type.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None, description="metadata.generation the condition was computed for."
    )
    last_transition_time: str | None = Field(
        default=None, description="When status last changed.", json_schema_extra=_TIME
    )
    reason: str = Field(default="", description="CamelCase reason.")
    message: str = Field(default="", description="Human readable detail.")


class ExcludedNode(ApiModel):
    """A node that could not take a pod of the job, and why."""

    node: str = Field(description="Node name.")
    reason: str = Field(description="Why it was excluded.")


class PlacementStatus(ApiModel):
    """Where the current attempt runs: the chosen nodes, or the scheduler the placement was handed to."""

    attempt: int = Field(default=0, description="The attempt this placement is for.")
    nodes: list[str] = Field(
        default_factory=list, description="Chosen nodes, head first (empty on hand-off)."
    )
    gpus_per_node: int | None = Field(default=None, description="GPUs each pod holds on its node.")
    domain: str | None = Field(default=None, description="Topology domain the nodes share.")
    clique: str | None = Field(default=None, description="NVLink clique the nodes share.")
    message: str = Field(default="", description="The choice, in one line.")
    excluded: list[ExcludedNode] = Field(
        default_factory=list, description="Nodes that could not take a pod (the first ones)."
    )
    excluded_count: int = Field(default=0, description="How many nodes were excluded in all.")
    handoff: Handoff | None = Field(default=None, description="Kueue or Volcano when they place the pods.")
    ungated: bool = Field(
        default=False, description="Every pod of the attempt was created and released from its gate."
    )


#: The most phases status.progress lists (verl logs about a dozen).
MAX_PROGRESS_PHASES = 32


class ProgressColumns(ApiModel):
    """status.progress as kubectl's printer columns show it."""

    step: str = Field(default="", description="12/300 (the step, of the total when known).")
    step_time: str = Field(default="", description="The last step's time, e.g. 93.5s.")
    generation: str = Field(default="", description="The generation share of the step, e.g. 55%.")
    eta: str = Field(default="", description="The time left at the median recent step time, e.g. 7h47m.")


class ProgressAdvice(ApiModel):
    """The advisor's first change for the run (verl-operator advise), once enough steps are in."""

    setting: str = Field(description="A spec. path or a verl override key.")
    value: str = Field(description="The value, as JSON text.")
    reason: str = Field(description="Why, with the run's numbers.")


class ProgressStatus(ApiModel):
    """The running job's steps, read from the head pod's progress endpoint (written at most every
    spec.monitoring.statusIntervalSeconds)."""

    step: int = Field(default=0, description="The last step verl logged (0 before the first).")
    total_steps: int | None = Field(default=None, description="verl's total training steps.")
    step_seconds: float | None = Field(default=None, description="The last step's timing_s/step.")
    phases: dict[str, float] = Field(
        default_factory=dict,
        max_length=MAX_PROGRESS_PHASES,
        description="The last step's phase seconds by verl's timer name (gen, old_log_prob, ref, update_actor, ...).",
    )
    generation_share: float | None = Field(default=None, description="timing_s/gen / timing_s/step.")
    throughput_per_gpu: float | None = Field(default=None, description="perf/throughput: tokens/s per GPU.")
    mfu: float | None = Field(default=None, description="perf/mfu/actor where verl reports one in (0, 1].")
    eta_seconds: int | None = Field(
        default=None, description="Steps left x the median recent step time (null without a total)."
    )
    last_step_time: str | None = Field(
        default=None, description="When the last step was logged.", json_schema_extra=_TIME
    )
    updated_at: str | None = Field(
        default=None, description="When this was written.", json_schema_extra=_TIME
    )
    launch_phase: str | None = Field(
        default=None,
        description="RayForming, RayFormed, VerlStarted, Stepping or Finished (the head's launcher).",
    )
    columns: ProgressColumns = Field(default_factory=ProgressColumns, description=ProgressColumns.__doc__)
    advice: ProgressAdvice | None = Field(default=None, description=ProgressAdvice.__doc__)


class VerlJobStatus(ApiModel):
    """Observed state of a VerlJob, written by the operator only."""

    phase: Phase | None = Field(default=None, description="Lifecycle phase.")
    reason: str | None = Field(default=None, description="CamelCase reason of the current phase.")
    message: str | None = Field(default=None, description="Human readable detail of the current phase.")
    observed_generation: int | None = Field(default=None, description="Last metadata.generation acted on.")
    attempt: int = Field(default=0, description="Ray cluster incarnation (0-based; pods carry it).")
    restarts: int = Field(default=0, description="Restarts after failures, counted against backoffLimit.")
    mesh: str | None = Field(
        default=None,
        description="Parallel mesh: FSDP dp8 sp1 tp2 (tp = rollout TP), Megatron dp8 tp1 pp12 ep8 rollout-tp32.",
    )
    nodes: str | None = Field(default=None, description="Chosen nodes, comma separated (head first).")
    start_time: str | None = Field(
        default=None, description="When pods were first placed.", json_schema_extra=_TIME
    )
    completion_time: str | None = Field(
        default=None, description="When the job finished.", json_schema_extra=_TIME
    )
    plan: Plan | None = Field(
        default=None, description="The planner's plan (the JSON contract of `verl-operator plan -o json`)."
    )
    placement: PlacementStatus | None = Field(
        default=None,
        description="Chosen nodes, their domain/clique and the reasons other nodes were excluded.",
    )
    violations: list[Violation] | None = Field(
        default=None, description="Planner violations when the job is Invalid."
    )
    progress: ProgressStatus | None = Field(default=None, description=ProgressStatus.__doc__)
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Conditions in the metav1.Condition shape (Valid, Planned, Placed, Ready, Complete, "
        "Failed, Reconciling, Stalled, Progressing).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )

    def condition(self, type_: str) -> Condition | None:
        """The condition of type ``type_``, if set."""
        return next((c for c in self.conditions if c.type == type_), None)

    @property
    def placed(self) -> bool:
        """True when ``placement`` belongs to the current attempt (the pods may be created)."""
        return self.placement is not None and self.placement.attempt == self.attempt


class StatusChange(BaseModel):
    """The fields of a :class:`VerlJobStatus` one decision sets, typed and validated.

    Its fields are the status's own (the same names and types; a unit test keeps them equal), so a misspelt
    field or a value of the wrong type fails where the change is written (mypy, and ``ValidationError`` at
    construction), never silently in the status. Only the fields passed are changed (``None`` clears one).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    phase: Phase | None = None
    reason: str | None = None
    message: str | None = None
    observed_generation: int | None = None
    attempt: int = 0
    restarts: int = 0
    mesh: str | None = None
    nodes: str | None = None
    start_time: str | None = None
    completion_time: str | None = None
    plan: Plan | None = None
    placement: PlacementStatus | None = None
    violations: list[Violation] | None = None
    progress: ProgressStatus | None = None
    conditions: list[Condition] = Field(default_factory=list)

    def fields(self) -> dict[str, Any]:
        """The fields this change sets, by name (the values as given: typed models stay models)."""
        return {name: getattr(self, name) for name in self.model_fields_set}

    def __or__(self, other: StatusChange) -> StatusChange:
        """Both changes; ``other``'s fields win where both set one."""
        return StatusChange.model_construct(
            _fields_set=self.model_fields_set | other.model_fields_set, **{**self.fields(), **other.fields()}
        )

    def unplaced(self) -> StatusChange:
        """This change and the placement cleared (:data:`PLACEMENT_CLEARED`)."""
        return self | PLACEMENT_CLEARED

    def apply(self, status: VerlJobStatus) -> VerlJobStatus:
        """``status`` with this change's fields set."""
        return status.model_copy(update=self.fields())


#: The placement of the attempt dropped: no chosen nodes (a restart, a suspension, pods refused or blocked,
#: no capacity): the job holds no GPUs until it is placed again.
PLACEMENT_CLEARED = StatusChange(placement=None, nodes="")


class StatusView:
    """A thin typed reader of a raw ``status`` as the watch cache keeps it (JSON, for speed on the scale path):
    the few members the queue, the cache and the timers read, by the status model's own wire names, read once
    without parsing the whole status (its plan). :meth:`parsed` gives the full model when one is needed.

    Attributes:
        phase: ``status.phase``.
        reason: ``status.reason``.
        start_time: ``status.startTime`` (RFC 3339; None when unset).
        completion_time: ``status.completionTime`` (RFC 3339; None when unset).
        has_plan: A plan is recorded.
        has_placement: A placement is recorded (for any attempt, or a hand-off).
        placement_nodes: The placement's chosen nodes, head first (empty: none, or a hand-off).
        placement_gpus_per_node: GPUs each pod of the placement holds (0: unknown).
    """

    __slots__ = (
        "_raw",
        "completion_time",
        "has_placement",
        "has_plan",
        "phase",
        "placement_gpus_per_node",
        "placement_nodes",
        "reason",
        "start_time",
    )

    def __init__(self, raw: Mapping[str, Any] | None) -> None:
        doc: Mapping[str, Any] = raw or _EMPTY
        placement: Mapping[str, Any] = doc.get(_PLACEMENT) or _EMPTY
        self._raw = doc
        self.phase: Phase | None = doc.get(_PHASE)
        self.reason: str | None = doc.get(_REASON)
        self.start_time: str | None = doc.get(_START_TIME) or None
        self.completion_time: str | None = doc.get(_COMPLETION_TIME) or None
        self.has_plan = bool(doc.get(_PLAN))
        self.has_placement = bool(placement)
        self.placement_nodes: tuple[str, ...] = tuple(placement.get(_NODES) or ())
        self.placement_gpus_per_node = int(placement.get(_GPUS_PER_NODE) or 0)

    @classmethod
    def of(cls, job: Mapping[str, Any]) -> StatusView:
        """The view of a VerlJob body's ``status``."""
        return cls(job.get("status"))

    def parsed(self) -> VerlJobStatus:
        """The whole status, parsed (:func:`parse_status`)."""
        return parse_status(dict(self._raw))


def _wire(model: type[BaseModel], name: str) -> str:
    """The wire (camelCase) name of ``model``'s field ``name`` (a KeyError when the field is renamed)."""
    return model.model_fields[name].alias or name


_EMPTY: Mapping[str, Any] = {}
_PHASE = _wire(VerlJobStatus, "phase")
_REASON = _wire(VerlJobStatus, "reason")
_START_TIME = _wire(VerlJobStatus, "start_time")
_COMPLETION_TIME = _wire(VerlJobStatus, "completion_time")
_PLAN = _wire(VerlJobStatus, "plan")
_PLACEMENT = _wire(VerlJobStatus, "placement")
_NODES = _wire(PlacementStatus, "nodes")
_GPUS_PER_NODE = _wire(PlacementStatus, "gpus_per_node")


def parse_status(raw: dict[str, Any] | None) -> VerlJobStatus:
    """Parse ``status`` as read from the API server, never failing.

    A member that does not parse (written by another version, or edited by hand) is dropped and the rest
    kept: a bad ``plan`` means the job is planned again; ``attempt`` and ``restarts`` survive.

    Args:
        raw: The ``status`` object, or None.

    Returns:
        The typed status.
    """
    doc = dict(raw or {})
    for _ in range(len(doc) + 1):
        try:
            return VerlJobStatus.model_validate(doc)
        except ValidationError as exc:
            bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
            if not bad & set(doc):
                break
            doc = {k: v for k, v in doc.items() if k not in bad}
    return VerlJobStatus()
