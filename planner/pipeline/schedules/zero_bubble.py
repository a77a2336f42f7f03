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

from itertools import pairwise

from planner.pipeline.schedules.actions import (
    SPLIT_KINDS,
    Action,
    Schedule,
    check_sizes,
    check_vpp,
    in_rounds,
)

ZB_H1 = "zb-h1"
ZB_H2 = "zb-h2"


def _rank_ops(
    rank: int, num_microbatches: int, warmup: int, weight_lag: int, forward_first: bool
) -> list[Action]:
    """Warm-up forwards, then one forward and one input gradient per step (forward first
    or last), each input gradient followed by the weight gradient ``weight_lag`` behind.

    Round ``k`` runs ``B(k)``, after it ``W(k − lag)`` once ``k ≥ lag``, and ``F(warmup + k)``
    while forwards remain; the rounds are cut into blocks where either changes (:func:`in_rounds`).
    """
    m, lag = num_microbatches, weight_lag
    steady = m - warmup  # rounds with a forward
    forward, backward, weight = ((kind, rank) for kind in SPLIT_KINDS)
    blocks = [((forward,), warmup, (0,))]
    for lo, hi in pairwise(sorted({0, steady, min(lag, m), m})):
        pattern, firsts = [backward], [lo]
        if lo >= lag:
            pattern.append(weight)
            firsts.append(lo - lag)
        if lo < steady:
            pattern.insert(0 if forward_first else len(pattern), forward)
            firsts.insert(0 if forward_first else len(firsts), warmup + lo)
        blocks.append((pattern, hi - lo, firsts))
    blocks.append(((weight,), min(lag, m), (max(m - lag, 0),)))
    return in_rounds(blocks)


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
    schedule = [
        _rank_ops(rank, num_slots, 2 * (pp - rank) - 1, 2 * rank, False) for rank in range(pp)
    ]
    if num_microbatches < num_slots:
        schedule = [[a for a in ops if a.microbatch < num_microbatches] for ops in schedule]
    return schedule
