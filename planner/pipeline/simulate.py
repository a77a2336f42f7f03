"""Event simulation of a pipeline schedule: actions and durations in, a timeline out.

Every rank runs its actions in the listed order; an action starts when its rank is free and
its inputs have arrived:

* ``F`` of micro-batch ``i`` at stage ``s`` after ``F(i, s−1)``;
* ``B`` or ``BW`` after ``F(i, s)`` and ``B(i, s+1)`` (the last stage after its own ``F``);
* ``W`` after ``B(i, s)``.

An input produced on another rank arrives one point-to-point hop later (``comm``, the time
for the activation or its gradient between stages ``s`` and ``s+1``: latency plus bytes over
bandwidth, see :func:`p2p_time`); a hop inside a rank (the bottom of a V) is free. Transfers
do not occupy the rank. A DualPipe ``F&B`` pair runs as one slot of
``F + BW − overlap_fb·min(F, BW)`` (0 = serial, 1 = fully hidden) and, as in the reference
implementation (deepseek-ai/DualPipe sends after ``_forward_backward_compute_chunk``), both
its outputs leave at the end of the slot; the timeline splits the slot between the two rows
in proportion to their serial durations, for drawing only.

Metrics (what the search and the memory model read):

* ``step_time``: makespan, first start to last end;
* ``bubble_time = step_time − max busy``, ``bubble_fraction = bubble/step_time`` and the
  Megatron-style ``bubble_ratio = bubble/max busy`` (Narayanan et al., SC'21: ``(p−1)/m``);
* ``pipelined_step_time``: the longest single-rank span (its first start to its last end),
  the step time when every rank starts its next step as soon as it finishes this one, as the
  zero-bubble paper measures its schedules (post-validated optimizer, Qi et al. §4);
* ``peak_activations``: per rank, the most micro-batches held between a chunk's forward start
  and its input-gradient end, in units of one micro-batch through the rank's whole share of
  layers (a chunk counts ``activation_share``, 1/vpp); ``peak_weight_pending`` counts those
  past ``B`` still waiting for ``W`` separately (the paper's ``M_W``).

The loop (:mod:`planner.pipeline.event_loop`) is plain Python over the actions (about a
microsecond each); the timeline is kept as numpy columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter

import numpy as np
from pydantic import BaseModel, ConfigDict, PrivateAttr

from hwspecs.errors import PlanError
from planner.pipeline.event_loop import last_end, run_actions, timeline_columns
from planner.pipeline.schedules.actions import (
    ACTION_KINDS,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    FULL_BACKWARD,
    Schedule,
)

_F, _B, _W, _BW = (
    ACTION_KINDS.index(k) for k in (FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FULL_BACKWARD)
)

PerStage = float | Sequence[float] | np.ndarray


def p2p_time(latency_s: float, message_bytes: float, bytes_per_s: float) -> float:
    """One point-to-point hop: ``latency + bytes / bandwidth`` (the alpha-beta model)."""
    return latency_s + message_bytes / bytes_per_s


@dataclass(frozen=True, slots=True)
class Timeline:
    """One row per executed action, as numpy columns (``kind`` indexes ``ACTION_KINDS``)."""

    rank: np.ndarray
    stage_index: np.ndarray
    microbatch: np.ndarray
    kind: np.ndarray
    start: np.ndarray
    end: np.ndarray
    fb_pair: np.ndarray

    def __len__(self) -> int:
        return len(self.rank)

    def actions(self) -> list[str]:
        """The kind of every row as its letter(s)."""
        return np.asarray(ACTION_KINDS, dtype=object)[self.kind].tolist()

    def rows(self) -> list[tuple[int, int, int, str, float, float]]:
        """``(rank, stage_index, microbatch, action, start, end)`` per row."""
        return list(
            zip(
                self.rank.tolist(),
                self.stage_index.tolist(),
                self.microbatch.tolist(),
                self.actions(),
                self.start.tolist(),
                self.end.tolist(),
                strict=True,
            )
        )


class PipelineSimulation(BaseModel):
    """Result of :func:`simulate`; the timeline columns are on :attr:`timeline`."""

    model_config = ConfigDict(frozen=True)

    num_ranks: int
    num_stages: int
    step_time: float
    bubble_time: float
    bubble_fraction: float
    bubble_ratio: float
    pipelined_step_time: float
    busy_time: list[float]
    peak_activations: list[float]
    peak_weight_pending: list[float]
    parameter_copies: int

    _timeline: Timeline = PrivateAttr()
    _share: list[float] = PrivateAttr()

    @property
    def timeline(self) -> Timeline:
        return self._timeline

    @property
    def pipelined_bubble_time(self) -> float:
        """Bubble under the zero-bubble paper's measure: longest rank span − max busy."""
        return self.pipelined_step_time - max(self.busy_time)

    def peak_activation_units(self, weight_ratio: float) -> list[float]:
        """Per rank, the most activations held at once when a micro-batch past B that waits
        for W holds ``weight_ratio`` of its F-to-B activations (M_W / M_B): the running sum
        of +share at F, −share at B's (or BW's) end, +ratio·share at B's end, −ratio·share
        at W's end (releases first at equal times)."""
        t = self._timeline
        share = np.asarray(self._share)[t.stage_index]
        is_f, is_b, is_w, is_bw = (t.kind == kind for kind in (_F, _B, _W, _BW))
        rank = np.concatenate([t.rank[is_f], t.rank[is_b | is_bw], t.rank[is_b], t.rank[is_w]])
        time = np.concatenate([t.start[is_f], t.end[is_b | is_bw], t.end[is_b], t.end[is_w]])
        delta = np.concatenate([
            share[is_f], -share[is_b | is_bw], weight_ratio * share[is_b],
            -weight_ratio * share[is_w],
        ])  # fmt: skip
        return _peak_per_rank(rank, time, delta, self.num_ranks)


