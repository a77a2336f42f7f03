"""O(1) step time, bubble and in-flight activations of each schedule, numpy-vectorized.

The search screens thousands of layouts with these and refines the best with the event
simulator (:mod:`planner.pipeline.simulate`). Every argument may be a numpy array (they broadcast).
``f``, ``b``, ``w`` are one micro-batch's forward, input-gradient and weight-gradient time
through one rank's whole share of layers; a chunk takes ``1/vpp`` of them (DualPipe: a whole
share). ``comm`` is one point-to-point hop; ``overlap_fb`` DualPipe's F&B overlap (0–1). ``pp``,
``num_microbatches`` and ``vpp`` may be arrays too (one row each, as the search passes
them); :func:`activation_microbatches_at` gives in-flight micro-batches at given ranks.
``bubble = step time − busiest rank's busy time``, the simulator's definition.

Each step time is the longest of a few critical paths of the generated order: every term
below is one path (counts of F, B, W, hops on it), found by differentiating the simulator's
makespan and checked against it in ``tests/pipeline/test_schedules_closed_form.py``. Where the
published form is one of these paths it is named. Exact at ``comm = 0`` within the ranges
below; with ``comm > 0`` the hop counts are those of the paths that dominate when a hop is
short next to a pass, so the result is exact for GPipe and interleaved 1F1B and otherwise a
lower bound: strict-order schedules with no slack (1F1B, DualPipe's pair chain, ZB-H1 once
``2·comm > W``) also expose hops in their steady state, which only the simulator sees.

=================  ============================================================  ===========
schedule           bubble at comm = 0 (chunk times F, B, W; p = pp)              exact for
=================  ============================================================  ===========
gpipe, 1f1b        (p−1)(F+B+W) — Megatron / zero-bubble paper                   all m
interleaved-1f1b   (p−1)(F+B+W), chunks of 1/v — Narayanan et al. (p−1)/(v·m)    legal m, N
zb-h1              (p−1)·max(F+B−W, B, F) for m ≥ p (``_zb_h1`` below p); the    all m
                   paper's (p−1)(F+B−W) when W ≤ min(F, B)
zb-h2              (p−1)·max(F+B−2W, B−F, F): the paper's per-rank-span form     m ≥ 2p−1
                   (p−1)(F+B−2W) plus the parallelogram's (p−1)F skew
zbv                max of 8 paths (``_zbv``); 0 per rank span at F=B=W           m ≥ 2p−1
dualpipe(v)        H = S/2 (S stages), Q = overlap·min(F, B+W): (H−2)F + (H−1)B  m ≥ 2·pp
                   − (2H−3)Q + max(0, HF − (H−1)B) + (H−1)·max(0, B−W); the
                   README's (H−1)(F&B + B_full − 3W) when F = B ≥ W and Q = 0
                   or H = 2 (DualPipe pp 4, DualPipeV pp 2); H ≥ 2 (0 at H = 1)
=================  ============================================================  ===========

ZB-H2 and ZB-V with fewer than ``2p−1`` micro-batches drop actions from the ``2p−1``
schedule, which never delays any, so at ``comm = 0`` the value returned (that schedule's
step time) is an upper bound; with ``comm > 0`` there it is only an estimate.

Peak activations (:func:`peak_activation_microbatches`) are per rank, in micro-batches of
one rank's whole share of layers; they match the simulator's ``peak_activations``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from hwspecs.errors import PlanError
from planner.pipeline.schedules.interleaved import check_group_size
from planner.pipeline.schedules.registry import get_schedule


def parameter_copies(schedule: str) -> int:
    """Weight copies per rank: 2 for bidirectional DualPipe (DeepSeek-V3 §3.2.1), else 1."""
    return get_schedule(schedule).parameter_copies


def chunks_per_rank(schedule: str, vpp: int | None = None) -> int:
    """How many chunks one rank's per-micro-batch work is split into (DualPipe: 1)."""
    return get_schedule(schedule).chunks_per_rank(vpp)


def _fill_drain(p, F, B, W, c, hops):
    return (p - 1) * (F + B + W) + hops * c


