"""Screen every layout as numpy columns, filter, evaluate all rows at once, rank.

Candidates are the cartesian product of the degrees (tp, cp, pp with dp filling the GPU
count; ep for MoE models, and with tp > 1 the routed experts' TP degree etp ∈ {tp, 1}:
Megatron-Core's MoE parallel folding), schedule and vpp, micro-batch size, ZeRO stage, recomputation
and sequence parallelism, built as index grids (no Python loop per candidate). Rules that
empty rows are applied in order and each rejected row is counted under the first rule it
fails; the survivors are evaluated by :func:`planner.evaluate.evaluate_columns`, rows that
do not fit in ``HBM × (1 − mem_headroom)`` are rejected, and the rest are ranked.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from hwspecs.schema import Cluster
from planner.columns.codes import Labels
from planner.cost.memory import DEFAULT_MEM_HEADROOM, usable_memory_bytes
from planner.cp_search import (
    CP_DOMINATED,
    degenerate_hierarchy,
    dominated_cp_rows,
    hierarchical_inner_degrees,
    with_cp_algorithm,
)
from planner.evaluate import in_output_order, screen_columns
from planner.pipeline.schedules import SCHEDULES
from planner.progress import report
from planner.rank import RankSettings, rank_columns
from planner.refine import DEFAULT_REFINE_TOP
from planner.spec.job import Job
from planner.spec.layout import CP_ALGORITHMS, CpAlgorithm, Layout
from planner.spec.rules import RULES, schedule_rules

GIB = 2**30
OBJECTIVES = ("step_time", "memory", "mfu", "time_to_train")
LAYOUT_COLUMNS = (
    "tp",
    "cp",
    "pp",
    "dp",
    "ep",
    "etp",
    "vpp",
    "micro_batch_size",
    "num_microbatches",
    "schedule",
    "zero_stage",
    "recompute",
    "sequence_parallel",
    "cp_algorithm",
)


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
    zero_stage: list[int] = Field(default_factory=lambda: [0, 1, 2, 3])
    recompute: list[str] = Field(default_factory=lambda: ["none", "selective", "full"])
    sequence_parallel: list[bool] = Field(default_factory=lambda: [True, False])
    #: Context-parallel algorithms searched where cp > 1 (cp = 1 rows: the first of them).
    cp_algorithm: list[CpAlgorithm] = Field(default_factory=lambda: list(CP_ALGORITHMS))
    allow_cross_node_tp: bool = False
    max_cp: int = 64
    max_interleave: int = 8


class SearchResult(BaseModel):
    """Feasible rows ranked, with counts of what was screened and why rows were rejected."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    candidates_evaluated: int
    feasible: int
    rejected: dict[str, int]
    table: pd.DataFrame
    smallest_memory: dict | None = None


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
    pairs = _schedule_options(space, model.num_layers)
    grids = np.meshgrid(
        np.arange(len(t)),
        np.arange(len(pairs)),
        np.arange(len(space.micro_batch_size)),
        np.arange(len(space.sequence_parallel)),
        indexing="ij",
    )
    degree, pair, mbs, sp = (g.ravel() for g in grids)
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
        "schedule": Labels(pair, names),
        "sequence_parallel": np.asarray(space.sequence_parallel, dtype=bool)[sp],
        "cp_algorithm": Labels(algorithm[degree], tuple(space.cp_algorithm)),
        "cp_inner": inner[degree],
    }
    # Sequence parallelism means nothing without TP: keep one of the two rows.
    keep = np.ones(len(sp), dtype=bool)
    if False in space.sequence_parallel:
        keep = (columns["tp"] > 1) | ~columns["sequence_parallel"]
    shape = (len(t), len(pairs) or 1, len(space.micro_batch_size), len(space.sequence_parallel))
    return {key: value[keep] for key, value in columns.items()}, np.flatnonzero(keep), shape


def expand_rows(
    columns: dict[str, np.ndarray], cells: np.ndarray, grid_shape: tuple[int, ...], space
) -> dict[str, np.ndarray]:
    """Screened rows × every ZeRO stage × every recompute policy, in the order of the full
    grid ``(degree, pair, mbs, zero, recompute, sp)`` (ties in the ranking keep it). The
    schedule and the recompute policy come as :class:`planner.columns.codes.Labels`."""
    num_zero, num_recompute = len(space.zero_stage), len(space.recompute)
    alive = np.zeros(int(np.prod(grid_shape)), dtype=bool)
    alive[cells] = True
    num_sp = grid_shape[-1]
    alive = alive.reshape(-1, num_sp)
    live = np.flatnonzero(alive.any(axis=1))  # cells with a row (the others expand to none)
    full = np.broadcast_to(alive[live, None, None, :], (len(live), num_zero, num_recompute, num_sp))
    cell, zero, recompute, sp = np.nonzero(full)
    cell = live[cell]
    row_of_cell = np.zeros(len(alive.ravel()), dtype=np.int64)
    row_of_cell[cells] = np.arange(len(cells))
    row = row_of_cell[cell * num_sp + sp]
    out = {key: value[row] for key, value in columns.items()}
    out["zero_stage"] = np.asarray(space.zero_stage)[zero]
    out["recompute"] = Labels(recompute, tuple(space.recompute))
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
    columns = {**cols, "num_microbatches": m}
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


