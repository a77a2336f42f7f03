"""1F1B, PipeDream-Flush (Narayanan et al., SC'21 §2.2; Megatron-LM's non-interleaved schedule).

Rank ``r`` runs ``min(p−r−1, m)`` warm-up forwards, then alternates one forward and one full
backward, then drains the remaining backwards. At most ``min(p−r, m)`` micro-batches are in
flight on rank ``r``; bubble ``(p−1)(F+B+W)``.
"""

from __future__ import annotations

from planner.pipeline.schedules.actions import (
    FORWARD,
    FULL_BACKWARD,
    Schedule,
    check_sizes,
    check_vpp,
    in_rounds,
)

NAME = "1f1b"


def one_f_one_b(pp: int, num_microbatches: int, vpp: int = 1) -> Schedule:
    """Per-rank actions of 1F1B on ``pp`` ranks (one stage each)."""
    check_sizes(NAME, pp, num_microbatches)
    check_vpp(NAME, vpp, 1)
    schedule: Schedule = []
    for rank in range(pp):
        warmup = min(pp - rank - 1, num_microbatches)
        steady = num_microbatches - warmup
        forward, backward = (FORWARD, rank), (FULL_BACKWARD, rank)
        schedule.append(
            in_rounds(
                [
                    ((forward,), warmup, (0,)),
                    ((forward, backward), steady, (warmup, 0)),
                    ((backward,), warmup, (steady,)),
                ]
            )
        )
    return schedule
