"""Predicted vs measured, per layout and per term, with the error of each.

Predictions come from the planner exactly as a user gets them, for the exact model and
layout that ran (:meth:`validate.spec.RunSpec.job`: FP32 AdamW, no CUDA runtime overhead):

* memory: :func:`planner.memory_report.memory_report` (max over pipeline ranks, and per rank);
* comm bytes per axis: :func:`predict_comm_bytes` over :func:`planner.comm.report.axis_traffic`;
* step time (and bubble): :func:`predict_step_time` over :func:`planner.estimate.estimate`
  on the calibrated cluster.

Measured values (:class:`validate.results.RunResult`): memory is the max over ranks of the
peak tensor memory; comm bytes are what each rank sends per step under the standard
algorithms (:func:`validate.instrument.sent_bytes`), busiest rank, per axis and summed;
step time is the median over timed steps of the slowest rank.

``error`` is relative, ``(predicted − measured) / measured``; the bubble's is the difference.
"""

from __future__ import annotations

import statistics
from typing import Any

from pydantic import BaseModel, Field

from hwspecs.errors import PlanError
from hwspecs.schema import Accelerator, Cluster
from planner.api import Job, Layout
from validate.results import RunResult
from validate.timelines import measured_pipeline, replay

#: The issue's targets: comm bytes exact, memory within 10 %, step time within 25 % (median).
TARGETS = {"comm_bytes": 0.0, "memory_bytes": 0.10, "step_time_s": 0.25}


class StepTimePrediction(BaseModel):
    step_time_s: float
    bubble_fraction: float | None = None


class RunComparison(BaseModel):
    name: str
    status: str
    layout: dict[str, Any]
    predicted: dict[str, Any]
    measured: dict[str, Any]
    error: dict[str, Any]
    notes: list[str] = Field(default_factory=list)
    failures: list[dict[str, Any]] = Field(default_factory=list)


class ValidationReport(BaseModel):
    cluster: str
    runs: list[RunComparison]
    summary: dict[str, Any]


# ----- hooks into the planner --------------------------------------------------------------


def predict_comm_bytes(job: Job, layout: Layout, cluster: Cluster | str) -> dict[str, float]:
    """Bytes one GPU sends per step, per axis, from :func:`planner.comm.report.axis_traffic`."""
    try:
        from planner.api import axis_traffic
    except ImportError as error:
        raise NotImplementedError(
            f"comm-bytes prediction needs planner/traffic.py ({error})"
        ) from error
    report = axis_traffic(job, layout, cluster)
    return {axis.axis: float(axis.bytes_per_step) for axis in report.axes}


def predict_step_time(job: Job, layout: Layout, cluster: Cluster | str) -> StepTimePrediction:
    """Step time and bubble from :func:`planner.estimate.estimate` on the (calibrated) cluster."""
    from hwspecs.catalog import load_cluster
    from planner.api import estimate_layout as estimate

    if cluster is None:
        raise PlanError("no cluster given (calibrate this machine: llmplan calibrate)")
    spec = load_cluster(cluster) if isinstance(cluster, str) else cluster
    result = estimate(job, layout, spec)
    return StepTimePrediction(
        step_time_s=result.step_time_s, bubble_fraction=result.bubble_fraction
    )


def predict_memory(job: Job, layout: Layout, accelerator: Accelerator | None = None):
    """The planner's memory report for this job and layout."""
    from planner.api import memory_report

    return memory_report(job, layout, accelerator)


# ----- comparison --------------------------------------------------------------------------


def _relative(predicted, measured):
    if predicted is None or measured is None or measured == 0:
        return None
    return (predicted - measured) / measured


def _resolve_cluster(cluster) -> tuple[Cluster | str | None, Accelerator | None, str]:
    """(cluster for the planner, its accelerator, a label) from a calibration, spec or name."""
    from hwspecs.catalog import load_accelerator, load_cluster

    if cluster is None:
        return None, None, "none"
    if hasattr(cluster, "cluster") and hasattr(cluster, "paths"):  # ClusterCalibration
        path = cluster.paths.get("cluster")
        spec = cluster.cluster
        return spec, load_accelerator(spec.accelerator), path or spec.id
    if isinstance(cluster, str):
        spec = load_cluster(cluster)
        return spec, load_accelerator(spec.accelerator), cluster
    return cluster, load_accelerator(cluster.accelerator), cluster.id


