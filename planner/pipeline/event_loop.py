"""The event loop of :func:`planner.pipeline.simulate.simulate`: every rank's actions timed in
order, each when its rank is free and its inputs have arrived (the rules are in
:mod:`planner.pipeline.simulate`'s docstring).

Plain Python over the actions, once each (the search's refinement runs it on schedules of
10^5 actions): the common path — an action outside an F&B pair — is written out in the
loop; DualPipe's pairs take the general path through ``ready_time`` and ``finish``.
:func:`last_end` is the same loop cut down to the step time the refinement reads.
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

    _check_finished(schedule, position)
    return starts, ends


def _check_finished(schedule: Schedule, position: list[int]) -> None:
    """Raise :class:`PlanError` naming the ranks whose next action never got its inputs."""
    stuck = [
        f"rank {r} at {ops[position[r]]}"
        for r, ops in enumerate(schedule)
        if position[r] < len(ops)
    ]
    if stuck:
        raise PlanError(
            f"schedule deadlocks: {', '.join(stuck[:4])} wait for inputs that never come"
        )


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


def last_end(
    schedule: Schedule,
    num_stages: int,
    num_microbatches: int,
    fdur: list[float],
    bdur: list[float],
    wdur: list[float],
) -> float:
    """The latest end time of :func:`run_actions` with no hops and no F&B overlap (0.0 for
    no actions), bit for bit: the same loop, start and end arithmetic, keeping only each
    rank's clock and the finish times its inputs need.

    It exists beside :func:`run_actions` because the search re-times its top rows with it
    on schedules of 10^5 actions, where the per-action start and end lists, the hop lookups
    and the per-key rank bookkeeping (a hop inside a rank is free) cost about a third of
    the time. Parked ranks are chained through flat lists of ints (the last rank parked on
    a key, and per rank the one parked there before it), so the loop makes no object the
    garbage collector tracks: a new list per wait would set off collections that traverse
    every action the search holds. A rank's ends never decrease, so the latest end is the
    largest final clock, or the end of a pair's forward row (its slot's start plus the
    forward's share of the slot, which rounding can put one ulp past the slot's end).
    """
    num_ranks = len(schedule)
    size = num_microbatches * num_stages
    last = num_stages - 1
    f_end: list[float | None] = [None] * size
    b_end: list[float | None] = [None] * size
    waiting_f = [-1] * size  # the last rank parked on each key, or -1
    waiting_b = [-1] * size
    parked_after = [-1] * num_ranks  # the rank parked on the same key before it, or -1
    durations = {
        FORWARD: fdur,
        BACKWARD_INPUT: bdur,
        BACKWARD_WEIGHT: wdur,
        FULL_BACKWARD: [x + y for x, y in zip(bdur, wdur, strict=True)],
    }
    forward, weight = FORWARD, BACKWARD_WEIGHT
    position = [0] * num_ranks
    free = [0.0] * num_ranks
    split_end = 0.0  # the latest end of a pair's forward row

    def ready_time(kind: str, key: int, stage: int):
        """When an action's inputs are done, or (waiting list, key) of one that is missing."""
        if kind == forward:
            if stage == 0:
                return 0.0
            end = f_end[key - 1]
            return (waiting_f, key - 1) if end is None else end
        if kind == weight:
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
        return grad if grad > end else end

    def finish(kind: str, key: int, at: float) -> None:
        """Record an F&B pair member's end and wake the ranks waiting for it."""
        if kind == weight:
            return
        ends, waiting = (f_end, waiting_f) if kind == forward else (b_end, waiting_b)
        ends[key] = at
        wake(waiting, key)

    def wake(waiting: list[int], key: int) -> None:
        """Make the ranks parked on ``key`` runnable (``key`` is done: none parks on it again)."""
        woken, waiting[key] = waiting[key], -1
        while woken >= 0:
            runnable.append(woken)
            woken = parked_after[woken]

    runnable = list(range(num_ranks - 1, -1, -1))
    while runnable:
        rank = runnable.pop()
        ops = schedule[rank]
        num_ops = len(ops)
        i = position[rank]
        now = free[rank]
        while i < num_ops:
            kind, mb, stage, pair = ops[i]
            key = mb * num_stages + stage
            if pair:  # an F&B pair (or its B) as run_actions times it with overlap 0
                ready = ready_time(kind, key, stage)
                if kind == forward:
                    p_kind, p_mb, p_stage, _ = ops[i + 1]
                    p_key = p_mb * num_stages + p_stage
                    ready_b = ready_time(p_kind, p_key, p_stage)
                    if isinstance(ready, float) and isinstance(ready_b, float):
                        ready = max(ready, ready_b)
                    elif isinstance(ready, float):
                        ready = ready_b
                if not isinstance(ready, float):
                    wait, key = ready
                    break
                start = now if now > ready else ready
                if kind == forward:
                    d_f, d_b = fdur[stage], durations[p_kind][p_stage]
                    slot = d_f + d_b
                    split = start + (slot * d_f / (d_f + d_b) if d_f + d_b > 0 else 0.0)
                    split_end = split if split > split_end else split_end
                    now = start + slot
                    finish(kind, key, now)
                    finish(p_kind, p_key, now)
                    i += 2
                else:
                    now = start + durations[kind][stage]
                    finish(kind, key, now)
                    i += 1
                continue
            # The common path, written out (the rank's clock is its last end).
            if kind == forward:
                if stage:
                    ready = f_end[key - 1]
                    if ready is None:
                        wait, key = waiting_f, key - 1
                        break
                else:
                    ready = 0.0
                now = (now if now > ready else ready) + fdur[stage]
                f_end[key] = now
                if waiting_f[key] >= 0:
                    wake(waiting_f, key)
                i += 1
                continue
            if kind == weight:
                ready = b_end[key]
                if ready is None:
                    wait = waiting_b
                    break
                now = (now if now > ready else ready) + wdur[stage]
                i += 1
                continue
            ready = f_end[key]
            if ready is None:
                wait = waiting_f
                break
            if stage != last:
                grad = b_end[key + 1]
                if grad is None:
                    wait, key = waiting_b, key + 1
                    break
                if grad > ready:
                    ready = grad
            now = (now if now > ready else ready) + durations[kind][stage]
            b_end[key] = now
            if waiting_b[key] >= 0:
                wake(waiting_b, key)
            i += 1
        else:  # ran to its end
            position[rank], free[rank] = i, now
            continue
        parked_after[rank], wait[key] = wait[key], rank  # parked until `key` is done
        position[rank], free[rank] = i, now
    _check_finished(schedule, position)
    return max(max(free, default=0.0), split_end)
