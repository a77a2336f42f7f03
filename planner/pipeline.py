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

The loop is plain Python over the actions (about a microsecond each); the timeline is kept as
numpy columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, PrivateAttr

from planner.errors import PlanError
from planner.schedules.actions import (
    ACTION_KINDS,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    FULL_BACKWARD,
    Schedule,
)
from planner.schedules.registry import generate_schedule, get_schedule

_F, _B, _W, _BW = (
    ACTION_KINDS.index(k) for k in (FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FULL_BACKWARD)
)
_CODE = {kind: code for code, kind in enumerate(ACTION_KINDS)}

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
    num_stages = 1 + max((a.stage_index for ops in schedule for a in ops), default=0)
    num_microbatches = 1 + max((a.microbatch for ops in schedule for a in ops), default=0)
    fdur = _per_stage("f", f, num_stages)
    bdur = _per_stage("b", b, num_stages)
    wdur = _per_stage("w", w, num_stages)
    hop = _per_stage("comm", comm, num_stages, max(num_stages - 1, 1))
    share = _per_stage("activation_share", activation_share, num_stages)
    columns = _run(schedule, num_stages, num_microbatches, fdur, bdur, wdur, hop, overlap_fb)
    timeline = Timeline(*columns)
    return _measure(timeline, len(schedule), num_stages, np.asarray(share), parameter_copies)


def _run(
    schedule: Schedule,
    num_stages: int,
    num_microbatches: int,
    fdur: list[float],
    bdur: list[float],
    wdur: list[float],
    hop: list[float],
    overlap: float,
) -> tuple[np.ndarray, ...]:
    """The event loop: advance each rank until an input is missing, wake it when it lands.

    Finish times live in flat lists indexed by ``microbatch·num_stages + stage``; a rank
    that meets a missing input parks on that key and is resumed by whoever produces it.
    Ranks share nothing but their inputs, so the order in which they advance does not
    change any time.
    """
    num_ranks = len(schedule)
    size = num_microbatches * num_stages
    last = num_stages - 1
    f_end: list[float | None] = [None] * size
    b_end: list[float | None] = [None] * size
    f_rank = [-1] * size
    b_rank = [-1] * size
    waiting_f: dict[int, list[int]] = {}
    waiting_b: dict[int, list[int]] = {}
    position = [0] * num_ranks
    free = [0.0] * num_ranks
    starts: list[list[float]] = [[] for _ in range(num_ranks)]
    ends: list[list[float]] = [[] for _ in range(num_ranks)]
    durations = {
        FORWARD: fdur,
        BACKWARD_INPUT: bdur,
        BACKWARD_WEIGHT: wdur,
        FULL_BACKWARD: [x + y for x, y in zip(bdur, wdur, strict=True)],
    }

    def ready_time(action, rank: int):
        """When the action's inputs are on ``rank``, or (waiting list, key) if one is missing."""
        kind, mb, stage, _ = action
        key = mb * num_stages + stage
        if kind == FORWARD:
            if stage == 0:
                return 0.0
            end = f_end[key - 1]
            if end is None:
                return waiting_f, key - 1
            return end + hop[stage - 1] if f_rank[key - 1] != rank else end
        if kind == BACKWARD_WEIGHT:
            end = b_end[key]
            return (waiting_b, key) if end is None else end
        end = f_end[key]
        if end is None:
            return waiting_f, key
        if stage == last:
            return end
        grad = b_end[key + 1]
        if grad is None:
            return waiting_b, key + 1
        if b_rank[key + 1] != rank:
            grad += hop[stage]
        return grad if grad > end else end

    def finish(kind: str, key: int, rank: int, at: float, runnable: list[int]) -> None:
        if kind == FORWARD:
            f_end[key] = at
            f_rank[key] = rank
            woken = waiting_f.pop(key, None)
        elif kind == BACKWARD_WEIGHT:
            return
        else:
            b_end[key] = at
            b_rank[key] = rank
            woken = waiting_b.pop(key, None)
        if woken:
            runnable.extend(woken)

    runnable = list(range(num_ranks - 1, -1, -1))
    while runnable:
        rank = runnable.pop()
        ops = schedule[rank]
        num_ops = len(ops)
        rank_starts, rank_ends = starts[rank], ends[rank]
        i = position[rank]
        now = free[rank]
        while i < num_ops:
            action = ops[i]
            ready = ready_time(action, rank)
            if action.fb_pair and action.kind == FORWARD:
                partner = ops[i + 1]
                ready_b = ready_time(partner, rank)
                if isinstance(ready, float) and isinstance(ready_b, float):
                    ready = max(ready, ready_b)
                elif isinstance(ready, float):
                    ready = ready_b
            if not isinstance(ready, float):
                waiting, key = ready
                waiting.setdefault(key, []).append(rank)
                break
            start = now if now > ready else ready
            kind, mb, stage, pair = action
            if pair and kind == FORWARD:
                d_f = fdur[stage]
                d_b = durations[partner.kind][partner.stage_index]
                slot = d_f + d_b - overlap * min(d_f, d_b)
                split = start + (slot * d_f / (d_f + d_b) if d_f + d_b > 0 else 0.0)
                now = start + slot
                rank_starts += (start, split)
                rank_ends += (split, now)
                finish(kind, mb * num_stages + stage, rank, now, runnable)
                finish(
                    partner.kind,
                    partner.microbatch * num_stages + partner.stage_index,
                    rank,
                    now,
                    runnable,
                )
                i += 2
            else:
                now = start + durations[kind][stage]
                rank_starts.append(start)
                rank_ends.append(now)
                finish(kind, mb * num_stages + stage, rank, now, runnable)
                i += 1
        position[rank] = i
        free[rank] = now

    stuck = [
        f"rank {r} at {ops[position[r]]}"
        for r, ops in enumerate(schedule)
        if position[r] < len(ops)
    ]
    if stuck:
        raise PlanError(
            f"schedule deadlocks: {', '.join(stuck[:4])} wait for inputs that never come"
        )
    flat = [action for ops in schedule for action in ops]
    kinds, microbatches, stages, pairs = zip(*flat, strict=True) if flat else ((), (), (), ())
    return (
        np.repeat(np.arange(num_ranks, dtype=np.int32), [len(ops) for ops in schedule]),
        np.asarray(stages, dtype=np.int32),
        np.asarray(microbatches, dtype=np.int32),
        np.asarray([_CODE[kind] for kind in kinds], dtype=np.int8),
        np.asarray([t for rank_starts in starts for t in rank_starts], dtype=float),
        np.asarray([t for rank_ends in ends for t in rank_ends], dtype=float),
        np.asarray(pairs, dtype=bool),
    )


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
