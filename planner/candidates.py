"""The layouts the search screens, as numpy columns: the search space (the values each knob
may take), the screening grid over the degrees, schedules, micro-batch sizes and sequence
parallelism (factored over those four axes; no Python loop per candidate), the rule table
on it (:mod:`planner.spec.rules`, the same table :func:`planner.spec.rules.check_layout`
reads: each rule once per distinct combination of the columns it reads,
:func:`first_rejections`), and the survivors expanded over every ZeRO stage and recompute
policy.

The degrees are the cartesian product of tp, cp, pp with dp filling the GPU count; ep for MoE
models, and with tp > 1 the routed experts' TP degree etp ∈ {tp, 1} (Megatron-Core's MoE
parallel folding); each degree row once per CP algorithm where cp > 1
(:mod:`planner.cp_search`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from hwspecs.schema import Cluster
from planner.columns.codes import Labels, code_dtype, distinct_rows, narrow_codes
from planner.cp_inner import with_cp_inner
from planner.cp_search import (
    DEGENERATE_HIERARCHY,
    degenerate_hierarchy,
    hierarchical_inner_degrees,
    with_cp_algorithm,
)
from planner.pipeline.schedules import SCHEDULES
from planner.spec.job import Job
from planner.spec.layout import CP_ALGORITHMS, CpAlgorithm, LayerSplit
from planner.spec.rules import RULES, schedule_rules


class SearchSpace(BaseModel):
    """Values each knob may take; a knob given by the user pins it to those values."""

    model_config = ConfigDict(extra="forbid")

    tp: list[int] | None = None
    cp: list[int] | None = None
    pp: list[int] | None = None
    dp: list[int] | None = None
    ep: list[int] | None = None
    #: The routed experts' TP degree (1 or tp); default for MoE models: both, else tp.
    etp: list[int] | None = None
    vpp: list[int] | None = None
    micro_batch_size: list[int] = Field(default_factory=lambda: [1, 2, 4, 8])
    schedule: list[str] = Field(default_factory=lambda: list(SCHEDULES))
    #: ZeRO stages 0 to 3, as a layout takes them (:class:`planner.spec.layout.Layout`).
    zero_stage: list[Annotated[int, Field(ge=0, le=3)]] = Field(
        default_factory=lambda: [0, 1, 2, 3]
    )
    recompute: list[str] = Field(default_factory=lambda: ["none", "selective", "full"])
    sequence_parallel: list[bool] = Field(default_factory=lambda: [True, False])
    #: Context-parallel algorithms searched where cp > 1 (cp = 1 rows: the first of them).
    cp_algorithm: list[CpAlgorithm] = Field(default_factory=lambda: list(CP_ALGORITHMS))
    #: Hierarchical CP's inner degrees searched (None: the CP ranks of one scale-up domain).
    cp_inner: list[int] | None = None
    #: How every candidate splits its layers over its stages (one split, not searched): by
    #: default the split a practitioner would set, the ends' work counted (legal wherever
    #: ``auto`` is, and as fast or faster on its busiest rank).
    pipeline_layer_split: LayerSplit = "work-balanced"
    allow_cross_node_tp: bool = False
    max_cp: int = 64
    max_interleave: int = 8


def _divisors(n: int, limit: int | None = None) -> list[int]:
    candidates = np.arange(1, (n if limit is None else min(n, limit)) + 1)
    return candidates[n % candidates == 0].tolist()


def _schedule_options(space: SearchSpace, num_layers: int) -> list[tuple[str, int]]:
    """(schedule, vpp) pairs: interleaved takes every vpp from 2 to ``max_interleave``."""
    pairs = []
    for name in space.schedule:
        spec = SCHEDULES[name]
        if spec.fixed_vpp is not None:
            vpps = [spec.fixed_vpp]
        elif name == "interleaved-1f1b":
            vpps = list(range(max(spec.min_vpp, 2), space.max_interleave + 1))
        else:
            vpps = [1]
        pairs += [(name, v) for v in vpps if space.vpp is None or v in space.vpp]
    return pairs


def _with_expert_tp(t, c, p, x, d, is_moe: bool, pinned: list[int] | None):
    """The degree rows with the routed experts' TP degree: each pinned value, else for an MoE
    model etp = tp and, where tp > 1, etp = 1 next to it (dense models: etp = tp)."""
    if pinned is not None:
        choices = np.stack([np.full_like(t, value) for value in pinned], axis=1)
        keep = np.ones_like(choices, dtype=bool)
    elif is_moe:
        choices = np.stack([t, np.ones_like(t)], axis=1)
        keep = np.stack([np.ones_like(t, dtype=bool), t > 1], axis=1)
    else:
        return t, c, p, x, d, t
    row = np.broadcast_to(np.arange(len(t))[:, None], choices.shape)[keep]
    return t[row], c[row], p[row], x[row], d[row], choices[keep]


#: The screening grid's fields, in the order they are written out, and each one's axis: 0
#: degree rows, 1 (schedule, vpp) pairs, 2 micro-batch sizes, 3 sequence-parallel values.
GRID_AXIS = {"tp": 0, "cp": 0, "pp": 0, "dp": 0, "ep": 0, "etp": 0, "vpp": 1,
             "micro_batch_size": 2, "schedule": 1, "sequence_parallel": 3, "cp_algorithm": 0,
             "cp_inner": 0}  # fmt: skip


@dataclass(eq=False)
class ScreeningGrid:
    """The knobs the screening rules read, factored over the grid's four axes: each field's
    values along its axis (:data:`GRID_AXIS`) and the kept cells, flat indices into
    ``shape`` = (degree rows, pairs, micro-batch sizes, SP values), ascending. A column over
    the cells is written out only where it is asked for (:meth:`columns`): the rules read
    each field along its axis (:func:`first_rejections`)."""

    values: dict[str, np.ndarray | Labels]
    cells: np.ndarray
    shape: tuple[int, int, int, int]

    def __len__(self) -> int:
        return len(self.cells)

    def columns(self, rows=None) -> dict[str, np.ndarray | Labels]:
        """Every field written out at the cells (at ``rows`` of them; None: every cell)."""
        cells = self.cells if rows is None else self.cells[rows]
        at = np.unravel_index(cells, self.shape)
        return {field: self.values[field][at[axis]] for field, axis in GRID_AXIS.items()}


def screening_grid(
    job: Job, cluster: Cluster, gpus: int, space: SearchSpace, order=None
) -> ScreeningGrid:
    """The knobs the screening rules read, over their combinations (:class:`ScreeningGrid`).

    Degrees (multiplying to ``gpus``), (schedule, vpp), micro-batch size and sequence
    parallelism; no rule reads the ZeRO stage or the recompute policy, so each cell here
    stands for ``len(zero_stage) · len(recompute)`` candidates (:func:`expand_rows`).
    """
    model = job.model
    tps = space.tp or _divisors(gpus, 64)
    cps = space.cp or _divisors(gpus, space.max_cp)
    pps = space.pp or _divisors(gpus, model.num_layers + 2)
    eps = space.ep or ([d for d in _divisors(model.num_routed_experts)] if model.is_moe else [1])
    t, c, p, x = (a.ravel() for a in np.meshgrid(tps, cps, pps, eps, indexing="ij"))
    keep = gpus % (t * c * p) == 0
    t, c, p, x = t[keep], c[keep], p[keep], x[keep]
    d = gpus // (t * c * p)
    if space.dp is not None:
        keep = np.isin(d, space.dp)
        t, c, p, x, d = t[keep], c[keep], p[keep], x[keep], d[keep]
    t, c, p, x, d, et = _with_expert_tp(t, c, p, x, d, model.is_moe, space.etp)
    (t, c, p, x, d, et), algorithm = with_cp_algorithm((t, c, p, x, d, et), space.cp_algorithm)
    hierarchical = np.asarray(space.cp_algorithm, dtype=object)[algorithm] == "hierarchical"
    inner = hierarchical_inner_degrees(cluster, order, (t, c, p, d, x, et), hierarchical)
    if space.cp_inner is not None:  # pinned inner degrees: one row per pin that divides cp
        (t, c, p, x, d, et), algorithm, inner = with_cp_inner(
            (t, c, p, x, d, et), algorithm, hierarchical, inner, space.cp_inner
        )
    pairs = _schedule_options(space, model.num_layers)
    sizes = (len(t), len(pairs), len(space.micro_batch_size), len(space.sequence_parallel))
    # Sequence parallelism means nothing without TP: keep one of the two rows.
    sp_values = np.asarray(space.sequence_parallel, dtype=bool)
    keep = np.ones(sizes, dtype=bool)
    if False in space.sequence_parallel:
        keep &= (t > 1)[:, None, None, None] | ~sp_values[None, None, None, :]
    cells = np.flatnonzero(keep)
    names = tuple(name for name, _ in pairs) or ("1f1b",)
    values = {
        "tp": t, "cp": c, "pp": p, "dp": d, "ep": x, "etp": et,
        "vpp": np.array([v for _, v in pairs] or [1]),
        "micro_batch_size": np.asarray(space.micro_batch_size),
        "schedule": Labels(narrow_codes(np.arange(len(names)), len(names)), names),
        "sequence_parallel": sp_values,
        "cp_algorithm": Labels(narrow_codes(algorithm, len(space.cp_algorithm)),
                               tuple(space.cp_algorithm)),
        "cp_inner": inner,
    }  # fmt: skip
    return ScreeningGrid(values, cells, (sizes[0], sizes[1] or 1, *sizes[2:]))


def expand_index(
    cells: np.ndarray, grid_shape: tuple[int, ...], space
) -> tuple[np.ndarray, np.ndarray, Labels]:
    """Screened rows × every ZeRO stage × every recompute policy, in the order of the full
    grid ``(degree, pair, mbs, zero, recompute, sp)`` (ties in the ranking keep it): each
    row's screened row (its index among ``cells``, the screened rows' cells, ascending),
    ZeRO stage and recompute policy (:class:`planner.columns.codes.Labels`), each in narrow
    integers (10^6-10^7 rows).

    The screened rows of one ``(degree, pair, mbs)`` are its sequence-parallel values,
    neighbours among ``cells``; each expands to ``zero × recompute`` runs of them."""
    copies = len(space.zero_stage) * len(space.recompute)
    group = cells // grid_shape[-1]  # the (degree, pair, mbs) of each screened row
    starts = np.flatnonzero(np.concatenate([[True], group[1:] != group[:-1]]))
    width = np.diff(np.append(starts, len(cells)))  # its screened rows (SP values)
    rows_of_group = width * copies
    total = int(rows_of_group.sum())
    index = code_dtype(max(total, len(cells)))
    # Each row's place among its group's rows, then its screened row and (zero, policy).
    local = np.arange(total, dtype=index)
    local -= np.repeat((np.cumsum(rows_of_group) - rows_of_group).astype(index), rows_of_group)
    width = np.repeat(width.astype(index), rows_of_group)
    row = np.repeat(starts.astype(index), rows_of_group)
    row += local % width
    local //= width  # the (zero, policy) pair, zero-major
    del width
    policies = len(space.recompute)
    zero_stage = np.asarray(space.zero_stage, dtype=np.int8)[local // policies]  # 0 to 3
    recompute = Labels(
        (local % policies).astype(np.min_scalar_type(-policies)), tuple(space.recompute)
    )
    return row, zero_stage, recompute


def expand_rows(
    columns: dict[str, np.ndarray], cells: np.ndarray, grid_shape: tuple[int, ...], space
) -> dict[str, np.ndarray]:
    """The screened rows' ``columns`` expanded to every ZeRO stage and recompute policy
    (:func:`expand_index`), with those two columns: every column in memory (the search
    keeps them factored, :class:`planner.columns.expanded.ExpandedRows`)."""
    row, zero_stage, recompute = expand_index(cells, grid_shape, space)
    out = {key: value[row] for key, value in columns.items()}
    out["zero_stage"] = zero_stage.astype(np.int64)
    out["recompute"] = recompute
    return out


def num_microbatches(job: Job, c: dict) -> np.ndarray:
    """Micro-batches per step of the rows (columns ``c``): the global batch over dp × micro-
    batch size, 0 where it does not divide; without a global batch pp·vpp (interleaved) or
    pp. The columns it reads: :func:`_microbatch_fields`."""
    gbs = job.global_batch_size
    if gbs:
        per_step = c["dp"] * c["micro_batch_size"]
        return np.where(gbs % per_step == 0, gbs // per_step, 0)
    return np.where(c["vpp"] > 1, c["pp"] * c["vpp"], c["pp"])


def _microbatch_fields(job: Job) -> tuple[str, ...]:
    return ("dp", "micro_batch_size") if job.global_batch_size else ("pp", "vpp")


def grid_columns(job: Job, grid: ScreeningGrid, rows=None) -> dict:
    """The grid's columns written out at ``rows`` of its cells (None: every cell), with
    each row's micro-batches per step (at least 1)."""
    columns = grid.columns(rows)
    columns["num_microbatches"] = np.maximum(num_microbatches(job, columns), 1)
    return columns