def search(
    job: Job,
    cluster: Cluster,
    accelerator,
    gpus: int,
    space: SearchSpace | None = None,
    objective: str = "step_time",
    mem_headroom: float = DEFAULT_MEM_HEADROOM,
    order=None,
    mfu_dtype: str = "bf16",
    progress=None,
    refine_top: int = DEFAULT_REFINE_TOP,
    training=None,
    rank_settings: RankSettings | None = None,
) -> SearchResult:
    """Screen, evaluate and rank every layout of ``job`` on the first ``gpus`` of ``cluster``;
    the first ``refine_top`` rows are re-timed by the event simulator (:mod:`planner.refine`)
    and ``rank_settings`` (:class:`planner.rank.RankSettings`; None: by time) orders the rows.

    With ``training`` (a :class:`planner.cost.goodput.TrainingRun`) every row gains
    ``expected_wall_time_s`` and ``goodput`` (:func:`planner.cost.goodput.
    time_to_train_columns`), which objective ``time_to_train`` ranks by."""
    space = space or SearchSpace()
    report(progress, "enumerating layouts", 0, 0)  # how many: not known before
    grid, cells, grid_shape = screening_grid(job, cluster, gpus, space, order)
    copies = len(space.zero_stage) * len(space.recompute)  # rows per screened grid row
    total = len(cells) * copies
    rejected: dict[str, int] = {}
    alive = np.ones(len(cells), dtype=bool)
    for reason, mask in rejection_masks(job, cluster, grid, space):
        hit = alive & np.asarray(mask, dtype=bool)
        if hit.any():  # two rules may share a reason
            rejected[reason] = rejected.get(reason, 0) + int(hit.sum()) * copies
        alive &= ~hit
    beaten = alive & dominated_cp_rows(job, cluster, order, grid, alive)  # same layout, faster CP
    if beaten.any():
        rejected[CP_DOMINATED] = int(beaten.sum()) * copies
    alive &= ~beaten
    grid = {key: value[alive] for key, value in grid.items()}
    cols = expand_rows(grid, cells[alive], grid_shape, space)
    cols["pipeline_layer_split"] = Labels(np.zeros(len(cols["tp"]), dtype=np.int64), ("auto",))
    report(progress, "enumerating layouts", total, total)
    usable = usable_memory_bytes(accelerator.hbm_bytes, mem_headroom)
    screened = (  # rows that do not fit are not timed
        screen_columns(job, cluster, accelerator, cols, usable, order, mfu_dtype, True, progress)
        if len(cols["tp"])
        else None
    )
    smallest = None
    table = pd.DataFrame(columns=LAYOUT_COLUMNS)
    if screened:
        memory_out, placeable, rows, timed = screened
        report(progress, "ranking", 0, len(rows))
        del screened
        placeable = placeable.copy()  # as evaluate_columns reports it: the timed rows' own
        placeable[rows] = timed["valid"]
        if not placeable.all():
            rejected["cannot be placed on the cluster"] = int((~placeable).sum())
        memory = memory_out["memory_per_gpu_bytes"]
        too_big = placeable & (memory > usable)
        if too_big.any():
            rejected[f"does not fit in {usable / GIB:.1f} GiB per GPU"] = int(too_big.sum())
            best = _smallest(memory, np.flatnonzero(too_big))
            smallest = {
                **{k: _plain(cols[k][best]) for k in LAYOUT_COLUMNS},
                "memory_per_gpu_bytes": float(memory[best]),
            }
        kept = np.flatnonzero(placeable & ~too_big)
        # Kept rows are timed rows (placeable and fitting): read their times in place.
        at = np.minimum(np.searchsorted(rows, kept), max(len(rows) - 1, 0))
        if len(kept) and not np.array_equal(rows[at], kept):  # not timed: NaN times
            timed = {k: _spread(v, rows, len(memory), placeable) for k, v in timed.items()}
            for key, value in memory_out.items():  # the parts, as the timed outputs
                if key != "memory_per_gpu_bytes":
                    memory_out[key] = _spread(value, rows, len(memory), placeable)
            at = kept
        merged = in_output_order(timed, memory_out)

        def kept_rows(key: str, ranked: bool = False) -> np.ndarray:
            """A kept column, in the kept rows' order or ``ranked`` (timed outputs and memory
            parts, one per timed row: read at ``at``); ``np.take`` on indices taken once."""
            timed_rows = key in timed or (key in memory_out and key != "memory_per_gpu_bytes")
            rows = ranked_at if ranked else (at, kept)
            if timed_rows:
                return np.take(timed[key] if key in timed else memory_out[key], rows[0])
            value = cols[key] if key in LAYOUT_COLUMNS else merged[key]
            if isinstance(value, Labels):
                return value[rows[1]]
            return np.take(value, rows[1])

        extra = {}  # the time to train of each kept row (with a token budget)
        if training is not None:
            needed = ("step_time_s", "tokens_per_s_per_gpu", "checkpoint_bytes_per_rank")
            extra = _time_to_train_columns({k: kept_rows(k) for k in needed}, gpus, job, training)
        present = (*timed, *memory_out, *merged, *LAYOUT_COLUMNS, *extra)
        ranking = _ranking(
            {k: extra[k] if k in extra else kept_rows(k) for k in RANKING_COLUMNS if k in present},
            objective,
        )
        ranked_at = at[ranking], kept[ranking]  # the ranked rows in the timed and all rows
        columns = {}  # each column taken once, in ranked order; the evaluated ones released
        for key in dict.fromkeys((*LAYOUT_COLUMNS, *merged)):
            value = kept_rows(key, ranked=True)
            columns[key] = value.strings() if isinstance(value, Labels) else value
            for source in (timed, merged, memory_out):
                source.pop(key, None)
        columns.update({key: value[ranking] for key, value in extra.items()})
        del memory_out, merged, cols
        report(progress, "ranking", len(rows), len(rows))
        count = min(refine_top, len(columns["tp"]))
        report(progress, "simulating the top rows", 0, count)
        columns = rank_columns(
            job, accelerator, columns, refine_top, objective, rank_settings,
            cluster.scale_up_domain_size, usable, lambda row: layout_of_row(row, job.model.is_moe),
        )  # fmt: skip
        report(progress, "simulating the top rows", count, count)
        table = pd.DataFrame(columns, copy=False)  # one block per column: no stacking copy
    return SearchResult(
        candidates_evaluated=total,
        feasible=len(table),
        rejected=rejected,
        table=table,
        smallest_memory=smallest,
    )


