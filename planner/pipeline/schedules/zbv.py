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
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    Action,
    Schedule,
    check_sizes,
    check_vpp,
    new_action,
)

NAME = "zbv"


def _rank_ops(pp: int, rank: int, num_slots: int, num_microbatches: int) -> list[Action]:
    """One rank's actions for ``num_slots ≥ 2p−1`` micro-batches, those of micro-batches past
    ``num_microbatches`` dropped (built with :func:`new_action`: 10^5 actions on PP 64)."""
    ops: list[Action] = []
    stages = (rank, 2 * pp - 1 - rank)
    f = [0, 0]  # next forward micro-batch per chunk
    b = [0, 0]  # next input-gradient micro-batch per chunk

    def add(kind: str, chunk: int, mb: int) -> None:
        if mb < num_microbatches:
            ops.append(new_action(kind, mb, stages[chunk]))

    def forward(chunk: int) -> None:
        add(FORWARD, chunk, f[chunk])
        f[chunk] += 1

    def backward_and_weight(chunk: int) -> None:
        add(BACKWARD_INPUT, chunk, b[chunk])
        add(BACKWARD_WEIGHT, chunk, b[chunk])
        b[chunk] += 1

    for _ in range(2 * (pp - rank) - 1):
        forward(0)
    for _ in range(rank):
        forward(1)
        forward(0)
    for _ in range(pp - rank):
        forward(1)
        backward_and_weight(1)
    while f[1] < f[0] or f[0] < num_slots:
        if f[0] < num_slots:
            forward(0)
        backward_and_weight(0)
        forward(1)
        backward_and_weight(1)
    # Drain: input gradients first, weight gradients deferred into the tail.
    w = list(b)
    for _ in range(rank):
        add(BACKWARD_INPUT, 0, b[0])
        b[0] += 1
        add(BACKWARD_INPUT, 1, b[1])
        b[1] += 1
    for _ in range(pp - rank):
        add(BACKWARD_INPUT, 0, b[0])
        b[0] += 1
        add(BACKWARD_WEIGHT, 0, w[0])
        w[0] += 1
    for mb in range(w[1], b[1]):
        add(BACKWARD_WEIGHT, 1, mb)
    for mb in range(w[0], b[0]):
        add(BACKWARD_WEIGHT, 0, mb)
    return ops


def zbv(pp: int, num_microbatches: int, vpp: int = 2) -> Schedule:
    """Per-rank actions of ZB-V on ``pp`` ranks (``2·pp`` stages)."""
    check_sizes(NAME, pp, num_microbatches)
    check_vpp(NAME, vpp, 2)
    num_slots = max(num_microbatches, 2 * pp - 1)
    return [_rank_ops(pp, rank, num_slots, num_microbatches) for rank in range(pp)]
