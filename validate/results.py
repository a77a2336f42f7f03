"""What one launched layout measured (torch-free, so reports can be read anywhere).

Per rank: step times, peak tensor memory with its breakdown, bytes per collective per axis
for one step, and for pipeline layouts the F/B/W timestamps of one step with the action
order torch's schedule (and the planner's) lists for that rank. Collected over ranks:
the step time (per step the slowest rank, then the median over steps), memory (the max
over ranks), comm bytes per axis per rank per step, and the failures.
"""

from __future__ import annotations

import statistics
from typing import Literal

from pydantic import BaseModel, Field

from validate.spec import RunSpec


class CommRow(BaseModel):
    """One (axis, collective) of one rank's measured step (see :mod:`validate.instrument`)."""

    axis: str
    collective: str
    group_size: int
    calls: int
    bytes: int = Field(description="call-site buffer bytes summed over calls")
    sent_bytes: float = Field(description="bytes sent under the standard algorithms")


class PipelineEvent(BaseModel):
    kind: str
    microbatch: int
    stage: int
    start_s: float
    end_s: float


class RankResult(BaseModel):
    """Everything one rank reports."""

    rank: int
    step_times_s: list[float]
    peak_memory_bytes: int
    memory_breakdown_bytes: dict[str, int]
    comm: list[CommRow]
    losses: list[float | None] = Field(
        default_factory=list, description="this rank's loss in the first two steps (if it has one)"
    )
    reference_losses: list[float] | None = Field(
        None, description="the serial model's losses for the same two steps (rank 0)"
    )
    pipeline_events: list[PipelineEvent] = Field(default_factory=list)
    executed_order: list[tuple[str, int, int]] = Field(default_factory=list)
    torch_order: list[tuple[str, int, int]] | None = None
    planner_order: list[tuple[str, int, int]] | None = None

    def call_bytes_per_axis(self) -> dict[str, int]:
        """Call-site bytes per axis (receives left out: they are the peers' sends)."""
        totals: dict[str, int] = {}
        for row in self.comm:
            if row.collective != "recv":
                totals[row.axis] = totals.get(row.axis, 0) + row.bytes
        return totals

    def sent_bytes_per_axis(self) -> dict[str, float]:
        """Bytes this rank sends per axis under the standard algorithms."""
        totals: dict[str, float] = {}
        for row in self.comm:
            totals[row.axis] = totals.get(row.axis, 0.0) + row.sent_bytes
        return totals


class RankFailure(BaseModel):
    rank: int
    kind: Literal["error", "died", "hung", "aborted"]
    message: str


class RunResult(BaseModel):
    """One layout's run: its spec, the status, the per-rank results and the failures."""

    name: str
    spec: RunSpec
    status: Literal["ok", "failed", "timeout"]
    wall_s: float
    ranks: list[RankResult] = Field(default_factory=list)
    failures: list[RankFailure] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def step_time_s(self) -> float | None:
        """Median over timed steps of the slowest rank's step time."""
        if not self.ranks:
            return None
        per_step = [max(t) for t in zip(*(r.step_times_s for r in self.ranks), strict=True)]
        return statistics.median(per_step)

    def memory_bytes(self) -> int | None:
        return max((r.peak_memory_bytes for r in self.ranks), default=None)

    def comm_bytes_per_axis(self, busiest: bool = True) -> dict[str, float]:
        """Bytes sent per rank per step by axis (standard algorithms).

        ``busiest``: the maximum over ranks, as the planner reports it; else the mean.
        """
        per_rank = [rank.sent_bytes_per_axis() for rank in self.ranks]
        axes = sorted({axis for table in per_rank for axis in table})
        pick = max if busiest else statistics.fmean
        return {axis: pick([table.get(axis, 0.0) for table in per_rank]) for axis in axes}

    def loss_errors(self) -> list[float] | None:
        """Relative difference of the global loss from the serial model's, per checked step.

        Each rank holding a loss has the mean over its share of the tokens, and the shares
        are equal, so the global loss is the mean over those ranks.
        """
        reference = next((r.reference_losses for r in self.ranks if r.reference_losses), None)
        if reference is None:
            return None
        errors = []
        for step, expected in enumerate(reference):
            values = [r.losses[step] for r in self.ranks if len(r.losses) > step]
            values = [v for v in values if v is not None]
            if values:
                errors.append(abs(statistics.fmean(values) - expected) / expected)
        return errors