def layout_of_row(row: dict, is_moe: bool) -> Layout:
    """The :class:`Layout` of one row of the search table (etp unset on a dense model)."""
    fields = {key: row[key] for key in LAYOUT_COLUMNS}
    fields = {k: (v.item() if hasattr(v, "item") else v) for k, v in fields.items()}
    fields["num_microbatches"] = int(fields["num_microbatches"])
    if not is_moe:  # no routed experts: etp stays unset (tp)
        fields["etp"] = None
    return Layout(**fields)


RANKING_KEYS = {  # objective: (columns, ascending), ties broken by the later columns
    "step_time": (("step_time_s", "memory_per_gpu_bytes"), (True, True)),
    "memory": (("memory_per_gpu_bytes", "step_time_s"), (True, True)),
    "mfu": (("mfu", "memory_per_gpu_bytes"), (False, True)),
    "time_to_train": (("expected_wall_time_s", "memory_per_gpu_bytes"), (True, True)),
}
#: Every column an objective reads.
RANKING_COLUMNS = tuple(dict.fromkeys(name for names, _ in RANKING_KEYS.values() for name in names))


def _ranking(columns: dict[str, np.ndarray], objective: str) -> np.ndarray:
    """Row order by the objective: a stable sort (equal rows keep their order).

    The first key is sorted alone (quicksort); rows it ties are then put in the order of
    the later keys and their own (a stable lexicographic sort of those rows only)."""
    names, ascending = RANKING_KEYS[objective]
    keys = [columns[n] if up else -columns[n] for n, up in zip(names, ascending, strict=True)]
    order = np.argsort(keys[0])
    first = keys[0][order]
    tied = (first[1:] == first[:-1]) | (np.isnan(first[1:]) & np.isnan(first[:-1]))
    if tied.any():  # positions in a run of equal first keys, and those rows, ascending
        at = np.flatnonzero(np.concatenate([tied, [False]]) | np.concatenate([[False], tied]))
        rows = np.sort(order[at])
        order[at] = rows[np.lexsort([key[rows] for key in keys[::-1]])]
    return order


def _time_to_train_columns(columns: dict, gpus: int, job: Job, training) -> dict:
    """Expected wall time of the token budget and goodput per row (failures included)."""
    from planner.cost.goodput import time_to_train_columns

    step = columns["step_time_s"]
    batch = job.global_batch_tokens or columns["tokens_per_s_per_gpu"] * gpus * step
    found = time_to_train_columns(step, columns["checkpoint_bytes_per_rank"], gpus, batch, training)
    return {"expected_wall_time_s": found["wall_time_s"], "goodput": found["goodput"]}


def _smallest(memory: np.ndarray, rows: np.ndarray) -> int:
    """The row of ``rows`` needing least memory (the first of an ascending quicksort, as
    pandas' sort_values picks it; a single least row is found without sorting)."""
    least = rows[memory[rows] == memory[rows].min()]
    if len(least) == 1:
        return int(least[0])
    return int(rows[np.argsort(memory[rows], kind="quicksort")[0]])


def _spread(values: np.ndarray, rows: np.ndarray, n: int, placeable: np.ndarray) -> np.ndarray:
    """Timed outputs of ``rows`` over all ``n`` rows: NaN elsewhere (valid: ``placeable``)."""
    full = placeable.copy() if values.dtype == bool else np.full(n, np.nan)
    full[rows] = values
    return full


def _plain(value):
    return value.item() if hasattr(value, "item") else value