def _per_stage(
    name: str, value: PerStage, num_stages: int, num_values: int | None = None
) -> list[float]:
    count = num_stages if num_values is None else num_values
    array = np.asarray(value, dtype=float)
    if array.ndim == 0:
        array = np.full(count, float(array))
    if array.shape != (count,):
        raise PlanError(
            f"{name} needs a number or {count} per-stage values, got shape {array.shape}"
        )
    if np.any(array < 0) or not np.all(np.isfinite(array)):
        raise PlanError(f"{name} must be finite and ≥ 0, got {array.tolist()}")
    return array.tolist()


def schedule_extent(schedule: Schedule) -> tuple[int, int]:
    """(stages, micro-batches) a schedule's actions number: one more than the largest stage
    index and micro-batch (1, 1 for no actions); C-level scans of the 10^5 actions."""
    actions = list(chain.from_iterable(schedule))
    if not actions:
        return 1, 1
    return 1 + max(map(itemgetter(2), actions)), 1 + max(map(itemgetter(1), actions))


def simulate(
    schedule: Schedule,
    f: PerStage = 1.0,
    b: PerStage = 1.0,
    w: PerStage = 1.0,
    comm: PerStage = 0.0,
    overlap_fb: float = 0.0,
    activation_share: PerStage = 1.0,
    parameter_copies: int = 1,
) -> PipelineSimulation:
    """Time ``schedule`` (one action list per rank) and measure it.

    ``f``, ``b``, ``w``: duration of one forward, input-gradient and weight-gradient action
    at each stage (a number for all stages or one per stage; a ``BW`` takes ``b + w``).
    ``comm``: one hop between stage ``s`` and ``s+1`` (a number or ``num_stages − 1`` values).
    ``activation_share``: what one micro-batch's forward at a stage adds to its rank's
    activations, in units of the rank's whole share of layers (``1/vpp``).
    """
    if not 0.0 <= overlap_fb <= 1.0:
        raise PlanError(f"overlap_fb must lie in [0, 1], got {overlap_fb}")
    num_stages, num_microbatches = schedule_extent(schedule)
    fdur = _per_stage("f", f, num_stages)
    bdur = _per_stage("b", b, num_stages)
    wdur = _per_stage("w", w, num_stages)
    hop = _per_stage("comm", comm, num_stages, max(num_stages - 1, 1))
    share = _per_stage("activation_share", activation_share, num_stages)
    starts, ends = run_actions(
        schedule, num_stages, num_microbatches, fdur, bdur, wdur, hop, overlap_fb
    )
    timeline = Timeline(*timeline_columns(schedule, starts, ends))
    return _measure(timeline, len(schedule), num_stages, np.asarray(share), parameter_copies)


