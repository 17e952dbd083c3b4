"""The always-on step-time summary: rank 0 sends one every N steps (eroica.collector.sink), the
service stores it and reads a job's slowdowns from it while no window is open."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from eroica.schema.patterns import MAX_STEP, MAX_WORLD_SIZE

Step = Field(ge=0, le=MAX_STEP)


class StepSeriesSummary(BaseModel):
    """One summary of the job's always-on step-time series (rank 0 sends one every N steps)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    first_step: int = Step
    last_step: int = Step
    median_seconds: float = Field(gt=0, lt=86400)
    p90_seconds: float = Field(gt=0, lt=86400)
    world_size: int = Field(ge=1, le=MAX_WORLD_SIZE)

    @model_validator(mode="after")
    def _ordered(self) -> StepSeriesSummary:
        if self.last_step < self.first_step:
            raise ValueError(f"last_step {self.last_step} is before first_step {self.first_step}")
        return self
