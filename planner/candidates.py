"""The layouts the search screens, as numpy columns: the search space (the values each knob
may take), the screening grid over the degrees, schedules, micro-batch sizes and sequence
parallelism (no Python loop per candidate), the rule table's rejection masks on it
(:mod:`planner.spec.rules`, the same table :func:`planner.spec.rules.check_layout` reads),
and the survivors expanded over every ZeRO stage and recompute policy.

The degrees are the cartesian product of tp, cp, pp with dp filling the GPU count; ep for MoE
models, and with tp > 1 the routed experts' TP degree etp ∈ {tp, 1} (Megatron-Core's MoE
parallel folding); each degree row once per CP algorithm where cp > 1
(:mod:`planner.cp_search`)."""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from hwspecs.schema import Cluster
from planner.columns.codes import Labels, code_dtype, narrow_codes
from planner.cp_inner import with_cp_inner
from planner.cp_search import (
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


def screening_grid(
    job: Job, cluster: Cluster, gpus: int, space: SearchSpace, order=None
) -> tuple[dict[str, np.ndarray], np.ndarray, tuple[int, ...]]:
    """The knobs the screening rules read, as numpy columns over their combinations.

    Degrees (multiplying to ``gpus``), (schedule, vpp), micro-batch size and sequence
    parallelism; no rule reads the ZeRO stage or the recompute policy, so each row here
    stands for ``len(zero_stage) · len(recompute)`` candidates (:func:`expand_rows`).
    Also returns each row's cell in the grid ``(degree, pair, mbs, sp)`` and its shape.
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
    # Sequence parallelism means nothing without TP: keep one of the two rows. The cells
    # kept are chosen first, and each column is read at them from its few values.
    sp_values = np.asarray(space.sequence_parallel, dtype=bool)
    keep = np.ones(sizes, dtype=bool)
    if False in space.sequence_parallel:
        keep &= (t > 1)[:, None, None, None] | ~sp_values[None, None, None, :]
    cells = np.flatnonzero(keep)
    degree, pair, mbs, sp = np.unravel_index(cells, sizes)
    names = tuple(name for name, _ in pairs) or ("1f1b",)
    vpps = np.array([v for _, v in pairs] or [1])
    columns = {
        "tp": t[degree],
        "cp": c[degree],
        "pp": p[degree],
        "dp": d[degree],
        "ep": x[degree],
        "etp": et[degree],
        "vpp": vpps[pair],
        "micro_batch_size": np.asarray(space.micro_batch_size)[mbs],
        "schedule": Labels(narrow_codes(pair, len(names)), names),
        "sequence_parallel": sp_values[sp],
        "cp_algorithm": Labels(
            narrow_codes(algorithm, len(space.cp_algorithm))[degree], tuple(space.cp_algorithm)
        ),
        "cp_inner": inner[degree],
    }
    return columns, cells, (sizes[0], sizes[1] or 1, *sizes[2:])


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


def rejection_masks(
    job: Job, cluster: Cluster, cols: dict, space: SearchSpace
) -> list[tuple[str, np.ndarray]]:
    """(reason, rejected rows) in the order rules are applied: the layout rules of
    :mod:`planner.spec.rules` (the same table :func:`planner.spec.rules.check_layout` reads)
    and the schedules' micro-batch rules, with the search space's own three where they read
    what no layout rule does: TP inside the scale-up domain (unless allowed), a global batch
    that divides into micro-batches, and pp = 1 listed once (as 1f1b)."""
    model, s = job.model, job.seq_len
    tp, pp, dp, vpp = (cols[k] for k in ("tp", "pp", "dp", "vpp"))
    mbs = cols["micro_batch_size"]
    gbs = job.global_batch_size
    m = (
        np.where(gbs % (dp * mbs) == 0, gbs // (dp * mbs), 0)
        if gbs
        else np.where(vpp > 1, pp * vpp, pp)
    )
    columns = {**cols, "num_microbatches": m,
               "replicate_kv": job.ulysses_kv_heads == "replicate"}  # fmt: skip
    search_rules = {  # after the layout rule named: (reason, rejected rows)
        "ffn": (
            f"tp crosses the {cluster.scale_up_domain_size}-GPU scale-up (NVLink) domain",
            (tp > cluster.scale_up_domain_size) & (not space.allow_cross_node_tp),
        ),
        "ep_experts": ("global batch not divisible by dp × micro-batch size", m == 0),
    }
    masks = []
    for rule in RULES:
        masks.append((rule.reason(model), rule.broken(model, s, columns)))
        if rule.name in search_rules:
            masks.append(search_rules[rule.name])
    ok_m = m > 0  # the schedules' rules read m only where the batch divides
    masks += [
        (rule.reason(model), rule.broken(model, s, columns) & ok_m) for rule in schedule_rules()
    ]
    masks.append((
        "a pipeline schedule needs pp > 1 (pp = 1 is listed once, as 1f1b)",
        (pp == 1) & ~Labels.of(cols["schedule"]).isin(("1f1b",)),
    ))  # fmt: skip
    if "cp_algorithm" in cols:  # a hierarchy of one level is ring (k = 1) or Ulysses (k = cp)
        masks.append(degenerate_hierarchy(cols))
    cols["num_microbatches"] = np.maximum(m, 1)
    return masks
