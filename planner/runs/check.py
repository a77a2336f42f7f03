"""Predict published runs and measure the error: what ``llmplan runs check`` prints.

Each row's published layout fields are pinned and the rest searched
(:mod:`planner.runs.rows`); the fastest layout that fits is the prediction. Throughput is
compared per GPU: the row's tokens/s, else its global batch over its step time, else its
model TFLOP/s over the model FLOPs per token recomputed from the architecture (PaLM
Appendix B: 6N + 12·L·h·s). MFU is recomputed the same way on both sides (BF16 dense
peak), so the two columns differ only by throughput. Errors are ``predicted / measured − 1``
on tokens/s (positive: optimistic).
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

from hwspecs.catalog import load_accelerator
from hwspecs.runs import RunRow
from planner.layout_range import measured_layout_range, outside_reasons
from planner.runs.measured import measured_tokens_per_s
from planner.runs.placement import run_cluster
from planner.runs.rows import (
    Uncovered,
    model_spec,
    precision_label,
    run_job,
    search_space,
    sharded_further,
    stack_label,
)
from planner.search import LAYOUT_COLUMNS, search

GIB = 2**30
#: Evaluated columns a profile reads (:mod:`planner.cost.profile`), kept per row for ``fit``.
FEATURE_COLUMNS = (
    "step_time_s",
    "pipeline_time_s",
    "compute_s",
    "recompute_s",
    "exposed_comm_s",
    "tp_exposed_time_s",
    "overlapped_comm_s",
    "kernels_per_step",
    "expert_width",
    "attention_share",
    "expert_share",
    "num_gpus",
    "fp8",
    "fp4",
    "stack_overlaps_tp",
)


class RowPrediction(BaseModel):
    """One run: predicted against measured, or the reason it is not covered."""

    id: str
    source: str
    source_family: str
    group: str
    #: The job a row trains (model, task, precision, sequence length): rows of one job in two
    #: configuration groups compare two layouts (:mod:`planner.runs.ratio_error`).
    job: str = ""
    #: The model the row trains (its name in the runs catalog).
    model: str = ""
    accelerator: str
    precision: str
    stack: str
    num_gpus: int
    #: The row's sequence length (tokens per sequence).
    seq_len: int | None = None
    covered: bool
    reason: str | None = None
    layout: dict | None = None
    measured_tokens_per_s_per_gpu: float | None = None
    measured_from: str | None = None
    predicted_tokens_per_s_per_gpu: float | None = None
    error: float | None = None
    measured_step_time_s: float | None = None
    predicted_step_time_s: float | None = None
    measured_mfu: float | None = None
    predicted_mfu: float | None = None
    published_mfu: float | None = None
    predicted_mfu_causal: float | None = None
    #: The predicted layout's memory per GPU; on a row no layout fits, the least any placeable
    #: layout needs, beside the accelerator's capacity (``memory_capacity_gib``).
    predicted_memory_gib: float | None = None
    memory_capacity_gib: float | None = None
    measured_memory_gib: float | None = None
    features: dict[str, float] | None = None
    #: Where the predicted layout lies beyond the runs its profile (the ideal model: the
    #: accelerator's shipped profile) was fitted on (:func:`planner.layout_range.
    #: outside_reasons`, GPUs included); empty inside them.
    outside_measured_layouts: list[str] = []


class ErrorStats(BaseModel):
    """Throughput error of a set of rows."""

    name: str
    n: int
    num_groups: int
    mape: float
    median_signed_error: float
    within_20pct: float
    worst: list[tuple[str, float]]


class RunsCheck(BaseModel):
    """Every row's prediction, the error per source / accelerator / precision, coverage."""

    runs: str
    profile: str
    num_rows: int
    num_covered: int
    uncovered: dict[str, int]
    overall: ErrorStats | None
    by_source: list[ErrorStats]
    by_accelerator: list[ErrorStats]
    by_precision: list[ErrorStats]
    rows: list[RowPrediction]


def source_family(row: RunRow) -> str:
    """The publisher a row comes from: its repository, paper or web site (rows of one
    family share a benchmark harness, so cross-validation leaves them out together)."""
    ref = row.source_ref
    if ref.repo:
        return ref.repo
    if ref.arxiv:
        return f"arXiv {ref.arxiv}"
    if ref.url:
        return ref.url.split("//")[-1].split("/")[0]
    return row.source


def job_key(row: RunRow) -> str:
    """The job a row trains (model, task, precision, sequence length): two rows of one job
    and one source in different configuration groups are a pair of layouts
    (:mod:`planner.runs.ratio_error`)."""
    return f"{row.model.name} {row.training.task} {precision_label(row)} {row.training.seq_len}"


def _uncovered(row: RunRow, base: dict, reason: str) -> RowPrediction:
    return RowPrediction(**base, covered=False, reason=reason)


def _no_layout_reason(rejected: dict[str, int]) -> str:
    if not rejected:
        return "no layout"
    worst = max(rejected, key=rejected.get)
    return "no layout fits in memory" if worst.startswith("does not fit") else f"layout: {worst}"


