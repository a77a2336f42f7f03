"""One layout: its memory, collectives, per-axis communication, placement, schedule and
estimate (with its time to train)."""

from __future__ import annotations

from hwspecs.errors import PlanError, unknown_name_error
from planner.api.inputs import (
    _checked_headroom,
    with_profile,
)


def memory(
    job,
    layout,
    accelerator: str | None = None,
    mem_headroom: float | None = None,
    cluster: str | None = None,
):
    """Memory per GPU for ``job`` under ``layout`` (see :func:`planner.memory_report.memory_report`),
    checked against ``accelerator``'s HBM, or that of ``cluster``'s accelerator."""
    from hwspecs.catalog import load_accelerator, load_cluster
    from planner.memory_report import memory_report

    if accelerator is None and cluster is not None:
        accelerator = load_cluster(cluster).accelerator
    spec = load_accelerator(accelerator) if accelerator else None
    return memory_report(job, layout, spec, _checked_headroom(mem_headroom))


def collective(
    op: str,
    num_bytes,
    ranks: int,
    cluster: str,
    algorithm: str | None = None,
    gpus: int | None = None,
):
    """One collective on one cluster: time, algorithm and bus bandwidth."""
    from hwspecs.catalog import load_cluster
    from planner.comm.collectives import collective_time, parse_num_bytes

    return collective_time(
        op, parse_num_bytes(num_bytes), ranks, load_cluster(cluster), algorithm=algorithm, gpus=gpus
    )


def comm(job, layout, cluster: str, order: str | None = None, gpus: int | None = None):
    """Per-axis communication of ``job`` under ``layout`` on ``cluster``: raw time, and the
    time exposed behind the compute the columns model gives this layout (the estimate's)."""
    from hwspecs.catalog import load_accelerator, load_cluster
    from planner.comm.mesh import resolve_order
    from planner.comm.report import ComputeTimes, axis_traffic
    from planner.estimate import layout_columns
    from planner.evaluate import evaluate_columns
    from planner.spec.layout import DEFAULT_MESH_ORDER
    from planner.spec.rules import check_layout

    check_layout(layout, job.model, job.seq_len, replicate_kv=job.ulysses_kv_heads == "replicate")
    mesh = resolve_order(order) if order else DEFAULT_MESH_ORDER
    spec = load_cluster(cluster)
    m = layout.resolved_num_microbatches(job.global_batch_size)
    row = evaluate_columns(
        job, spec, load_accelerator(spec.accelerator), layout_columns(layout, m), order=mesh
    )
    compute = ComputeTimes(  # the busiest rank's, per micro-batch, as the estimate times it
        forward_s=float(row["forward_s"][0]),
        backward_s=float(
            row["input_grad_s"][0] + row["recompute_per_microbatch_s"][0] + row["weight_grad_s"][0]
        ),
    )
    return axis_traffic(
        job, layout, spec, order=mesh, gpus=gpus or layout.num_gpus, compute=compute
    )


def topology(
    cluster: str, sizes: dict[str, int], order: str | None = None, gpus: int | None = None
):
    """Rank placement of each axis on ``cluster`` and the links each group crosses."""
    from hwspecs.catalog import load_cluster
    from planner.comm.mesh import resolve_order
    from planner.comm.topology import topology_report
    from planner.spec.layout import DEFAULT_MESH_ORDER

    mesh = resolve_order(order) if order else DEFAULT_MESH_ORDER
    return topology_report(load_cluster(cluster), sizes, order=mesh, gpus=gpus)


