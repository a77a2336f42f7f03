"""DualPipe and DualPipeV (DeepSeek-V3, arXiv 2412.19437 §3.2.1; deepseek-ai/DualPipe).

Both run the reference implementation's eight steps on every rank: forwards of the near
chunk, forwards of both, input-gradient/weight/forward triples, the main loop of overlapped
forward-and-backward pairs (``F&B``), backwards with the far chunk's pairs, then backwards
whose weight gradients (zero-bubble style) fill the tail. The backward in an ``F&B`` pair is
a full backward (``BW``); ``Action.fb_pair`` marks both members.

**DualPipe** (``pp`` ranks, ``pp`` even): two pipelines in opposite directions over the same
``pp`` stages. Half of the ``m`` micro-batches enter at rank 0, half at rank ``pp−1``; rank
``r`` holds stage ``r`` of the first direction and stage ``pp−1−r`` of the second, a second
copy of parameters. *Direction is encoded in the micro-batch id*: ids ``0 … m/2−1`` flow
down (stage ``s`` on rank ``s``), ids ``m/2 … m−1`` flow up (stage ``s`` on rank
``pp−1−s``). ``stage_index`` is the position along the micro-batch's own pipeline, so every
dependency reads the same in both directions. Each chunk is a whole stage (``vpp = 1``).

**DualPipeV** (``pp`` ranks, ``2·pp`` stages, torch's ``ScheduleDualPipeV`` convention): the
DualPipe schedule "cut in half" into a V, rank ``r`` holding stages ``r`` and ``2·pp−1−r``
(``vpp = 2``). The DualPipe README counts PP as stages, so its DualPipeV on "PP/2 devices"
is ``pp = PP/2`` ranks here, and its "2× parameters" compares against 1F1B on PP devices;
per rank DualPipeV holds one copy (two half-size chunks), like ZB-V.

Bubble (README table, chunk times, B = full backward): ``(S/2−1)(F&B + B − 3W)`` with S the
stage count, i.e. ``(pp/2−1)`` DualPipe and ``(pp−1)`` DualPipeV. The simulator agrees only
where a chunk's forward equals its input gradient; ``closed_form`` has the exact form.
Peak activations: ``pp+1`` chunks (DualPipe) and ``2·pp+1`` half chunks (DualPipeV).
"""

from __future__ import annotations

from collections import deque

from planner.pipeline.schedules.actions import (
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    FULL_BACKWARD,
    Schedule,
    as_actions,
    check_sizes,
    check_vpp,
    require,
)

DUALPIPE = "dualpipe"
DUALPIPEV = "dualpipev"

#: (kind, phase, micro-batch within the phase, fb_pair). Phase 0 is the chunk that sits
#: ``position`` stages from its pipeline's entry, phase 1 the one as far from its exit.
_Op = tuple[str, int, int, bool]


def _rank_ops(num_half: int, position: int, per_phase: int) -> list[_Op]:
    """One rank's eight steps (deepseek-ai/DualPipe ``DualPipe.step``), ``H = num_half``."""
    ops: list[_Op] = []
    f = [0, 0]
    b = [0, 0]
    pending_w: deque[tuple[int, int]] = deque()

    def forward(phase: int, pair: bool = False) -> None:
        ops.append((FORWARD, phase, f[phase], pair))
        f[phase] += 1

    def backward(phase: int, zero_bubble: bool, pair: bool = False) -> None:
        if zero_bubble:
            ops.append((BACKWARD_INPUT, phase, b[phase], pair))
            pending_w.append((phase, b[phase]))
        else:
            ops.append((FULL_BACKWARD, phase, b[phase], pair))
        b[phase] += 1

    def weight() -> None:
        phase, mb = pending_w.popleft()
        ops.append((BACKWARD_WEIGHT, phase, mb, False))

    def overlapped(forward_phase: int, backward_phase: int) -> None:
        forward(forward_phase, pair=True)
        backward(backward_phase, zero_bubble=False, pair=True)

    far = num_half - position - 1
    for _ in range(2 * far):  # step 1: F0
        forward(0)
    for _ in range(position + 1):  # step 2: F0 F1
        forward(0)
        forward(1)
    for _ in range(far):  # step 3: B1 W F1
        backward(1, zero_bubble=True)
        weight()
        forward(1)
    for i in range(per_phase - 2 * num_half + position + 1):  # step 4: F0&B1, F1&B0
        if i == 0 and position == num_half - 1:
            forward(0)  # the middle ranks run this pair unoverlapped to shorten the bubble
            backward(1, zero_bubble=False)
        else:
            overlapped(0, 1)
        overlapped(1, 0)
    for _ in range(far):  # step 5: B1, F1&B0
        backward(1, zero_bubble=False)
        overlapped(1, 0)
    zero_bubble = False
    for i in range(position + 1):  # step 6: B1 B0, the second half split
        if i == (position + 1) // 2 and position % 2 == 1:
            zero_bubble = True
        backward(1, zero_bubble)
        if i == (position + 1) // 2 and position % 2 == 0:
            zero_bubble = True
        backward(0, zero_bubble)
    for _ in range(far):  # step 7: W B0
        weight()
        backward(0, zero_bubble=True)
    for _ in range(position + 1):  # step 8: W
        weight()
    return ops


def dualpipe(pp: int, num_microbatches: int, vpp: int = 1) -> Schedule:
    """Per-rank actions of bidirectional DualPipe on ``pp`` ranks."""
    check_sizes(DUALPIPE, pp, num_microbatches)
    check_vpp(DUALPIPE, vpp, 1)
    require(pp % 2 == 0, f"{DUALPIPE} needs an even pp, got pp={pp}")
    require(
        num_microbatches % 2 == 0 and num_microbatches >= 2 * pp,
        f"{DUALPIPE} needs an even num_microbatches ≥ 2·pp = {2 * pp}, got {num_microbatches}",
    )
    half = pp // 2
    per_direction = num_microbatches // 2
    schedule: Schedule = []
    for rank in range(pp):
        second_half = rank >= half
        position = min(rank, pp - 1 - rank)
        # By direction, then by phase (direction ^ second half): the direction's first
        # micro-batch id and its stage on this rank.
        first, stage = (0, per_direction), (rank, pp - 1 - rank)
        if second_half:
            first, stage = first[::-1], stage[::-1]
        schedule.append(
            as_actions(
                (kind, first[phase] + mb, stage[phase], pair)
                for kind, phase, mb, pair in _rank_ops(half, position, per_direction)
            )
        )
    return schedule


def dualpipev(pp: int, num_microbatches: int, vpp: int = 2) -> Schedule:
    """Per-rank actions of DualPipeV on ``pp`` ranks (``2·pp`` stages in a V)."""
    check_sizes(DUALPIPEV, pp, num_microbatches)
    check_vpp(DUALPIPEV, vpp, 2)
    require(
        num_microbatches >= 2 * pp,
        f"{DUALPIPEV} needs num_microbatches ≥ 2·pp = {2 * pp} (the number of stages), "
        f"got {num_microbatches}",
    )
    schedule: Schedule = []
    for rank in range(pp):
        stages = (rank, 2 * pp - 1 - rank)
        schedule.append(
            as_actions(
                (kind, mb, stages[phase], pair)
                for kind, phase, mb, pair in _rank_ops(pp, rank, num_microbatches)
            )
        )
    return schedule


def direction_of(microbatch: int, num_microbatches: int) -> int:
    """DualPipe: 0 for micro-batches entering at rank 0, 1 for those entering at rank pp−1."""
    return int(microbatch >= num_microbatches // 2)