def _zb_h1(p, m, F, B, W, c):
    """Three paths: F and B chains with the lagged W between, the B chain, the F chain."""
    chain, lead = m + p - 1, np.maximum(m, p)
    hops_fb = 2 * (p - 1) + 2 * np.minimum(np.maximum(m - 2, 0), p - 1)
    hops_f = np.where(m > p, 3 * (p - 1), np.maximum(2 * p - 5 + m, 0))
    both = chain * (F + B) + np.maximum(1, m - p + 1) * W + hops_fb * c
    backward = lead * F + chain * B + m * W + 2 * (p - 1) * c
    forward = chain * F + lead * B + m * W + hops_f * c
    return np.maximum(np.maximum(both, backward), forward)


def _zb_h2(p, F, B, W, c):
    paths = np.maximum(
        np.maximum(B - F + 2 * c, 3 * c - B), np.maximum(F + c, F + B - 2 * W + 2 * c)
    )
    return (p - 1) * paths


def _zbv(p, F, B, W, c):
    """Eight critical paths of the ZB-V order (chunk times), as (F, B, W, hop) counts."""
    paths = (
        (0, 1, p - 2, 3 * (p - 1)),
        (0, p - 1, 0, 5 * p - 7),
        (0, 2 * p - 2, -(2 * p - 2), 6 * p - 8),
        (1, 0, p - 2, 3 * p - 5),
        (2 * p - 3, -(p - 2), 0, 3 * p - 5),
        (2 * p - 3, 1, -(2 * p - 2), 4 * p - 6),
        (2 * p - 2, -(p - 1), -1, 3 * (p - 1)),
        (2 * p - 2, 0, -(2 * p - 1), 4 * (p - 1)),
    )
    best = None
    for nf, nb, nw, nc in paths:
        term = nf * F + nb * B + nw * W + nc * c
        best = term if best is None else np.maximum(best, term)
    return best


def _pair(F, B, W, overlap):
    """One F&B slot: a forward and a full backward, ``overlap`` of the shorter hidden."""
    full = B + W
    return F + full - overlap * np.minimum(F, full)


def _dualpipe_step(half, per_phase, F, B, W, c, overlap, hops):
    """Makespan of DualPipe's eight steps on ``2·half`` positions (chunk times).

    ``2·per_phase − half − 2`` F&B slots lie on the critical path, plus the warm-up and
    drain passes; the two ``max`` terms pick the forward- or backward-bound drain.
    """
    slots = 2 * per_phase - half - 2
    return (
        slots * _pair(F, B, W, overlap)
        + 2 * half * F
        + (2 * half + 1) * B
        + (half + 2) * W
        + np.maximum(0, half * F - (half - 1) * B)
        + (half - 1) * np.maximum(0, B - W)
        + hops * c
    )


def _fewest_pairs(half, per_phase):
    """F&B pairs on the rank with fewest (an end rank): steps 4 and 5 of the reference
    ``DualPipe.step`` give ``2·(per_phase − 2·half + position + 1) + (half − position − 1)``
    at position 0, less the middle ranks' one unoverlapped pair when ``half = 1``."""
    return 2 * per_phase - 3 * half + 1 - (half == 1)


def dualpipe_paired_share(pp, num_microbatches, chunks):
    """Share of a DualPipe(V) rank's forward chunks that run inside an F&B pair, on the rank
    with fewest pairs: ``chunks = 1`` DualPipe (``pp/2`` positions, ``m/2`` micro-batches
    per direction), ``2`` DualPipeV (``pp`` positions, ``m`` per phase). The other chunks —
    warm-up forwards, drain backwards — run alone, so nothing overlaps their all-to-alls.
    Works on numpy arrays; 0 where the schedule has no pairs."""
    half = np.asarray(pp) * chunks // 2
    per_phase = np.asarray(num_microbatches) * chunks // 2
    with np.errstate(divide="ignore", invalid="ignore"):
        share = _fewest_pairs(half, per_phase) / (2.0 * per_phase)
    return np.clip(np.nan_to_num(share), 0.0, 1.0)


