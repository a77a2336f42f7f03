"""ZB-V (Qi et al., ICLR 2024 §6): the zero-bubble V schedule, two chunks per rank.

Rank ``r`` holds stages ``r`` (chunk 0) and ``2p−1−r`` (chunk 1), so a micro-batch runs down
the ranks and back up: the last stage shares rank 0 with the first. The order is the
paper's handcrafted one, as torch.distributed.pipelining's ``ScheduleZBVZeroBubble`` writes
it: warm-up forwards, a steady state of ``F0 B0 W0 F1 B1 W1``, then a drain in which the
weight gradients fill the tail. It is built for ``max(m, 2p−1)`` micro-batches; with fewer
micro-batches the missing ones are dropped, which leaves bubbles (see ``closed_form``).
With ``T_F = T_B = T_W`` the bubble is zero once ``m ≥ 2p−1``; activations stay at 1F1B's
``p`` micro-batches of a whole rank's layers.
"""

from __future__ import annotations

from planner.pipeline.schedules.actions import (
    SPLIT_KINDS,
    Action,
    Schedule,
    check_sizes,
    check_vpp,
    in_rounds,
)

NAME = "zbv"


def _rank_ops(pp: int, rank: int, num_slots: int, num_microbatches: int) -> list[Action]:
    """One rank's actions for ``num_slots ≥ 2p−1`` micro-batches, those of micro-batches past
    ``num_microbatches`` dropped.

    The order as blocks of rounds (:func:`in_rounds`: a pattern of (kind, stage) columns, a
    number of rounds and each column's first micro-batch): 10^5 actions on PP 64.
    Chunk 0 (stage ``r``) is ``near``, chunk 1 (stage ``2p−1−r``) ``far``.
    """
    p, r, n = pp, rank, num_slots
    f_near, b_near, w_near = ((kind, r) for kind in SPLIT_KINDS)
    f_far, b_far, w_far = ((kind, 2 * p - 1 - r) for kind in SPLIT_KINDS)
    warmup = 2 * (p - r) - 1  # chunk-0 forwards before the first chunk-1 one
    steady = n - 2 * p + r + 1  # full rounds F0 B0 W0 F1 B1 W1, until the last chunk-0 F
    tail = p - r - 1  # rounds after it, without F0, until chunk 1 has caught up
    far_done = p - r + steady  # chunk-1 input gradients run by the end of the full rounds
    blocks = (  # (pattern, rounds, first micro-batch of each column)
        ((f_near,), warmup, (0,)),
        ((f_far, f_near), r, (0, warmup)),
        ((f_far, b_far, w_far), p - r, (r, 0, 0)),
        (
            (f_near, b_near, w_near, f_far, b_far, w_far),
            steady,
            (warmup + r, 0, 0, p, p - r, p - r),
        ),
        (
            (b_near, w_near, f_far, b_far, w_far),
            tail,
            (steady, steady, p + steady, far_done, far_done),
        ),
        # Drain: input gradients first, weight gradients deferred into the tail.
        ((b_near, b_far), r, (n - p, n - r)),
        ((b_near, w_near), p - r, (n - p + r, n - p)),
        ((w_far,), r, (n - r,)),
        ((w_near,), r, (n - r,)),
    )
    ops = in_rounds(blocks)
    if num_microbatches < num_slots:
        ops = [action for action in ops if action.microbatch < num_microbatches]
    return ops


def zbv(pp: int, num_microbatches: int, vpp: int = 2) -> Schedule:
    """Per-rank actions of ZB-V on ``pp`` ranks (``2·pp`` stages)."""
    check_sizes(NAME, pp, num_microbatches)
    check_vpp(NAME, vpp, 2)
    num_slots = max(num_microbatches, 2 * pp - 1)
    return [_rank_ops(pp, rank, num_slots, num_microbatches) for rank in range(pp)]
