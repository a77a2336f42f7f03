"""Pipeline timelines: what ran, and the planner's simulator replaying it.

The measured timeline is every F/B/W action of one timed step on every rank (start and end
relative to the step's first action). The replay feeds the planner's event simulator
(:func:`planner.pipeline.simulate.simulate`) the planner's own action list for the schedule and the
*measured* mean duration of each action kind per stage, with the point-to-point hop of the
calibrated link, so any difference in step time or bubble comes from the schedule and
dependency model, not from the compute-time model. Both come as rows
``{rank, stage, microbatch, kind, start_s, end_s}`` for drawing one over the other.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from validate.results import RunResult


def _pp_rank(rank: int, layout) -> int:
    return (rank // (layout.cp * layout.tp)) % layout.pp


def measured_timeline(result: RunResult) -> list[dict]:
    """Rows of the first pipeline replica (dp index 0), times from the step's first action."""
    layout = result.spec.layout
    replica = [
        r for r in result.ranks if r.pipeline_events and r.rank < layout.pp * layout.cp * layout.tp
    ]
    if not replica:
        return []
    start = min(e.start_s for r in replica for e in r.pipeline_events)
    return [
        {
            "rank": _pp_rank(r.rank, layout),
            "stage": e.stage,
            "microbatch": e.microbatch,
            "kind": e.kind,
            "start_s": e.start_s - start,
            "end_s": e.end_s - start,
        }
        for r in replica
        for e in r.pipeline_events
    ]


def mean_durations(rows: list[dict], num_stages: int) -> dict[str, list[float]]:
    """Mean seconds of F, B and W per stage; a full backward (BW) counts as B with W = 0."""
    samples: dict[tuple[str, int], list[float]] = defaultdict(list)
    for row in rows:
        kind = "B" if row["kind"] == "BW" else row["kind"]
        samples[(kind, row["stage"])].append(row["end_s"] - row["start_s"])
    return {
        kind: [
            statistics.fmean(samples[(kind, s)]) if samples[(kind, s)] else 0.0
            for s in range(num_stages)
        ]
        for kind in ("F", "B", "W")
    }


def replay(result: RunResult, p2p_s: float = 0.0) -> dict | None:
    """The planner's simulation of this run's schedule with its measured action durations."""
    from planner.api import generate_schedule, simulate

    spec = result.spec
    layout = spec.planner_layout()
    rows = measured_timeline(result)
    if not rows:
        return None
    num_stages = layout.pp * layout.vpp
    durations = mean_durations(rows, num_stages)
    schedule = generate_schedule(layout.schedule, layout.pp, spec.num_microbatches, layout.vpp)
    simulation = simulate(schedule, durations["F"], durations["B"], durations["W"], comm=p2p_s)
    return {
        "step_time_s": simulation.step_time,
        "bubble_fraction": simulation.bubble_fraction,
        "timeline": [
            {
                "rank": rank,
                "stage": stage,
                "microbatch": mb,
                "kind": kind,
                "start_s": t0,
                "end_s": t1,
            }
            for rank, stage, mb, kind, t0, t1 in simulation.timeline.rows()
        ],
    }


def measured_pipeline(result: RunResult) -> dict | None:
    """Span and bubble of the measured pipeline step, with its timeline rows."""
    rows = measured_timeline(result)
    if not rows:
        return None
    span = max(r["end_s"] for r in rows)
    busy: dict[int, float] = defaultdict(float)
    for row in rows:
        busy[row["rank"]] += row["end_s"] - row["start_s"]
    return {
        "step_time_s": span,
        "bubble_fraction": 1.0 - max(busy.values()) / span,
        "timeline": rows,
    }