#: One screening check: (reason, the columns it reads, its broken rows of such columns).
Check = tuple[str, tuple[str, ...], Callable[[dict], np.ndarray]]


def screening_checks(job: Job, cluster: Cluster, space: SearchSpace) -> list[Check]:
    """The checks in the order they are applied: the layout rules of :mod:`planner.spec.rules`
    (the same table :func:`planner.spec.rules.check_layout` reads) and the schedules'
    micro-batch rules, with the search space's own where they read what no layout rule
    does: TP inside the scale-up domain (unless allowed), a global batch that divides into
    micro-batches, pp = 1 listed once (as 1f1b) and hierarchical CP of one level listed
    once. ``num_microbatches`` among the columns is :func:`num_microbatches` (0 where the
    batch does not divide: the schedules' rules read it only where it does)."""
    model, s = job.model, job.seq_len
    domain = cluster.scale_up_domain_size
    search_rules = {  # after the layout rule named
        "ffn": (
            f"tp crosses the {domain}-GPU scale-up (NVLink) domain",
            ("tp",),
            lambda c: (c["tp"] > domain) & (not space.allow_cross_node_tp),
        ),
        "ep_experts": (
            "global batch not divisible by dp × micro-batch size",
            ("num_microbatches",),
            lambda c: c["num_microbatches"] == 0,
        ),
    }
    checks: list[Check] = []
    split = space.pipeline_layer_split  # one split for every row: not a grid axis
    for rule in RULES:
        checks.append((rule.reason(model), rule.reads,
                       lambda c, r=rule: r.broken(model, s, {"split": split, **c})))  # fmt: skip
        if rule.name in search_rules:
            checks.append(search_rules[rule.name])
    checks += [
        (rule.reason(model), rule.reads,
         lambda c, r=rule: r.broken(model, s, c) & (c["num_microbatches"] > 0))
        for rule in schedule_rules()
    ]  # fmt: skip
    checks.append((
        "a pipeline schedule needs pp > 1 (pp = 1 is listed once, as 1f1b)",
        ("pp", "schedule"),
        lambda c: (c["pp"] == 1) & ~Labels.of(c["schedule"]).isin(("1f1b",)),
    ))  # fmt: skip
    # A hierarchy of one level is ring (k = 1) or Ulysses (k = cp).
    checks.append((DEGENERATE_HIERARCHY, ("cp", "cp_algorithm", "cp_inner"), degenerate_hierarchy))
    return checks


