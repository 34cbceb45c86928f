"""What one reconcile pass observed: the input of every decision (``decide``, ``running``, ``kueue``).

In a module of its own so that the decision modules share it without importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_operator.api.status import VerlJobStatus
from verl_operator.controller.progress import ProgressReading, ProgressWriter
from verl_operator.controller.snapshot import Snapshot
from verl_operator.controller.status import format_time
from verl_operator.planner.facts import NodeFacts

Reservation = tuple[str, tuple[str, ...], int]


@dataclass(frozen=True)
class Observed:
    """What one pass read.

    Attributes:
        job: The VerlJob body (``metadata``, the raw ``spec``).
        status: Its ``status``, parsed once (:func:`verl_operator.api.status.parse_status`).
        pods: Every pod labelled with the job, as the watch cache holds them.
        snapshot: Nodes and GPU usage of the cluster.
        reserved: ``(job uid, nodes, GPUs per node)`` of every placed job, this process's decisions included.
        now: Seconds since the epoch at the start of the pass.
        launcher_image: The operator's image, for jobs whose Ray pods copy its launcher (None: none).
        node_states: For a placed job, each of its chosen nodes that is not Ready: ``deleted`` (gone from the
            node watch) or ``NotReady``.
        retry_now: Try a job whose pods could not be created again now, not at its retry time (an object
            that may have been in its way changed).
        workload: For a job handed to Kueue, the Workload of its current pod group when the pass read it
            (:func:`verl_operator.controller.kueue.wants_workload`); None otherwise.
        progress: For a Running job, what its head pod's progress endpoint said (None: not read).
        nodes: For a Running job, its nodes' facts (the advisor re-plans its advice on them).
        progress_writer: Who wrote ``status.progress`` (:data:`~verl_operator.controller.progress.ProgressWriter`):
            only the reconciling process's own is kept between two writes; another is replaced by the head
            pod's reading at once.
        fresh: ``pods`` were listed from the API server between two reads of ``job`` that found it unchanged
            (not from a watch cache): they are at least as new as ``status``, so they may prove it wrong
            (:func:`verl_operator.controller.derived.contradicted_attempt`).
    """

    job: Mapping[str, Any]
    status: VerlJobStatus
    pods: Sequence[Mapping[str, Any]] = ()
    snapshot: Snapshot = field(default_factory=lambda: Snapshot(nodes=(), pod_entries=(), reservations=()))
    reserved: Sequence[Reservation] = ()
    now: float = 0.0
    launcher_image: str | None = None
    node_states: Mapping[str, str] = field(default_factory=dict)
    retry_now: bool = False
    workload: Mapping[str, Any] | None = None
    progress: ProgressReading | None = None
    nodes: Sequence[NodeFacts] = ()
    progress_writer: ProgressWriter = "own"
    fresh: bool = False

    @property
    def generation(self) -> int:
        """``metadata.generation`` (1 when absent)."""
        return int(self.job["metadata"].get("generation", 1))

    @property
    def stamp(self) -> str:
        """``now`` as an RFC 3339 timestamp."""
        return format_time(self.now)
