"""The event loop of :func:`planner.pipeline.simulate.simulate`: every rank's actions timed in
order, each when its rank is free and its inputs have arrived (the rules are in
:mod:`planner.pipeline.simulate`'s docstring).

Plain Python over the actions, once each (the search's refinement runs it on schedules of
10^5 actions): the common path — an action outside an F&B pair — is written out in the
loop; DualPipe's pairs take the general path through ``ready_time`` and ``finish``.
"""

from __future__ import annotations

import numpy as np

from hwspecs.errors import PlanError
from planner.pipeline.schedules.actions import (
    ACTION_KINDS,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    FULL_BACKWARD,
    Schedule,
)

_CODE = {kind: code for code, kind in enumerate(ACTION_KINDS)}


def run_actions(
    schedule: Schedule,
    num_stages: int,
    num_microbatches: int,
    fdur: list[float],
    bdur: list[float],
    wdur: list[float],
    hop: list[float],
    overlap: float,
) -> tuple[list[list[float]], list[list[float]]]:
    """The event loop: advance each rank until an input is missing, wake it when it lands.

    Finish times live in flat lists indexed by ``microbatch·num_stages + stage``; a rank
    that meets a missing input parks on that key and is resumed by whoever produces it.
    Ranks share nothing but their inputs, so the order in which they advance does not
    change any time. Returns each rank's start and end times, in its actions' order.
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
            kind, mb, stage, pair = action
            if pair:  # an F&B pair (or its B): the general path below
                ready = ready_time(action, rank)
                if kind == FORWARD:
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
            else:  # ready_time and finish written out: the loop runs once per action
                key = mb * num_stages + stage
                if kind == FORWARD:
                    if stage == 0:
                        ready = 0.0
                    else:
                        end = f_end[key - 1]
                        if end is None:
                            waiting_f.setdefault(key - 1, []).append(rank)
                            break
                        ready = end + hop[stage - 1] if f_rank[key - 1] != rank else end
                    start = now if now > ready else ready
                    now = start + fdur[stage]
                    rank_starts.append(start)
                    rank_ends.append(now)
                    f_end[key] = now
                    f_rank[key] = rank
                    woken = waiting_f.pop(key, None)
                    if woken:
                        runnable.extend(woken)
                    i += 1
                    continue
                if kind == BACKWARD_WEIGHT:
                    ready = b_end[key]
                    if ready is None:
                        waiting_b.setdefault(key, []).append(rank)
                        break
                    start = now if now > ready else ready
                    now = start + wdur[stage]
                    rank_starts.append(start)
                    rank_ends.append(now)
                    i += 1
                    continue
                end = f_end[key]
                if end is None:
                    waiting_f.setdefault(key, []).append(rank)
                    break
                if stage == last:
                    ready = end
                else:
                    grad = b_end[key + 1]
                    if grad is None:
                        waiting_b.setdefault(key + 1, []).append(rank)
                        break
                    if b_rank[key + 1] != rank:
                        grad += hop[stage]
                    ready = grad if grad > end else end
                start = now if now > ready else ready
                now = start + durations[kind][stage]
                rank_starts.append(start)
                rank_ends.append(now)
                b_end[key] = now
                b_rank[key] = rank
                woken = waiting_b.pop(key, None)
                if woken:
                    runnable.extend(woken)
                i += 1
                continue
            start = now if now > ready else ready
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
    return starts, ends


def timeline_columns(
    schedule: Schedule, starts: list[list[float]], ends: list[list[float]]
) -> tuple[np.ndarray, ...]:
    """The :class:`planner.pipeline.simulate.Timeline` columns of a run: rank, stage,
    micro-batch, kind code, start, end, F&B pair, one row per action in the ranks' order."""
    flat = [action for ops in schedule for action in ops]
    kinds, microbatches, stages, pairs = zip(*flat, strict=True) if flat else ((), (), (), ())
    return (
        np.repeat(np.arange(len(schedule), dtype=np.int32), [len(ops) for ops in schedule]),
        np.asarray(stages, dtype=np.int32),
        np.asarray(microbatches, dtype=np.int32),
        np.asarray([_CODE[kind] for kind in kinds], dtype=np.int8),
        np.asarray([t for rank_starts in starts for t in rank_starts], dtype=float),
        np.asarray([t for rank_ends in ends for t in rank_ends], dtype=float),
        np.asarray(pairs, dtype=bool),
    )