def rejection_masks(
    job: Job, cluster: Cluster, cols: dict, space: SearchSpace
) -> list[tuple[str, np.ndarray]]:
    """(reason, rejected rows) of written-out columns ``cols`` (one layout: 1-row columns;
    ``num_microbatches`` and ``replicate_kv`` are the job's), in :func:`screening_checks`'
    order; the hierarchy's check where the columns name a CP algorithm. The search finds
    the same once per distinct combination of the columns each check reads
    (:func:`first_rejections`)."""
    columns = {**cols, "num_microbatches": num_microbatches(job, cols),
               "replicate_kv": job.ulysses_kv_heads == "replicate"}  # fmt: skip
    shape = np.shape(cols["tp"])
    return [
        (reason, np.broadcast_to(np.asarray(broken(columns), dtype=bool), shape))
        for reason, _, broken in screening_checks(job, cluster, space)
        if reason != DEGENERATE_HIERARCHY or "cp_algorithm" in cols
    ]


def first_rejections(
    job: Job, cluster: Cluster, grid: ScreeningGrid, space: SearchSpace
) -> tuple[list[str], np.ndarray]:
    """The reasons of :func:`screening_checks`, in order, and each cell's index of the
    first it breaks (``len(reasons)``: none), as :func:`rejection_masks` of the written-out
    grid finds them.

    Each check is worked out once per distinct combination of the columns it reads: the
    checks that read the same axes of the grid form a group; its degree rows narrowed to
    their distinct values of the degree fields the group reads, the group's first broken
    check is found over those and its other axes, and the groups' firsts meet in one
    (degree row, pair, micro-batch size, SP value) array read at the cells."""
    checks = screening_checks(job, cluster, space)
    none = len(checks)
    m_fields = _microbatch_fields(job)
    groups: dict[tuple[int, ...], list[int]] = {}
    fields_of = []
    for index, (_, reads, _) in enumerate(checks):
        fields = {f for read in reads for f in (m_fields if read == "num_microbatches" else
                                                (read,)) if f in GRID_AXIS}  # fmt: skip
        fields_of.append(fields)
        groups.setdefault(tuple(sorted({GRID_AXIS[f] for f in fields})), []).append(index)
    first = np.full(grid.shape, none, dtype=np.min_scalar_type(none))
    for axes, members in groups.items():
        fields = sorted(set().union(*(fields_of[i] for i in members)))
        found = _first_broken(job, grid, axes, fields, [(i, checks[i][2]) for i in members], none)
        np.minimum(first, found, out=first)
    return [reason for reason, _, _ in checks], first.reshape(-1)[grid.cells]


