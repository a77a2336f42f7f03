"""A schedule generated, simulated and packaged for printing and plotting: what
``llmplan schedule`` shows (:func:`schedule_report`), with uniform stages or per-stage times."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

from planner.pipeline.schedules.registry import generate_schedule, get_schedule
from planner.pipeline.simulate import PerStage, simulate


class TimelineRow(BaseModel):
    """One executed action, as the JSON timeline lists it."""

    rank: int
    stage_index: int
    microbatch: int
    action: str
    start: float
    end: float


class ScheduleReport(BaseModel):
    """A schedule simulated with uniform stages: what ``llmplan schedule`` prints and draws."""

    schedule: str
    pp: int
    microbatches: int
    vpp: int
    step_time: float
    bubble_time: float
    bubble_fraction: float
    peak_activations: list[float]
    parameter_copies: int
    timeline: list[TimelineRow]
    #: Megatron-style bubble over the busiest rank's busy time, (p−1)/m for 1F1B.
    bubble_ratio: float
    #: Longest single-rank span: the step time when ranks may start the next step skewed.
    pipelined_step_time: float
    #: Bubble in that span, the zero-bubble paper's measure (post-validated optimizer step,
    #: Qi et al. §4); ``bubble_time`` is the synchronous step's (every rank waits for all).
    pipelined_bubble_time: float = 0.0
    #: Per rank, micro-batches past B still waiting for W (the zero-bubble paper's M_W).
    peak_weight_pending: list[float]


def schedule_report(
    schedule: str,
    pp: int,
    num_microbatches: int,
    vpp: int | None = None,
    f: PerStage = 1.0,
    b: PerStage = 1.0,
    w: PerStage = 1.0,
    comm: PerStage = 0.0,
    overlap_fb: float = 0.0,
    **options: int,
) -> ScheduleReport:
    """Generate ``schedule``, simulate it and package the result for printing and plotting.

    A number for ``f``, ``b``, ``w`` is the time of one micro-batch through one rank's whole
    share of layers, and each chunk takes its ``1/vpp`` (DualPipe's chunks are whole
    shares); an array gives each stage's own chunk time as it is. ``options`` go to the
    generator (``microbatch_group_size`` for interleaved-1f1b).
    """
    spec = get_schedule(schedule)
    vpp = spec.resolve_vpp(vpp)
    actions = generate_schedule(schedule, pp, num_microbatches, vpp, **options)
    chunks = spec.chunks_per_rank(vpp)

    def per_chunk(value: PerStage) -> PerStage:
        return value / chunks if np.ndim(value) == 0 else value

    simulation = simulate(
        actions,
        per_chunk(f),
        per_chunk(b),
        per_chunk(w),
        comm,
        overlap_fb,
        activation_share=1.0 / chunks,
        parameter_copies=spec.parameter_copies,
    )
    rows = [
        TimelineRow.model_construct(
            rank=rank, stage_index=stage, microbatch=mb, action=action, start=start, end=end
        )
        for rank, stage, mb, action, start, end in simulation.timeline.rows()
    ]
    return ScheduleReport(
        schedule=schedule,
        pp=pp,
        microbatches=num_microbatches,
        vpp=vpp,
        step_time=simulation.step_time,
        bubble_time=simulation.bubble_time,
        bubble_fraction=simulation.bubble_fraction,
        peak_activations=simulation.peak_activations,
        parameter_copies=simulation.parameter_copies,
        timeline=rows,
        bubble_ratio=simulation.bubble_ratio,
        pipelined_step_time=simulation.pipelined_step_time,
        pipelined_bubble_time=simulation.pipelined_bubble_time,
        peak_weight_pending=simulation.peak_weight_pending,
    )