def combined_1f1b_paired_share(pp, num_microbatches, vpp):
    """Share of the first rank's forward chunks that Megatron-Core's combined 1F1B
    (``overlap_moe_expert_parallel_comm``) runs beside another micro-batch's backward, whose
    EP all-to-alls each hides behind the other's compute: interleaved 1F1B warms up
    ``2·(pp − 1) + (vpp − 1)·pp + 1`` chunks on rank 0 (the group size per virtual stage is
    pp, and the overlap adds one; NVIDIA/Megatron-LM ``pipeline_parallel/schedules.py``
    ``get_pp_rank_microbatches``), the warm-up forwards and the drain backwards run alone;
    without pipelining the first forward and the last backward do
    (``combined_1f1b_schedule_for_no_pipelining``): ``(m − 1)/m``. Where it runs at all is
    :func:`planner.comm.rows.runs_combined_1f1b`. Works on numpy arrays."""
    pp, m, vpp = (np.asarray(x) for x in (pp, num_microbatches, vpp))
    warm_up = 2 * (pp - 1) + (vpp - 1) * pp + 1
    with np.errstate(divide="ignore", invalid="ignore"):
        share = 1.0 - warm_up / (m * vpp)
    return np.clip(np.nan_to_num(share), 0.0, 1.0)


def _dualpipe_busy(half, per_phase, F, B, W, overlap):
    """Busiest rank: all its passes minus what overlap hides in its fewest F&B slots."""
    full = B + W
    pairs = _fewest_pairs(half, per_phase)
    return 2 * per_phase * (F + full) - pairs * overlap * np.minimum(F, full)


def _check(schedule: str, pp, num_microbatches, vpp, **options):
    """Validate like the generator does (same one-line errors) and return the vpp.

    With array arguments the rules are checked on every row at once and the first row that
    breaks one raises its scalar error.
    """
    if np.ndim(pp) or np.ndim(num_microbatches) or np.ndim(vpp):
        return _check_rows(schedule, pp, num_microbatches, vpp, **options)
    spec = get_schedule(schedule)
    vpp = spec.resolve_vpp(vpp)
    group = options.get("microbatch_group_size")
    if schedule == "interleaved-1f1b" and group is not None:
        check_group_size(pp, num_microbatches, group)  # Llama 3's N replaces the m rule
    else:
        spec.check_microbatches(pp, num_microbatches)
    return vpp


def _check_rows(schedule: str, pp, num_microbatches, vpp, **options) -> np.ndarray:
    """:func:`_check` on array rows: the vpp column (the default where ``vpp`` is None)."""
    spec = get_schedule(schedule)
    p, m = np.asarray(pp), np.asarray(num_microbatches)
    v = np.asarray(spec.default_vpp if vpp is None else vpp)
    p, m, v = np.broadcast_arrays(p, m, v)
    bad = v != spec.fixed_vpp if spec.fixed_vpp is not None else v < spec.min_vpp
    if schedule == "interleaved-1f1b" and options.get("microbatch_group_size") is not None:
        bad = np.ones(p.shape, dtype=bool)  # a group size: check each row the scalar way
    else:
        bad = bad | spec.broken_microbatches(p, m)
    for row in np.flatnonzero(bad.ravel()):  # raises on the first broken row
        index = np.unravel_index(row, p.shape)
        _check(schedule, int(p[index]), int(m[index]), int(v[index]), **options)
    return v


def _chunks(schedule: str, vpp):
    """:func:`chunks_per_rank` for a checked vpp (scalar or array)."""
    return 1 if get_schedule(schedule).bidirectional else vpp


