"""ZB-H1 and ZB-H2 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024 §2).

Both split the backward into ``B`` (input gradient, on the critical path) and ``W`` (weight
gradient, free to move) and hold back ``W`` passes to fill the bubbles of 1F1B.

* **ZB-H1** (§2.1, Figure 3 top): 1F1B's warm-up of ``p−r−1`` forwards and its ``F B``
  alternation, with each ``W`` run right after a later ``B``: rank ``r`` lags its weight
  gradients ``r`` micro-batches behind, so they fill the tail where 1F1B idles. Memory as
  1F1B (``p−r`` micro-batches in flight); bubble ``(p−1)(F+B−W)`` when ``W ≤ min(F, B)``.
* **ZB-H2** (§2.2, Figure 3 bottom): ``2(p−r)−1`` warm-up forwards (``2p−1`` on rank 0),
  then ``B W F`` per micro-batch, with rank ``r`` lagging its weight gradients ``2r`` behind
  so the schedule becomes a parallelogram. Each rank's own span then holds a bubble of
  ``(p−1)(F+B−2W)`` (zero at ``F = B = W``), the paper's measure, which lets the next step
  start rank by rank (optimizer post-validation, §4); a synchronous step adds the ``(p−1)F``
  skew of the parallelogram to the makespan. Like ZB-V it is built for at least ``2p−1``
  micro-batches and drops the missing ones.
"""

from __future__ import annotations

from collections import deque

from planner.pipeline.schedules.actions import (
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    Action,
    Schedule,
    check_sizes,
    check_vpp,
)

ZB_H1 = "zb-h1"
ZB_H2 = "zb-h2"


def _rank_ops(
    rank: int, num_microbatches: int, warmup: int, weight_lag: int, forward_first: bool
) -> list[Action]:
    """Warm-up forwards, then one forward and one input gradient per step (forward first
    or last), each input gradient followed by the weight gradient ``weight_lag`` behind."""
    ops = [Action(FORWARD, mb, rank) for mb in range(warmup)]
    pending: deque[int] = deque()
    next_backward = 0

    def backward() -> None:
        nonlocal next_backward
        ops.append(Action(BACKWARD_INPUT, next_backward, rank))
        pending.append(next_backward)
        next_backward += 1
        if len(pending) > weight_lag:
            ops.append(Action(BACKWARD_WEIGHT, pending.popleft(), rank))

    for mb in range(warmup, num_microbatches):
        if forward_first:
            ops.append(Action(FORWARD, mb, rank))
            backward()
        else:
            backward()
            ops.append(Action(FORWARD, mb, rank))
    while next_backward < num_microbatches:
        backward()
    ops.extend(Action(BACKWARD_WEIGHT, mb, rank) for mb in pending)
    return ops


def zb_h1(pp: int, num_microbatches: int, vpp: int = 1) -> Schedule:
    """Per-rank actions of ZB-H1 on ``pp`` ranks (one stage each)."""
    check_sizes(ZB_H1, pp, num_microbatches)
    check_vpp(ZB_H1, vpp, 1)
    return [
        _rank_ops(rank, num_microbatches, min(pp - rank - 1, num_microbatches), rank, True)
        for rank in range(pp)
    ]


def zb_h2(pp: int, num_microbatches: int, vpp: int = 1) -> Schedule:
    """Per-rank actions of ZB-H2 on ``pp`` ranks (one stage each)."""
    check_sizes(ZB_H2, pp, num_microbatches)
    check_vpp(ZB_H2, vpp, 1)
    # Built for at least 2p−1 micro-batches (rank 0's warm-up); with fewer, the missing
    # ones are dropped, as torch does for ZB-V, which can only make every action earlier.
    num_slots = max(num_microbatches, 2 * pp - 1)
    return [
        [
            action
            for action in _rank_ops(rank, num_slots, 2 * (pp - rank) - 1, 2 * rank, False)
            if action.microbatch < num_microbatches
        ]
        for rank in range(pp)
    ]