def simulated_step_time(
    schedule: Schedule,
    f: PerStage = 1.0,
    b: PerStage = 1.0,
    w: PerStage = 1.0,
    extent: tuple[int, int] | None = None,
) -> float:
    """:func:`simulate`'s ``step_time`` (no hops, no F&B overlap) without building its
    timeline or measuring it: the last end of the same event loop (:func:`last_end`).
    ``extent``: the schedule's :func:`schedule_extent`, where the caller keeps it (a scan of
    every action).

    The first start is 0: a rank that opens with a stage-0 forward outside an F&B pair
    starts it at 0, all times are ≥ 0, and a schedule with no such rank deadlocks (every
    action would wait for an earlier one), which raises.
    """
    num_stages, num_microbatches = extent or schedule_extent(schedule)
    durations = (_per_stage(name, x, num_stages) for name, x in (("f", f), ("b", b), ("w", w)))
    return last_end(schedule, num_stages, num_microbatches, *durations)


def _peak_per_rank(
    rank: np.ndarray, time: np.ndarray, delta: np.ndarray, num_ranks: int
) -> list[float]:
    """Highest running sum of ``delta`` per rank, releases before allocations at equal times."""
    peaks = np.zeros(num_ranks)
    if len(rank) == 0:
        return peaks.tolist()
    order = np.lexsort((delta, time, rank))
    sorted_rank = rank[order]
    running = np.cumsum(delta[order])
    bounds = np.searchsorted(sorted_rank, np.arange(num_ranks + 1))
    for r in range(num_ranks):
        lo, hi = bounds[r], bounds[r + 1]
        if hi > lo:
            before = running[lo - 1] if lo > 0 else 0.0
            peaks[r] = max(0.0, float(running[lo:hi].max() - before))
    return np.round(peaks, 9).tolist()


def _measure(
    timeline: Timeline, num_ranks: int, num_stages: int, share: np.ndarray, parameter_copies: int
) -> PipelineSimulation:
    t = timeline
    first_start = float(t.start.min()) if len(t) else 0.0
    step_time = (float(t.end.max()) if len(t) else 0.0) - first_start
    busy = np.bincount(t.rank, weights=t.end - t.start, minlength=num_ranks)
    span_start = np.full(num_ranks, np.inf)
    span_end = np.zeros(num_ranks)
    np.minimum.at(span_start, t.rank, t.start)
    np.maximum.at(span_end, t.rank, t.end)
    max_busy = float(busy.max()) if num_ranks else 0.0
    bubble = max(step_time - max_busy, 0.0)

    is_f = t.kind == _F
    releases = (t.kind == _B) | (t.kind == _BW)
    stage_share = share[t.stage_index]
    act_rank = np.concatenate([t.rank[is_f], t.rank[releases]])
    act_time = np.concatenate([t.start[is_f], t.end[releases]])
    act_delta = np.concatenate([stage_share[is_f], -stage_share[releases]])
    is_b, is_w = t.kind == _B, t.kind == _W
    w_rank = np.concatenate([t.rank[is_b], t.rank[is_w]])
    w_time = np.concatenate([t.end[is_b], t.end[is_w]])
    w_delta = np.concatenate([stage_share[is_b], -stage_share[is_w]])

    simulation = PipelineSimulation(
        num_ranks=num_ranks,
        num_stages=num_stages,
        step_time=step_time,
        bubble_time=bubble,
        bubble_fraction=bubble / step_time if step_time > 0 else 0.0,
        bubble_ratio=bubble / max_busy if max_busy > 0 else 0.0,
        pipelined_step_time=float(np.max(span_end - span_start)) if num_ranks else 0.0,
        busy_time=busy.tolist(),
        peak_activations=_peak_per_rank(act_rank, act_time, act_delta, num_ranks),
        peak_weight_pending=_peak_per_rank(w_rank, w_time, w_delta, num_ranks),
        parameter_copies=parameter_copies,
    )
    simulation._timeline = timeline
    simulation._share = np.asarray(share, dtype=float).tolist()
    return simulation