def predict_row(row: RunRow, profile=None) -> RowPrediction:
    """One row's prediction with its published layout pinned (``profile``: an efficiency
    profile applied inside the cost model, None for the ideal model)."""
    base = {
        "id": row.id,
        "source": row.source,
        "source_family": source_family(row),
        "group": row.group_key,
        "job": job_key(row),
        "model": row.model.name,
        "accelerator": row.hardware.accelerator,
        "precision": precision_label(row),
        "stack": stack_label(row),
        "num_gpus": row.hardware.num_gpus,
        "seq_len": row.training.seq_len,
        "measured_step_time_s": row.measured.step_time_s,
        "published_mfu": row.measured.mfu,
        "measured_memory_gib": row.measured.memory_gb_per_gpu,
    }
    try:
        model = model_spec(row)
        cluster = run_cluster(row)
        job = run_job(row, model)
        space = search_space(row, model)
    except Uncovered as reason:
        return _uncovered(row, base, str(reason))
    if profile is not None:
        job = job.model_copy(update={"efficiency_profile": profile})
    accelerator = load_accelerator(cluster.accelerator)
    found = search(job, cluster, accelerator, row.hardware.num_gpus, space, mem_headroom=0.0)
    if found.feasible == 0 and (wider := sharded_further(row, space)) is not None:
        found = search(job, cluster, accelerator, row.hardware.num_gpus, wider, mem_headroom=0.0)
    if found.feasible == 0:
        reason = _no_layout_reason(found.rejected)
        if found.smallest_memory is not None:  # how far the least memory-hungry layout is off
            base |= {
                "predicted_memory_gib": found.smallest_memory["memory_per_gpu_bytes"] / GIB,
                "memory_capacity_gib": accelerator.hbm_bytes / GIB,
            }
        return _uncovered(row, base, reason)
    best = found.top_rows(1)[0]
    tokens = float(best["tokens_per_s_per_gpu"])
    flops_per_token = float(best["model_tflops_per_gpu"]) * 1e12 / tokens
    causal_share = float(best["mfu_causal"]) / float(best["mfu"])
    counts = {"full": flops_per_token, "causal": flops_per_token * causal_share}
    measured, measured_from = measured_tokens_per_s(row, counts)
    if measured is None:
        return _uncovered(row, base, "no measured throughput")
    mfu = float(best["mfu"])
    features = {key: float(best[key]) for key in FEATURE_COLUMNS if key in best}
    layout = {key: _plain(best[key]) for key in LAYOUT_COLUMNS}
    measured_range = measured_layout_range(profile, accelerator.id)
    seq_len, num_gpus = row.training.seq_len, row.hardware.num_gpus
    return RowPrediction(
        **{
            **base,
            "measured_step_time_s": row.training.global_batch_tokens
            / measured
            / row.hardware.num_gpus,
        },
        covered=True,
        layout=layout,
        measured_tokens_per_s_per_gpu=measured,
        measured_from=measured_from,
        predicted_tokens_per_s_per_gpu=tokens,
        error=tokens / measured - 1,
        predicted_step_time_s=float(best["step_time_s"]),
        predicted_mfu=mfu,
        measured_mfu=mfu * measured / tokens,
        predicted_mfu_causal=float(best["mfu_causal"]),
        predicted_memory_gib=float(best["memory_per_gpu_bytes"]) / GIB,
        features=features,
        outside_measured_layouts=outside_reasons(
            layout, measured_range, seq_len, num_gpus, features.get("attention_share")
        ),
    )


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def error_stats(name: str, rows: list[RowPrediction], worst: int = 3) -> ErrorStats:
    """n, MAPE, median signed error, share within ±20% and the worst rows of ``rows``."""
    errors = np.array([r.error for r in rows])
    order = np.argsort(-np.abs(errors))[:worst]
    return ErrorStats(
        name=name,
        n=len(rows),
        num_groups=len({r.group for r in rows}),
        mape=float(np.mean(np.abs(errors))),
        median_signed_error=float(np.median(errors)),
        within_20pct=float(np.mean(np.abs(errors) <= 0.2)),
        worst=[(rows[i].id, float(errors[i])) for i in order],
    )


def _grouped(rows: list[RowPrediction], key) -> list[ErrorStats]:
    names = sorted({key(r) for r in rows})
    return [error_stats(name, [r for r in rows if key(r) == name]) for name in names]


def summarize(predictions: list[RowPrediction], runs: str, profile: str) -> RunsCheck:
    """The per-source / accelerator / precision tables and coverage of ``predictions``."""
    covered = [r for r in predictions if r.covered]
    uncovered: dict[str, int] = {}
    for r in predictions:
        if not r.covered:
            uncovered[r.reason] = uncovered.get(r.reason, 0) + 1
    return RunsCheck(
        runs=runs,
        profile=profile,
        num_rows=len(predictions),
        num_covered=len(covered),
        uncovered=dict(sorted(uncovered.items(), key=lambda item: -item[1])),
        overall=error_stats("all", covered) if covered else None,
        by_source=_grouped(covered, lambda r: r.source_family),
        by_accelerator=_grouped(covered, lambda r: r.accelerator),
        by_precision=_grouped(covered, lambda r: f"{r.accelerator} {r.precision}"),
        rows=predictions,
    )
