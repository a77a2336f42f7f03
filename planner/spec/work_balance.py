"""The work-balanced layer split (``--pipeline-layer-split work-balanced``): the split of a
model's layers over its virtual stages whose busiest pipeline rank does the least work,
counting the first and the last stage's work beyond their layers (embedding, LM head, MTP
modules: :func:`planner.spec.layout.end_stage_work`).

Every candidate split of one pipeline is costed at once, and each pipeline once per process
(:func:`_work_balanced`); a search asks for every (pp, vpp, schedule) it holds.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from planner.pipeline.schedules.registry import BIDIRECTIONAL_SCHEDULES
from planner.spec.layout import layers_per_virtual_stage, virtual_stage_ranks


def work_balanced_layers(
    num_layers: int, pp: int, vpp: int, ends: tuple[float, float], schedule: str
) -> np.ndarray:
    """The split whose busiest pipeline rank does the least work, counting each stage's
    layers plus ``ends`` (the first and the last stage's extra work, in layers).

    Candidates give the first and the last virtual stage ``a`` and ``b`` layers (each 0 to
    ⌊L/S⌋ + ⌈e₀ + e₁⌉ + 1) and spread the rest over the middle stages as ``balanced`` does
    (Megatron-LM's ``--decoder-first/last-pipeline-num-layers``), and, where a rank holds
    several stages, also with each extra layer on the least busy rank. A rank's work is the sum
    of its stages' (``schedule``'s placement: interleaved, V-shape), DualPipe's the mean of
    its two directions'. Ties keep the ``auto`` split, then the candidate nearest it: a
    model whose ends are light keeps ``auto``'s split. Legal wherever ``auto`` is.
    """
    return _work_balanced(num_layers, pp, vpp, tuple(float(e) for e in ends), schedule).copy()


@lru_cache(maxsize=4096)
def _work_balanced(num_layers: int, pp: int, vpp: int, ends: tuple, schedule: str) -> np.ndarray:
    """:func:`work_balanced_layers`, once per distinct argument (every candidate at once)."""
    stages = pp * vpp
    auto = layers_per_virtual_stage(num_layers, pp, vpp, "auto")  # raises where auto does
    if stages == 1:
        return auto
    most = min(num_layers, num_layers // stages + int(np.ceil(sum(ends))) + 1)
    first, last = (a.ravel() for a in np.meshgrid(np.arange(most + 1), np.arange(most + 1)))
    middle = num_layers - first - last
    inner = stages - 2
    keep = middle >= inner if inner else middle == 0
    first, last, middle = first[keep], last[keep], middle[keep]
    layers = np.zeros((len(first), stages), dtype=np.int64)
    layers[:, 0], layers[:, -1] = first, last
    spread = None
    if inner:  # as ``balanced``: the L mod S extra layers on the middle stages
        extra = middle % inner
        begin = (inner - extra) // 2
        slot = np.arange(inner)
        spread = layers.copy()
        spread[:, 1:-1] = (middle // inner)[:, None]
        layers[:, 1:-1] = (middle // inner)[:, None] + (
            (slot >= begin[:, None]) & (slot < (begin + extra)[:, None])
        )
    paired = vpp > 1 or schedule in BIDIRECTIONAL_SCHEDULES
    if spread is not None and paired:  # and with each extra layer on the least busy rank
        spread = _extras_on_least_busy_ranks(spread, extra, ends, pp, vpp, schedule)
        layers = np.vstack([layers, spread])
    layers = np.vstack([auto, layers])
    busiest = np.round(busiest_rank_work(layers, ends, pp, vpp, schedule), 9)
    distance = np.abs(layers - auto).sum(axis=1)
    best = layers[np.lexsort((distance, busiest))[0]]
    best.flags.writeable = False
    return best


def _extras_on_least_busy_ranks(layers, extra, ends, pp: int, vpp: int, schedule: str):
    """``layers`` ([candidate, stage]) with ``extra`` more layers each, one at a time on the
    middle stage (at most one each) whose rank does the least work so far, the central
    stage first among equals, then the lower index: where a rank holds several stages
    (interleaved, V-shape, DualPipe's two directions), ``balanced``'s run of extra layers in
    the middle can stack two on one rank.

    Placed at once, not one step per layer (up to 125 for PP 16 with 8 chunks): a layer on
    a stage adds ``step`` to its rank's work and to no other's (DualPipe, the mean of two
    directions: half to the rank and half to its mirror, whose work is the same, so the two
    act as one; a rank that is its own mirror holds one stage). So each rank (DualPipe: each
    pair) takes its middle stages in a fixed order, the most central first, and the
    ``j``-th (from 0) goes when the work is the work now plus ``j·step``: its key, with its
    centre·10⁻⁶. A rank's keys rise with ``j``, so one at a time takes the stages in the
    order of their keys, ties to the lower stage index: each candidate's first ``extra``
    stages by that order get a layer. ``tests/spec/test_layer_split.py`` holds this equal
    to placing them one step at a time."""
    layers = layers.copy()
    stages = layers.shape[1]
    centre = np.abs(np.arange(stages) - (stages - 1) / 2)
    middle = np.arange(1, stages - 1)
    rank = virtual_stage_ranks(schedule, pp, vpp)[middle]
    unit, step = rank, 1.0
    if schedule in BIDIRECTIONAL_SCHEDULES:
        unit, step = np.minimum(rank, pp - 1 - rank), 0.5
    # Each middle stage's place among its unit's middle stages, in the order they are taken.
    by_unit = np.lexsort((middle, centre[middle], unit))
    units = unit[by_unit]
    place = np.empty(len(middle), dtype=np.int64)
    place[by_unit] = np.arange(len(middle)) - np.searchsorted(units, units)
    work = rank_work(layers, ends, pp, vpp, schedule)[:, rank] + place * step
    keys = work + centre[middle] * 1e-6
    order = np.argsort(keys, axis=1, kind="stable")  # ties: the lower stage index first
    chosen = np.arange(len(middle)) < extra[:, None]
    rows = np.repeat(np.arange(len(layers)), extra)
    layers[rows, middle[order[chosen]]] += 1
    return layers


def rank_work(layers, ends: tuple[float, float], pp: int, vpp: int, schedule: str):
    """Each pipeline rank's work per micro-batch, in layers ([..., rank]), of each split in
    ``layers`` ([..., stage]): its stages' layers plus ``ends`` on the first and the last
    stage, summed over the rank's stages as ``schedule`` places them (DualPipe: the mean of
    its two directions)."""
    work = np.asarray(layers, dtype=float).copy()
    work[..., 0] += ends[0]
    work[..., -1] += ends[1]
    per_rank = work @ (virtual_stage_ranks(schedule, pp, vpp)[:, None] == np.arange(pp))
    if schedule in BIDIRECTIONAL_SCHEDULES:
        per_rank = (per_rank + per_rank[..., ::-1]) / 2
    return per_rank


def busiest_rank_work(layers, ends: tuple[float, float], pp: int, vpp: int, schedule: str):
    """The most work a pipeline rank does per micro-batch (:func:`rank_work`), per split."""
    return rank_work(layers, ends, pp, vpp, schedule).max(axis=-1)
