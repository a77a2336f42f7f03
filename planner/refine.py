"""The search's top rows re-timed by the event simulator, stage by stage.

The screen times every row's pipeline by the schedule's closed form on the busiest rank's
per-micro-batch F, B and W, as if every stage took as long as that rank
(:mod:`planner.pipeline.closed_form`). For the best rows the event simulator
(:mod:`planner.pipeline.simulate`) runs the schedule's real action lists with each virtual
stage's own durations — its layers of each kind, the embedding on the first stage, the head
(and any MTP module) on the last — so stages lighter than the busiest rank shorten the step
where the schedule lets them. The stage durations come from the same per-layer times the
columns model sums (:func:`planner.cost.stage_times.shape_times`), scaled so the busiest
rank's sum is the row's own F, B, W (which include any host-side costs per rank); the
point-to-point hops stay in the PP axis's exposed time, as in the closed form. The refined
step time is the row's step time with the simulated pipeline time in place of the closed
form's.
"""

from __future__ import annotations

import numpy as np

from hwspecs.schema import Accelerator
from planner.cost.compute import job_rates
from planner.cost.stage_times import accumulates_gradients, rank_times, shape_times
from planner.pipeline.schedules.registry import generate_schedule, get_schedule
from planner.pipeline.simulate import schedule_extent, simulated_step_time
from planner.spec.job import Job
from planner.spec.layout import Layout, dense_and_moe_layers_per_virtual_stage
from planner.structure.stages import RankStructure, rank_structure

#: Rows of a search the simulator re-times by default: the rows `llmplan plan` prints (the
#: robust ranking also simulates the first rows of its own order). The default plan's search
#: takes 0.6 s in one process with none simulated, 0.9 s with 5 and 2.0 s with 20 (the
#: event loop walks every action in Python; measured 2026-12-02 on the 2-core machine by
#: ``api.plan(..., refine_top=K)``, warm); ``refine_top`` sets it.
DEFAULT_REFINE_TOP = 5


def stage_durations(
    job: Job, layout: Layout, accelerator: Accelerator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(F, B + recompute, W per virtual stage, F + B + W per rank) for one micro-batch, in
    the simulator's stage numbering (model order; DualPipe: one direction's stages)."""
    model = job.model
    rates, bf16 = job_rates(accelerator, job)
    tuned = job.finetune if job.finetune is not None and job.finetune.trains_adapters else None
    shape = shape_times(
        model, job.seq_len, layout.micro_batch_size, layout.tp, layout.cp, layout.ep,
        layout.sequence_parallel and layout.tp > 1, job.flash_attention, rates,
        job.precision.activation_bytes, tuned, bf16, job.active_memory_measures, layout.etp,
    )  # fmt: skip
    dense, moe = dense_and_moe_layers_per_virtual_stage(
        model, layout.pp, layout.vpp, layout.pipeline_layer_split, layout.schedule
    )
    stages = len(dense)
    accumulate = accumulates_gradients(layout.zero_stage)
    per_stage = rank_times(
        shape,
        RankStructure(
            dense_layers=dense.astype(float).tolist(),
            moe_layers=moe.astype(float).tolist(),
            has_embedding=(np.arange(stages) == 0).tolist(),
            has_head=(np.arange(stages) == stages - 1).tolist(),
        ),
        layout.recompute,
        accumulate,
    )
    per_rank = rank_times(
        shape,
        rank_structure(model, layout.pp, layout.vpp, layout.schedule, layout.pipeline_layer_split),
        layout.recompute,
        accumulate,
    )
    f = np.asarray(per_stage.forward_s)
    b = np.asarray(per_stage.input_grad_s) + np.asarray(per_stage.recompute_s)
    w = np.asarray(per_stage.weight_grad_s)
    rank_total = (
        np.asarray(per_rank.forward_s)
        + np.asarray(per_rank.input_grad_s)
        + np.asarray(per_rank.recompute_s)
        + np.asarray(per_rank.weight_grad_s)
    )
    return f, b, w, rank_total


def scaled_stage_durations(
    job: Job, layout: Layout, accelerator: Accelerator, busiest_rank_s: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(F, B + recompute, W) per virtual stage for one micro-batch, scaled so the busiest
    rank's F + B + recompute + W is ``busiest_rank_s`` (the row's own, host costs included):
    what the event simulator runs, for the refined step time and the drawn timeline."""
    f, b, w, rank_total = stage_durations(job, layout, accelerator)
    if get_schedule(layout.schedule).bidirectional:  # per micro-batch: its two stages' mean
        rank_total = (rank_total + rank_total[::-1]) / 2
    busiest = float(rank_total.max()) or 1.0
    scale = busiest_rank_s / busiest
    return f * scale, b * scale, w * scale


def busiest_rank_s(row) -> float:
    """A row's busiest-rank F + B + recompute + W per micro-batch (seconds)."""
    return (
        float(row["forward_s"])
        + float(row["input_grad_s"])
        + float(row["recompute_per_microbatch_s"])
        + float(row["weight_grad_s"])
    )


def simulated_pipeline_time(
    job: Job,
    layout: Layout,
    accelerator: Accelerator,
    row: dict,
    num_microbatches: int,
    memo: dict | None = None,
) -> float:
    """The pipeline's step time by the event simulator with each stage's own durations,
    scaled to the row's busiest-rank F, B (+ recompute), W per micro-batch. ``memo``: step
    times by (schedule, pp, micro-batches, vpp, durations), so rows that run the same
    pipeline with the same durations (the top rows often differ only in what the pipeline
    does not see) are simulated once, and the action lists with their extent by (schedule,
    pp, micro-batches, vpp), generated and scanned once for the rows that run the same
    pipeline with other durations."""
    if layout.pp == 1:
        return float(row["pipeline_time_s"])
    f, b, w = scaled_stage_durations(job, layout, accelerator, busiest_rank_s(row))
    key = (
        layout.schedule,
        layout.pp,
        num_microbatches,
        layout.vpp,
        *(x.tobytes() for x in (f, b, w)),
    )
    if memo is not None and key in memo:
        return memo[key]
    pipeline = ("actions", *key[:4])
    generated = memo.get(pipeline) if memo is not None else None
    if generated is None:
        actions = generate_schedule(layout.schedule, layout.pp, num_microbatches, layout.vpp)
        generated = actions, schedule_extent(actions)
        if memo is not None:
            memo[pipeline] = generated
    step_time = simulated_step_time(generated[0], f, b, w, extent=generated[1])
    if memo is not None:
        memo[key] = step_time
    return step_time


def refine(
    job: Job, accelerator: Accelerator, layouts: list[Layout], rows: list[dict],
    memo: dict | None = None,
) -> list[dict]:  # fmt: skip
    """For each layout (with its row of the columns model): the closed-form and simulated
    pipeline times and the step time with the simulated one in place. ``memo``: see
    :func:`simulated_pipeline_time` (kept over calls of one search)."""
    out, memo = [], {} if memo is None else memo
    for layout, row in zip(layouts, rows, strict=True):
        m = int(row["num_microbatches"])
        simulated = simulated_pipeline_time(job, layout, accelerator, row, m, memo)
        closed = float(row["pipeline_time_s"])
        out.append(
            {
                "pipeline_time_closed_form_s": closed,
                "pipeline_time_simulated_s": simulated,
                "step_time_closed_form_s": float(row["step_time_s"]),
                "step_time_simulated_s": float(row["step_time_s"]) - closed + simulated,
            }
        )
    return out