def _p2p_seconds(spec, cluster) -> float:
    """One pipeline hop (a micro-batch's activation) on the cluster's first tier, or 0."""
    if cluster is None:
        return 0.0
    from hwspecs.catalog import load_cluster, load_link
    from planner.api import p2p_time

    spec_cluster = load_cluster(cluster) if isinstance(cluster, str) else cluster
    link = load_link(spec_cluster.tiers[0].link)
    workload = spec.workload
    message = spec.layout.micro_batch_size * workload.seq_len * workload.hidden_size * 4
    return p2p_time(link.latency_s, message, link.bytes_per_s_per_direction)


def _pp_coordinate(rank: int, layout: Layout) -> int:
    """Pipeline index of a global rank on the (dp, pp, cp, tp) mesh."""
    return (rank // (layout.cp * layout.tp)) % layout.pp


def compare_run(result: RunResult, cluster, accelerator) -> RunComparison:
    spec = result.spec
    job, layout = spec.job(), spec.planner_layout()
    layout_json = {
        **{axis: getattr(layout, axis) for axis in ("tp", "cp", "pp", "dp", "ep", "vpp")},
        "schedule": spec.layout.schedule,
        "cp_algorithm": layout.cp_algorithm,
        "cp_inner": layout.cp_inner,
        "zero_stage": layout.zero_stage,
        "sequence_parallel": layout.sequence_parallel,
        "micro_batch_size": layout.micro_batch_size,
        "num_microbatches": spec.num_microbatches,
        "world_size": spec.world_size,
        "model": spec.workload.name,
        "seq_len": spec.workload.seq_len,
    }
    notes: list[str] = []
    predicted: dict[str, Any] = {}
    memory = predict_memory(job, layout, accelerator)
    predicted["memory_bytes"] = memory.total_bytes
    predicted["memory_bytes_per_pp_rank"] = [stage.total_bytes for stage in memory.per_stage]
    predicted["memory_breakdown_bytes"] = memory.breakdown_bytes
    try:
        per_axis = predict_comm_bytes(job, layout, cluster) if cluster is not None else None
        if per_axis is None:
            notes.append("comm_bytes: no cluster given")
        else:
            predicted["comm_bytes_per_axis"] = per_axis
            predicted["comm_bytes"] = sum(per_axis.values())
    except NotImplementedError as error:
        notes.append(f"comm_bytes: {error}")
    try:
        timing = predict_step_time(job, layout, cluster)
        predicted["step_time_s"] = timing.step_time_s
        predicted["bubble_fraction"] = timing.bubble_fraction
    except PlanError as error:  # e.g. the cluster has no matmul efficiency for this dtype
        notes.append(f"step_time_s: no prediction: {error}")

    if not result.ok:
        failures = [f.model_dump() for f in result.failures]
        return RunComparison(name=result.name, status=result.status, layout=layout_json,
                             predicted=predicted, measured={}, error={}, notes=notes,
                             failures=failures)  # fmt: skip

    measured: dict[str, Any] = {
        "step_time_s": result.step_time_s(),
        "memory_bytes": result.memory_bytes(),
        "memory_bytes_per_rank": [r.peak_memory_bytes for r in result.ranks],
        "memory_breakdown_bytes": max(
            result.ranks, key=lambda r: r.peak_memory_bytes
        ).memory_breakdown_bytes,
        "comm_bytes_per_axis": result.comm_bytes_per_axis(busiest=True),
        "comm_bytes_per_axis_mean": result.comm_bytes_per_axis(busiest=False),
        "loss_relative_errors": result.loss_errors(),
    }
    measured["comm_bytes"] = sum(measured["comm_bytes_per_axis"].values())
    pipeline = measured_pipeline(result)
    if pipeline is not None:
        measured["pipeline"] = pipeline
        measured["bubble_fraction"] = pipeline["bubble_fraction"]
        replayed = replay(result, _p2p_seconds(spec, cluster))
        predicted["pipeline_replay"] = replayed
        if predicted.get("bubble_fraction") is None:
            predicted["bubble_fraction"] = replayed["bubble_fraction"]
            notes.append(
                "bubble_fraction: the planner's simulator replaying the measured F/B/W "
                "durations (pipeline_replay), until planner/estimate.py predicts it"
            )
    if layout.pp > 1:
        per_stage = {}
        for r in result.ranks:
            stage = _pp_coordinate(r.rank, layout)
            per_stage[stage] = max(per_stage.get(stage, 0), r.peak_memory_bytes)
        measured["memory_bytes_per_pp_rank"] = [per_stage[i] for i in range(layout.pp)]
        measured.update(_pipeline_order_checks(result))

    error: dict[str, Any] = {
        "memory_bytes": _relative(predicted.get("memory_bytes"), measured["memory_bytes"]),
        "comm_bytes": _relative(predicted.get("comm_bytes"), measured["comm_bytes"]),
        "step_time_s": _relative(predicted.get("step_time_s"), measured["step_time_s"]),
    }
    if "comm_bytes_per_axis" in predicted:
        axes = sorted(set(predicted["comm_bytes_per_axis"]) | set(measured["comm_bytes_per_axis"]))
        error["comm_bytes_per_axis"] = {
            axis: _relative(
                predicted["comm_bytes_per_axis"].get(axis, 0.0),
                measured["comm_bytes_per_axis"].get(axis, 0.0),
            )
            for axis in axes
        }
    if "memory_bytes_per_pp_rank" in measured:
        error["memory_bytes_per_pp_rank"] = [
            _relative(p, m)
            for p, m in zip(
                predicted["memory_bytes_per_pp_rank"],
                measured["memory_bytes_per_pp_rank"],
                strict=True,
            )
        ]
    if predicted.get("bubble_fraction") is not None and "bubble_fraction" in measured:
        error["bubble_fraction"] = predicted["bubble_fraction"] - measured["bubble_fraction"]
    return RunComparison(name=result.name, status=result.status, layout=layout_json,
                         predicted=predicted, measured=measured, error=error, notes=notes)  # fmt: skip


def _pipeline_order_checks(result: RunResult) -> dict[str, Any]:
    """Does each rank's executed action order equal torch's listed order and the planner's?"""
    torch_match = all(r.executed_order == r.torch_order for r in result.ranks)
    planner_orders = [r.planner_order for r in result.ranks]
    planner_match = None
    if all(order is not None for order in planner_orders):
        planner_match = all(r.executed_order == r.planner_order for r in result.ranks)
    return {"order_matches_torch": torch_match, "order_matches_planner": planner_match}


def cluster_for_world_size(cluster, world_size: int):
    """The cluster calibrated under ``world_size`` concurrent ranks, when the calibration
    wrote one (``<stem>-n<ranks>.toml`` beside the cluster file), else ``cluster`` itself."""
    from validate.local_specs import world_size_path

    if hasattr(cluster, "cluster") and hasattr(cluster, "paths"):  # ClusterCalibration
        return cluster.paths.get(f"cluster_n{world_size}", cluster)
    if isinstance(cluster, str) and cluster.endswith(".toml"):
        sized = world_size_path(cluster, world_size)
        return str(sized) if sized.exists() else cluster
    return cluster


def compare(results: list[RunResult], cluster=None) -> ValidationReport:
    """Predicted vs measured for every run; ``cluster``: a calibration, a Cluster or a name/path.

    Each run is predicted on the cluster calibrated under its own number of ranks, where
    there is one (:func:`cluster_for_world_size`)."""
    label = _resolve_cluster(cluster)[2]
    runs = []
    for result in results:
        sized = cluster_for_world_size(cluster, result.spec.world_size)
        planner_cluster, accelerator, _ = _resolve_cluster(sized)
        runs.append(compare_run(result, planner_cluster, accelerator))
    return ValidationReport(cluster=label, runs=runs, summary=summarize(runs))


def summarize(runs: list[RunComparison]) -> dict[str, Any]:
    """Mean and max absolute error per term, the targets and whether they are met."""
    terms = {}
    for term in ("memory_bytes", "comm_bytes", "step_time_s", "bubble_fraction"):
        errors = [abs(r.error[term]) for r in runs if r.error.get(term) is not None]
        if not errors:
            terms[term] = {"count": 0}
            continue
        stats = {
            "count": len(errors),
            "mean_abs": statistics.fmean(errors),
            "median_abs": statistics.median(errors),
            "max_abs": max(errors),
        }
        target = TARGETS.get(term)
        if target is not None:
            # Step time: the median over layouts; memory and comm: every layout.
            worst = stats["median_abs"] if term == "step_time_s" else stats["max_abs"]
            stats["target"] = target
            stats["met"] = worst <= target + 1e-9
        terms[term] = stats
    orders = [
        r.measured.get("order_matches_planner")
        for r in runs
        if "order_matches_planner" in r.measured
    ]
    return {
        "num_runs": len(runs),
        "num_ok": sum(r.status == "ok" for r in runs),
        "failed": [r.name for r in runs if r.status != "ok"],
        "error": terms,
        "pipeline_order_matches_planner": orders.count(True),
        "pipeline_runs": len(orders),
    }
