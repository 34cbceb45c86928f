"""The progress document: what the head pod's launcher serves and the operator reads (docs/launch-contract.md).

The launcher in the head pod answers ``GET /progress`` on :data:`PROGRESS_PORT` with one
:class:`ProgressDocument`; the operator reads it from the head pod's IP (as KubeRay reads the Ray dashboard), so
no Ray pod needs any right on the Kubernetes API. Times are ages in seconds measured by the launcher, not
timestamps, so the two clocks need not agree. The document is bounded (:data:`MAX_BYTES`): at most
:data:`MAX_PHASES` phases and :data:`MAX_RECENT` recent steps.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

#: The head pod's port of the progress endpoint (Ray's dashboard is 8265).
PROGRESS_PORT = 8270
PROGRESS_PATH = "/progress"
#: The most bytes the operator reads of one answer, and the most the launcher sends.
MAX_BYTES = 32_768
MAX_PHASES = 32
MAX_RECENT = 16

#: Where the head is before its first step: the Ray cluster forming (pods run, Ray not formed), formed (verl
#: not started), verl started (no step yet), then stepping.
LaunchPhase = Literal["RayForming", "RayFormed", "VerlStarted", "Stepping", "Finished"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", alias_generator=to_camel, populate_by_name=True)


class StepSample(_Model):
    """One step's time and phase seconds (verl's ``timing_s/*``)."""

    step: int = Field(ge=0)
    seconds: float = Field(ge=0)
    phases: dict[str, float] = Field(default_factory=dict, max_length=MAX_PHASES)


class ProgressDocument(_Model):
    """The launcher's answer on ``GET /progress``."""

    launch_phase: LaunchPhase = Field(description="Where the head is (see LaunchPhase).")
    phase_age_seconds: float = Field(ge=0, description="Seconds since the head entered launch_phase.")
    step: int = Field(default=0, ge=0, description="The last step verl logged (0 before the first).")
    total_steps: int | None = Field(default=None, ge=0, description="verl's 'Total training steps'.")
    step_seconds: float | None = Field(default=None, ge=0, description="The last step's timing_s/step.")
    phases: dict[str, float] = Field(default_factory=dict, max_length=MAX_PHASES)
    throughput_per_gpu: float | None = Field(default=None, description="perf/throughput (tokens/s per GPU).")
    mfu: float | None = Field(default=None, description="perf/mfu/actor, where verl reports one in (0, 1].")
    last_step_age_seconds: float | None = Field(
        default=None, ge=0, description="Seconds since the last step."
    )
    last_output_age_seconds: float | None = Field(
        default=None, ge=0, description="Seconds since verl printed its last line."
    )
    recent: list[StepSample] = Field(default_factory=list, max_length=MAX_RECENT)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)