def schedule(
    name: str,
    pp: int,
    num_microbatches: int,
    vpp: int | None = None,
    f: float = 1.0,
    b: float = 1.0,
    w: float = 1.0,
    comm: float = 0.0,
    overlap_fb: float = 0.0,
    microbatch_group_size: int | None = None,
):
    """Generate and simulate one schedule with uniform stages (durations per rank per micro-batch)."""
    from planner.pipeline.report import schedule_report
    from planner.pipeline.schedules import SCHEDULES

    if name not in SCHEDULES:
        raise unknown_name_error("schedule", name, SCHEDULES)
    for label, value in (("f", f), ("b", b), ("w", w)):
        if value < 0:
            raise PlanError(f"--{label} must be ≥ 0, got {value}")
    if comm < 0:
        raise PlanError(f"--comm must be ≥ 0, got {comm}")
    if not 0 <= overlap_fb <= 1:
        raise PlanError(f"--overlap-fb must be in [0, 1], got {overlap_fb}")
    options = {"microbatch_group_size": microbatch_group_size} if microbatch_group_size else {}
    if options and name != "interleaved-1f1b":
        raise PlanError("--microbatch-group-size applies only to interleaved-1f1b")
    return schedule_report(name, pp, num_microbatches, vpp, f, b, w, comm, overlap_fb, **options)


def _with_time_to_train(detail, job, training):
    """``detail`` (an Estimate) with its ``time_to_train`` section for ``training``."""
    from planner.cost.goodput import time_to_train

    section = time_to_train(
        detail.step_time_s,
        detail.checkpoint_bytes_per_rank,
        detail.num_gpus,
        detail.tokens_per_s_per_gpu * detail.num_gpus * detail.step_time_s,
        training,
    )
    return detail.model_copy(update={"time_to_train": section})


def estimate(
    job,
    layout,
    cluster: str,
    gpus: int | None = None,
    mfu_dtype: str = "bf16",
    mem_headroom: float | None = None,
    order: str | None = None,
    profile: str | None = None,
    training=None,
    stack: str | None = None,
):
    """One layout's predicted step (see :func:`planner.estimate.estimate`); ``profile`` and
    ``stack``: see :func:`with_profile` (None: the ideal model); with ``training`` (:func:`build_training`), its time to train too."""
    mem_headroom = _checked_headroom(mem_headroom)
    from hwspecs.catalog import load_cluster
    from planner.comm.mesh import resolve_order
    from planner.estimate import estimate as estimate_layout

    spec = load_cluster(cluster)
    job = with_profile(job, spec.accelerator, profile, stack)
    mesh = resolve_order(order) if order else None
    detail = estimate_layout(job, layout, spec, gpus, mfu_dtype, mem_headroom, order=mesh)
    return detail if training is None else _with_time_to_train(detail, job, training)


def layout_warnings(layout, cluster: str) -> list[str]:
    """What a search would have rejected in a layout a user gave by hand (it still runs).

    The same rule as the search's: TP beyond the cluster's scale-up (NVLink) domain.
    """
    from hwspecs.catalog import load_cluster

    spec = load_cluster(cluster)
    warnings = []
    if layout.tp > spec.scale_up_domain_size:
        warnings.append(
            f"tp {layout.tp} crosses the {spec.scale_up_domain_size}-GPU scale-up domain of "
            f"{spec.id}: its all-reduces run over the scale-out network (plan rejects this "
            "unless --allow-cross-node-tp)"
        )
    return warnings


def layout_timeline(
    job, layout, cluster: str, result, profile: str | None = None, stack: str | None = None
):
    """The pipeline of an estimate (``result``, of :func:`estimate`) as the event simulator
    runs it: each virtual stage's own F, B (+ recompute) and W per micro-batch, scaled to the
    estimate's busiest rank (:func:`planner.refine.scaled_stage_durations`), in milliseconds.
    A :class:`planner.pipeline.report.ScheduleReport` whose times are ms; ``profile`` and
    ``stack`` as the estimate's."""
    from hwspecs.catalog import load_accelerator, load_cluster
    from planner.pipeline.report import schedule_report
    from planner.refine import scaled_stage_durations

    spec = load_cluster(cluster)
    accelerator = load_accelerator(spec.accelerator)
    job = with_profile(job, spec.accelerator, profile, stack)
    times = result.stage_times_s
    busiest = times["forward"] + times["input_grad"] + times["recompute"] + times["weight_grad"]
    f, b, w = scaled_stage_durations(job, layout, accelerator, busiest)
    return schedule_report(
        layout.schedule, layout.pp, result.num_microbatches, layout.vpp, 1e3 * f, 1e3 * b, 1e3 * w
    )