def _first_broken(job, grid: ScreeningGrid, axes, fields, checks, none: int) -> np.ndarray:
    """The index of the first of ``checks`` ((index, broken) reading ``fields`` along
    ``axes``) each (degree row, pair, micro-batch size, SP value) breaks, as an array that
    broadcasts over the grid's shape (``none``: none broken)."""
    degree_fields = [f for f in fields if GRID_AXIS[f] == 0]
    chosen, inverse = (distinct_rows(*(grid.values[f] for f in degree_fields))
                       if degree_fields else (np.zeros(1, dtype=np.int64), None))  # fmt: skip
    sizes = [len(chosen) if axis == 0 else grid.shape[axis] for axis in axes]
    count = int(np.prod(sizes))  # one row per combination (no axis: one row)
    at = np.unravel_index(np.arange(count), sizes) if axes else ()
    columns = {}
    for field in fields:
        place = at[axes.index(GRID_AXIS[field])]
        columns[field] = grid.values[field][chosen[place] if GRID_AXIS[field] == 0 else place]
    columns["replicate_kv"] = job.ulysses_kv_heads == "replicate"
    if set(_microbatch_fields(job)) <= set(columns):
        columns["num_microbatches"] = num_microbatches(job, columns)
    found = np.full(count, none, dtype=np.min_scalar_type(none))
    for index, broken in reversed(checks):  # the first broken check's index last
        found[np.broadcast_to(np.asarray(broken(columns), dtype=bool), (count,))] = index
    found = found.reshape(sizes)
    if inverse is not None:
        found = found[inverse]  # every degree row
    return found.reshape([grid.shape[a] if a in axes else 1 for a in range(len(grid.shape))])
