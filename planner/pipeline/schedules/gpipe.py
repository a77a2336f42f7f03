"""GPipe (Huang et al., NeurIPS 2019): every forward, then every backward.

Each rank runs the forward of all ``m`` micro-batches, then their full backward in the same
micro-batch order (as torch.distributed.pipelining's ``ScheduleGPipe`` does). Bubble
``(p−1)(F+B+W)``; every rank holds the activations of all ``m`` micro-batches.
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

NAME = "gpipe"


def gpipe(pp: int, num_microbatches: int, vpp: int = 1) -> Schedule:
    """Per-rank actions of GPipe on ``pp`` ranks (one stage each)."""
    check_sizes(NAME, pp, num_microbatches)
    check_vpp(NAME, vpp, 1)
    return [
        in_rounds(
            [
                (((FORWARD, rank),), num_microbatches, (0,)),
                (((FULL_BACKWARD, rank),), num_microbatches, (0,)),
            ]
        )
        for rank in range(pp)
    ]
