"""The typed ``status`` of a VerlJob: written only by the operator, parsed once per reconcile pass.

The CRD's status schema and the phase list are generated from these models (``make crds``; a unit test
fails when the checked-in CRD drifts). ``plan`` is the planner's :class:`~verl_operator.api.plan.Plan`, the
same value ``verl-operator plan -o json`` prints, so the reconciler, the launch spec and placement read it
typed instead of through hand-written dict readers.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, ValidationError
from pydantic.config import JsonDict

from verl_operator.api.plan import Plan, Violation
from verl_operator.api.spec import _Model

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


class Condition(_Model):
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


class ExcludedNode(_Model):
    """A node that could not take a pod of the job, and why."""

    node: str = Field(description="Node name.")
    reason: str = Field(description="Why it was excluded.")


class PlacementStatus(_Model):
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


class VerlJobStatus(_Model):
    """Observed state of a VerlJob, written by the operator only."""

    phase: Phase | None = Field(default=None, description="Lifecycle phase.")
    reason: str | None = Field(default=None, description="CamelCase reason of the current phase.")
    message: str | None = Field(default=None, description="Human readable detail of the current phase.")
    observed_generation: int | None = Field(default=None, description="Last metadata.generation acted on.")
    attempt: int = Field(default=0, description="Ray cluster incarnation (0-based; pods carry it).")
    restarts: int = Field(default=0, description="Restarts after failures, counted against backoffLimit.")
    mesh: str | None = Field(default=None, description="Parallel mesh, e.g. dp8 sp1 tp2 (tp = rollout TP).")
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
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Conditions in the metav1.Condition shape (Valid, Planned, Placed, Ready, Complete, "
        "Failed, Reconciling, Stalled).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )

    def condition(self, type_: str) -> Condition | None:
        """The condition of type ``type_``, if set."""
        return next((c for c in self.conditions if c.type == type_), None)

    @property
    def placed(self) -> bool:
        """True when ``placement`` belongs to the current attempt (the pods may be created)."""
        return self.placement is not None and self.placement.attempt == self.attempt


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