def step_time(
    schedule: str,
    pp: int,
    num_microbatches: int,
    vpp: int | None = None,
    f: ArrayLike = 1.0,
    b: ArrayLike = 1.0,
    w: ArrayLike = 1.0,
    comm: ArrayLike = 0.0,
    overlap_fb: ArrayLike = 0.0,
    **options: int,
) -> np.ndarray:
    """Makespan of one step of ``schedule`` (see the module table for exactness)."""
    vpp = _check(schedule, pp, num_microbatches, vpp, **options)
    chunks = _chunks(schedule, vpp)
    F, B, W = (np.asarray(x, dtype=float) / chunks for x in (f, b, w))
    c = np.asarray(comm, dtype=float)
    p, m = pp, num_microbatches
    work = m * chunks * (F + B + W)
    if schedule in ("gpipe", "1f1b"):
        return work + _fill_drain(p, F, B, W, c, 2 * (p - 1))
    if schedule == "interleaved-1f1b":
        hops = np.where(p > 1, 2 * (vpp * p - 1), 0)  # every stage boundary crosses ranks
        return work + _fill_drain(p, F, B, W, c, hops)
    if schedule == "zb-h1":
        return _zb_h1(p, m, F, B, W, c)
    # ZB-H2 and ZB-V are built for max(m, 2p−1) micro-batches and drop the missing ones;
    # with fewer than 2p−1 the full schedule's step time bounds theirs from above.
    slots = np.maximum(m, 2 * p - 1)
    if schedule == "zb-h2":
        return slots * (F + B + W) + _zb_h2(p, F, B, W, c)
    if schedule == "zbv":  # at pp = 1 both chunks sit on one rank: no pipeline, no bubble
        return np.where(p == 1, work, slots * chunks * (F + B + W) + _zbv(p, F, B, W, c))
    if schedule == "dualpipe":
        return _dualpipe_step(p // 2, m // 2, F, B, W, c, overlap_fb, 2 * (p - 1))
    if schedule == "dualpipev":
        # The V's bottom hop stays on rank 0: fewest hops on a critical path, at m = 2p.
        hops = np.maximum(np.minimum(4 * (p - 1), 5 * p - 7), 0)
        return _dualpipe_step(p, m, F, B, W, c, overlap_fb, hops)
    raise PlanError(f"no closed form for schedule '{schedule}'")


def busy_time(
    schedule: str,
    pp: int,
    num_microbatches: int,
    vpp: int | None = None,
    f: ArrayLike = 1.0,
    b: ArrayLike = 1.0,
    w: ArrayLike = 1.0,
    overlap_fb: ArrayLike = 0.0,
    **options: int,
) -> np.ndarray:
    """The busiest rank's compute time (the bubble-free step time)."""
    vpp = _check(schedule, pp, num_microbatches, vpp, **options)
    chunks = _chunks(schedule, vpp)
    F, B, W = (np.asarray(x, dtype=float) / chunks for x in (f, b, w))
    if schedule == "dualpipe":
        return _dualpipe_busy(pp // 2, num_microbatches // 2, F, B, W, overlap_fb)
    if schedule == "dualpipev":
        return _dualpipe_busy(pp, num_microbatches, F, B, W, overlap_fb)
    return num_microbatches * chunks * (F + B + W)


def bubble_time(
    schedule: str,
    pp: int,
    num_microbatches: int,
    vpp: int | None = None,
    f: ArrayLike = 1.0,
    b: ArrayLike = 1.0,
    w: ArrayLike = 1.0,
    comm: ArrayLike = 0.0,
    overlap_fb: ArrayLike = 0.0,
    **options: int,
) -> np.ndarray:
    """``step_time − busy_time``: idle time of the busiest rank."""
    total = step_time(schedule, pp, num_microbatches, vpp, f, b, w, comm, overlap_fb, **options)
    busy = busy_time(schedule, pp, num_microbatches, vpp, f, b, w, overlap_fb, **options)
    return total - busy


def peak_activation_microbatches(
    schedule: str, pp: int, num_microbatches: int, vpp: int | None = None, **options: int
) -> np.ndarray:
    """Most micro-batches whose activations a rank holds at once, per rank (shape ``(pp,)``).

    Units: one micro-batch through the rank's whole share of layers (a chunk counts
    ``1/vpp``); what waits only for ``W`` is not counted. GPipe ``m``; 1F1B and ZB-H1
    ``min(p−r, m)`` (Narayanan et al.; zero-bubble paper Table 2); ZB-H2
    ``min(2(p−r)−1, m)``; interleaved ``min(2(p−r−1) + (v−1)N + 1, v·m)/v`` (Megatron's
    warm-up plus one; rank 0 holds ``p + (p−1)/v`` when N = p, Korthikanti et al.'s
    ``1 + (p−1)/(p·v)`` factor); ZB-V ``p``; DualPipe ``p+1`` and DualPipeV ``p + 1/2``
    (the README's PP+1 stages of ``1/(2p)`` of the model each).
    """
    return activation_microbatches_at(schedule, pp, num_microbatches, vpp, np.arange(pp), **options)


def activation_microbatches_at(
    schedule: str, pp, num_microbatches, vpp, rank, **options: int
) -> np.ndarray:
    """:func:`peak_activation_microbatches` of the given ``rank`` s only (arrays broadcast)."""
    vpp = _check(schedule, pp, num_microbatches, vpp, **options)
    p, m = pp, num_microbatches
    shape = np.broadcast(p, m, vpp, rank).shape
    if schedule == "gpipe":
        return np.broadcast_to(np.asarray(m, dtype=float), shape).copy()
    if schedule in ("1f1b", "zb-h1"):
        return np.minimum(p - rank, m).astype(float)
    if schedule == "zb-h2":
        return np.minimum(2 * (p - rank) - 1, m).astype(float)
    if schedule == "interleaved-1f1b":
        if np.ndim(p) or np.ndim(m):
            group = options.get("microbatch_group_size") or p  # rows checked above
        else:
            group = check_group_size(p, m, options.get("microbatch_group_size"))
        warmup = 2 * (p - rank - 1) + (vpp - 1) * group
        return np.minimum(warmup + 1, vpp * m) / vpp
    if schedule == "zbv":
        return np.broadcast_to(np.minimum(p, m).astype(float), shape).copy()
    if schedule == "dualpipe":
        return np.broadcast_to(np.asarray(p + 1, dtype=float), shape).copy()
    if schedule == "dualpipev":
        return np.broadcast_to(np.asarray(p + 0.5, dtype=float), shape).copy()
    raise PlanError(f"no closed form for schedule '{schedule}'")


def peak_activation_units(
    schedule: str, pp, num_microbatches, vpp, rank, weight_ratio, **options: int
) -> np.ndarray:
    """Most activations a rank holds at once, in micro-batches' worth (F-to-B units), when a
    micro-batch past ``B`` that still waits for ``W`` holds ``weight_ratio`` of what it held
    between ``F`` and ``B`` (the zero-bubble paper's ``M_W / M_B``, Qi et al. 2023 §2).

    A rank's memory is ``a·M_B + b·M_W`` with ``a`` micro-batches between F and B and ``b``
    past B; its peak over the step is the largest ``a + ρ·b`` (ρ = ``weight_ratio``) over
    the ``(a, b)`` pairs the rank passes through, which at F = B = W are (rank ``r``, ``p``
    ranks, chunks of 1/2 for the V shapes; checked against the simulator):

    * ZB-H1: ``(p−r, r)``, ``(p−r−1, r+1)``; ZB-H2: ``(2(p−r)−1, 2r)``, ``(2(p−r)−2, 2r+1)``;
    * ZB-V: ``(p, 0)``, ``(p − 1/2, 1/2)`` and the line ``a + b = (p+r)/2`` for
      ``b`` from 1 to ``r + 1/2``; DualPipeV: ``(p + 1/2, 0)``, ``(p − 1/2, 1/2)`` and
      ``a + b = p/2`` for ``b`` from 1 to ``(r+1)/2``.

    Schedules without a separate W (and DualPipe, whose two directions hold different
    stages: :func:`planner.cost.memory.dualpipe_activations`) return
    :func:`activation_microbatches_at`. Exact for ``m ≥ 2p − 1``; with fewer micro-batches
    (capped at ``m·max(1, ρ)``) an upper bound.
    """
    base = activation_microbatches_at(schedule, pp, num_microbatches, vpp, rank, **options)
    rho = np.asarray(weight_ratio, dtype=float)
    p, r = np.asarray(pp, dtype=float), np.asarray(rank, dtype=float)
    if schedule == "zb-h1":
        peak = np.maximum(p - r + rho * r, p - r - 1 + rho * (r + 1))
    elif schedule == "zb-h2":
        peak = np.maximum(2 * (p - r) - 1 + rho * 2 * r, 2 * (p - r) - 2 + rho * (2 * r + 1))
    elif schedule in ("zbv", "dualpipev"):
        line, last = ((p + r) / 2, r + 0.5) if schedule == "zbv" else (p / 2, (r + 1) / 2)
        on_line = np.where((rho > 1) & (last >= 1), line + (rho - 1) * last, 0.0)
        top = np.where(schedule == "zbv", p, p + 0.5)  # nothing waits for W
        # (p − 1/2, 1/2); a one-rank DualPipeV runs its W only after both chunks' B: (0, 1/2).
        second = np.where((schedule == "dualpipev") & (p == 1), 0.0, p - 0.5)
        peak = np.maximum(np.maximum(top, second + 0.5 * rho), on_line)
    else:
        return base
    # At most m micro-batches are in flight: a + ρ·b ≤ m·max(1, ρ) (binds only below 2p−1).
    return np.minimum(peak, np.asarray(num_microbatches) * np.maximum(1.0, rho))
