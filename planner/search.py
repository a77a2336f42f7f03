"""Screen every layout as numpy columns, filter, evaluate all rows at once, rank.

Candidates are the cartesian product of the degrees (tp, cp, pp with dp filling the GPU
count; ep for MoE models), schedule and vpp, micro-batch size, ZeRO stage, recomputation
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
from planner.evaluate import evaluate_columns
from planner.job import Job
from planner.schedules import SCHEDULES

GIB = 2**30
OBJECTIVES = ("step_time", "memory", "mfu")
LAYOUT_COLUMNS = (
    "tp",
    "cp",
    "pp",
    "dp",
    "ep",
    "vpp",
    "micro_batch_size",
    "num_microbatches",
    "schedule",
    "zero_stage",
    "recompute",
    "sequence_parallel",
)


class SearchSpace(BaseModel):
    """Values each knob may take; a knob given by the user pins it to those values."""

    model_config = ConfigDict(extra="forbid")

    tp: list[int] | None = None
    cp: list[int] | None = None
    pp: list[int] | None = None
    dp: list[int] | None = None
    ep: list[int] | None = None
    vpp: list[int] | None = None
    micro_batch_size: list[int] = Field(default_factory=lambda: [1, 2, 4, 8])
    schedule: list[str] = Field(default_factory=lambda: list(SCHEDULES))
    zero_stage: list[int] = Field(default_factory=lambda: [0, 1, 2, 3])
    recompute: list[str] = Field(default_factory=lambda: ["none", "selective", "full"])
    sequence_parallel: list[bool] = Field(default_factory=lambda: [True, False])
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
    values = [d for d in range(1, n + 1) if n % d == 0]
    return [d for d in values if limit is None or d <= limit]


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


def candidate_columns(
    job: Job, cluster: Cluster, gpus: int, space: SearchSpace
) -> dict[str, np.ndarray]:
    """Every combination of the knobs as numpy columns (degrees multiply to ``gpus``)."""
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
    pairs = _schedule_options(space, model.num_layers)
    grids = np.meshgrid(
        np.arange(len(t)),
        np.arange(len(pairs)),
        space.micro_batch_size,
        space.zero_stage,
        np.arange(len(space.recompute)),
        space.sequence_parallel,
        indexing="ij",
    )
    degree, pair, mbs, zero, recompute, sp = (g.ravel() for g in grids)
    names = np.array([name for name, _ in pairs] or ["1f1b"], dtype=object)
    vpps = np.array([v for _, v in pairs] or [1])
    columns = {
        "tp": t[degree],
        "cp": c[degree],
        "pp": p[degree],
        "dp": d[degree],
        "ep": x[degree],
        "vpp": vpps[pair],
        "micro_batch_size": mbs,
        "schedule": names[pair],
        "zero_stage": zero,
        "recompute": np.array(space.recompute, dtype=object)[recompute],
        "sequence_parallel": sp.astype(bool),
    }
    # Sequence parallelism means nothing without TP: keep one of the two rows.
    keep = np.ones(len(sp), dtype=bool)
    if False in space.sequence_parallel:
        keep = (columns["tp"] > 1) | ~columns["sequence_parallel"]
    return {key: value[keep] for key, value in columns.items()}


def rejection_masks(
    job: Job, cluster: Cluster, cols: dict, space: SearchSpace
) -> list[tuple[str, np.ndarray]]:
    """(reason, rejected rows) in the order rules are applied."""
    model, s = job.model, job.seq_len
    tp, cp, pp, dp, ep, vpp = (cols[k] for k in ("tp", "cp", "pp", "dp", "ep", "vpp"))
    schedule, mbs = cols["schedule"], cols["micro_batch_size"]
    stages = pp * vpp
    L = model.num_layers
    kv = model.num_kv_heads
    gbs = job.global_batch_size
    m = (
        np.where(gbs % (dp * mbs) == 0, gbs // (dp * mbs), 0)
        if gbs
        else np.where(vpp > 1, stages, pp)
    )
    rules = [
        (
            f"tp does not divide the {model.num_attention_heads} attention heads",
            model.num_attention_heads % tp != 0,
        ),
        (
            f"tp and the {kv} KV heads do not divide one another",
            (model.attention_kind != "mla") & (tp % kv != 0) & (kv % tp != 0),
        ),
        (
            "tp does not divide the FFN size",
            (model.ffn_hidden_size % tp != 0) | ((model.moe_ffn_hidden_size or tp) % tp != 0),
        ),
        (
            f"tp crosses the {cluster.scale_up_domain_size}-GPU scale-up (NVLink) domain",
            (tp > cluster.scale_up_domain_size) & (not space.allow_cross_node_tp),
        ),
        ("layers do not split over pp·vpp stages", (stages > L) & ((L + 2) % stages != 0)),
        (
            "ep does not divide dp·cp or the experts",
            ((dp * cp) % ep != 0) | ((model.num_routed_experts or 1) % ep != 0),
        ),
        ("global batch not divisible by dp × micro-batch size", m == 0),
        ("sequence not divisible by 2·cp (load-balanced CP)", (cp > 1) & (s % (2 * cp) != 0)),
        (
            "sequence/cp not divisible by tp under sequence parallelism",
            cols["sequence_parallel"] & (tp > 1) & ((s // cp) % tp != 0),
        ),
        (
            "interleaved-1f1b needs micro-batches a multiple of pp",
            (schedule == "interleaved-1f1b") & ((m % pp != 0) | (m < pp)),
        ),
        (
            "dualpipe needs an even pp and an even number ≥ 2·pp of micro-batches",
            (schedule == "dualpipe") & ((pp % 2 != 0) | (m % 2 != 0) | (m < 2 * pp)),
        ),
        ("dualpipev needs ≥ 2·pp micro-batches", (schedule == "dualpipev") & (m < 2 * pp)),
        (
            "a pipeline schedule needs pp > 1 (pp = 1 is listed once, as 1f1b)",
            (pp == 1) & (schedule != "1f1b"),
        ),
    ]
    cols["num_microbatches"] = np.maximum(m, 1)
    return rules


def search(
    job: Job,
    cluster: Cluster,
    accelerator,
    gpus: int,
    space: SearchSpace | None = None,
    objective: str = "step_time",
    mem_headroom: float = 0.05,
    order=None,
    mfu_dtype: str = "bf16",
    progress=None,
) -> SearchResult:
    """Screen, evaluate and rank every layout of ``job`` on the first ``gpus`` of ``cluster``."""
    space = space or SearchSpace()
    cols = candidate_columns(job, cluster, gpus, space)
    total = len(cols["tp"])
    rejected: dict[str, int] = {}
    alive = np.ones(total, dtype=bool)
    for reason, mask in rejection_masks(job, cluster, cols, space):
        hit = alive & np.asarray(mask, dtype=bool)
        if hit.any():
            rejected[reason] = int(hit.sum())
        alive &= ~hit
    cols = {key: value[alive] for key, value in cols.items()}
    cols["pipeline_layer_split"] = np.full(len(cols["tp"]), "auto", dtype=object)
    if progress:
        progress(0.3)
    out = (
        evaluate_columns(job, cluster, accelerator, cols, order=order, mfu_dtype=mfu_dtype)
        if len(cols["tp"])
        else {}
    )
    if progress:
        progress(0.9)
    usable = accelerator.hbm_bytes * (1 - mem_headroom)
    table = (
        pd.DataFrame({key: cols[key] for key in LAYOUT_COLUMNS})
        if out
        else pd.DataFrame(columns=LAYOUT_COLUMNS)
    )
    smallest = None
    if out:
        for key, value in out.items():
            table[key] = value
        unplaceable = ~table["valid"].to_numpy()
        if unplaceable.any():
            rejected["cannot be placed on the cluster"] = int(unplaceable.sum())
        table = table[~unplaceable]
        too_big = table["memory_per_gpu_bytes"].to_numpy() > usable
        if too_big.any():
            rejected[f"does not fit in {usable / GIB:.1f} GiB per GPU"] = int(too_big.sum())
            best = table[too_big].sort_values("memory_per_gpu_bytes").iloc[0]
            smallest = {
                **{k: _plain(best[k]) for k in LAYOUT_COLUMNS},
                "memory_per_gpu_bytes": float(best["memory_per_gpu_bytes"]),
            }
        table = table[~too_big]
    table = rank_table(table, objective)
    return SearchResult(
        candidates_evaluated=total,
        feasible=len(table),
        rejected=rejected,
        table=table,
        smallest_memory=smallest,
    )


def rank_table(table: pd.DataFrame, objective: str) -> pd.DataFrame:
    """Sort by the objective (ties broken by step time, then memory)."""
    if table.empty:
        return table.reset_index(drop=True)
    keys = {
        "step_time": (["step_time_s", "memory_per_gpu_bytes"], [True, True]),
        "memory": (["memory_per_gpu_bytes", "step_time_s"], [True, True]),
        "mfu": (["mfu", "memory_per_gpu_bytes"], [False, True]),
    }[objective]
    return table.sort_values(keys[0], ascending=keys[1], kind="stable").reset_index(drop=True)


def _plain(value):
    return value.item() if hasattr(value, "item") else value
