"""Communication per training step of one layout, per parallel axis, explained.

For each axis: the collectives one GPU takes part in per optimizer step (formulas and
overlap rules in :mod:`planner.comm.terms`), the tier they run on, the algorithm, the
bytes sent, and raw and exposed time. Exposed time needs compute times
(:class:`ComputeTimes`); without them every term is reported fully exposed (exposed = raw).
:mod:`planner.comm.traffic` computes the same numbers for many layouts at once.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, Field

from hwspecs.catalog import load_accelerator
from hwspecs.schema import Cluster
from planner.comm.collectives import algorithm_costs, choose, volume_factor
from planner.comm.context_parallel import (
    RING_RULE,
    cp_inner_degree,
    placement_group,
    ring_exposed_time,
)
from planner.comm.exposure import ep_overlap_sm_share, exposed_time
from planner.comm.mesh import group_size
from planner.comm.rows import ep_paired_share
from planner.comm.terms import (
    AXIS_GROUPS,
    NO_COMPUTE_RULE,
    NO_OVERLAP_RULE,
    RULES,
    ep_routing,
    step_terms,
)
from planner.comm.topology import axis_report, place_groups
from planner.cost.compute import GpuRates
from planner.pipeline.schedules.registry import (
    BIDIRECTIONAL_SCHEDULES,
    V_SHAPE_SCHEDULES,
    get_schedule,
)
from planner.spec.job import Job
from planner.spec.layout import CP_ALGORITHMS, DEFAULT_MESH_ORDER, Layout
from planner.spec.rules import check_layout


class ComputeTimes(BaseModel):
    """Compute of one micro-batch on the busiest pipeline rank (all its chunks), seconds."""

    forward_s: float = Field(ge=0)
    backward_s: float = Field(ge=0, description="input + weight gradients")


class CollectiveTerm(BaseModel):
    collective: str
    what: str
    algorithm: str
    count_per_step: float
    message_bytes: float
    bytes_per_step: float
    time_s: float
    exposed_time_s: float
    overlap_rule: str


class AxisTraffic(BaseModel):
    """Communication of one axis per step and per GPU (busiest rank)."""

    axis: str
    group_size: int
    tier: str
    tiers: list[str]
    collective: str
    bytes_per_step: float
    time_s: float
    exposed_time_s: float
    terms: list[CollectiveTerm]


class CommReport(BaseModel):
    cluster: str
    model: str
    num_gpus: int
    order: list[str]
    sizes: dict[str, int]
    num_microbatches: int
    compute_given: bool
    axes: list[AxisTraffic]
    total_time_s: float
    total_exposed_time_s: float
    notes: list[str]


# ----- one layout, explained -------------------------------------------------------------


def _ring_rates(job: Job, layout: Layout, placement) -> GpuRates | None:
    """The GPU's rates, which time ring attention's blocks (None without a ring)."""
    if layout.cp == 1 or layout.cp_algorithm not in ("ring", "hierarchical"):
        return None
    return GpuRates.of(
        load_accelerator(placement.view.cluster.accelerator),
        job.precision.gemm_dtype,
        job.attention_kernel,
    )


def axis_traffic(
    job: Job,
    layout: Layout,
    cluster: Cluster | str,
    order=DEFAULT_MESH_ORDER,
    gpus: int | None = None,
    compute: ComputeTimes | None = None,
    tp_comm_overlap: bool = False,
) -> CommReport:
    """Per-axis bytes, tier, raw and exposed time per step for one layout (see module doc)."""
    check_layout(layout, job.model, job.seq_len, replicate_kv=job.ulysses_kv_heads == "replicate")
    spec = get_schedule(layout.schedule)
    chunks = spec.fixed_vpp or layout.vpp
    m = layout.resolved_num_microbatches(job.global_batch_size)
    placement = place_groups(cluster, layout, order, gpus)
    sizes = placement.sizes
    args = [np.asarray(sizes[a]) for a in ("tp", "cp", "pp", "dp", "ep")]
    inner = layout.cp_inner or cp_inner_degree(
        sizes, placement.order, placement.view.cluster.scale_up_domain_size
    )
    terms = step_terms(
        job,
        *args,
        np.asarray(chunks),
        layout.micro_batch_size,
        m,
        np.asarray(layout.sequence_parallel),
        int(layout.recompute == "full"),
        np.asarray(layout.zero_stage),
        layout.pipeline_layer_split,
        layout.schedule in V_SHAPE_SCHEDULES,
        sizes.get("etp"),
        layout.schedule in BIDIRECTIONAL_SCHEDULES,
        CP_ALGORITHMS.index(layout.cp_algorithm),
        inner,
        _ring_rates(job, layout, placement),
    )
    times = None if compute is None else (compute.forward_s, compute.backward_s)
    by_axis: dict[str, list[CollectiveTerm]] = {}
    timed = []
    for term in terms:
        count, message = float(term.count), float(term.message_bytes)
        if count == 0:
            continue
        group = placement_group(placement, term.group or AXIS_GROUPS[term.axis], inner)
        n = group.group_size
        levels = (group.neighbour_level,) if term.op == "p2p" else group.levels
        routing = ep_routing(job.model) if term.axis == "ep" else None
        costs = algorithm_costs(term.op, levels, n, routing)
        name, cost = choose(costs, message)
        one = cost.time_s(message)
        bucket = one
        if term.bucket_bytes:
            bucket = choose(costs, float(term.bucket_bytes))[1].time_s(float(term.bucket_bytes))
        timed.append((term, count, message, n, name, one, bucket, count * one))
    pooled = sum(raw for term, *_, raw in timed if term.rule == "ep")  # one paired window
    ep_paired = ep_paired_share(
        job, np.asarray([layout.schedule]), sizes["pp"], m, chunks, sizes["ep"],
        int(layout.recompute == "full"),
    )[0]  # fmt: skip
    accelerator = load_accelerator(placement.view.cluster.accelerator)
    sm_share = ep_overlap_sm_share(accelerator.num_compute_units)
    overlap_times = times if accelerator.overlaps_communication else None
    for term, count, message, n, name, one, bucket, raw in timed:
        exposed = exposed_time(
            term.rule,
            raw,
            one,
            bucket,
            m,
            sizes["pp"],
            chunks,
            overlap_times,
            tp_comm_overlap,
            ep_paired,
            pooled=pooled if term.rule == "ep" else None,
            sm_share=sm_share,
        )
        if term.rule == RING_RULE and overlap_times is not None:  # behind the block compute
            exposed = ring_exposed_time(raw, count, one, float(term.overlap_s), float(term.extra_s))
        rule = RULES[term.rule] if times is not None else NO_COMPUTE_RULE
        if times is not None and not accelerator.overlaps_communication:
            rule = NO_OVERLAP_RULE
        by_axis.setdefault(term.axis, []).append(
            CollectiveTerm(
                collective=term.op,
                what=term.what,
                algorithm=name,
                count_per_step=count,
                message_bytes=message,
                bytes_per_step=count * message * volume_factor(term.op, n),
                time_s=raw,
                exposed_time_s=float(exposed),
                overlap_rule=rule,
            )
        )
    axes = []
    for axis, group_name in AXIS_GROUPS.items():
        if axis not in by_axis:
            continue
        where = axis_report(placement.groups[group_name])
        parts = by_axis[axis]
        axes.append(
            AxisTraffic(
                axis=axis,
                group_size=group_size(group_name, sizes),
                tier=where.tier,
                tiers=where.tiers,
                collective=" + ".join(dict.fromkeys(t.collective for t in parts)),
                bytes_per_step=sum(t.bytes_per_step for t in parts),
                time_s=sum(t.time_s for t in parts),
                exposed_time_s=sum(t.exposed_time_s for t in parts),
                terms=parts,
            )
        )
    notes = [
        "bytes_per_step: bytes one GPU sends per optimizer step, on the busiest pipeline rank",
        f"{m} micro-batches of {layout.micro_batch_size} sequences of {job.seq_len} tokens",
        "axes run one after another in time_s totals; time lost where axes share a link is "
        "the estimate's link_contention term (planner.comm.contention)",
    ]
    if compute is None:
        notes.append(NO_COMPUTE_RULE + " (pass compute times for the overlap rules)")
    return CommReport(
        cluster=placement.view.cluster.id,
        model=job.model.name,
        num_gpus=placement.view.num_gpus,
        order=list(placement.order),
        sizes=sizes,
        num_microbatches=m,
        compute_given=compute is not None,
        axes=axes,
        total_time_s=sum(a.time_s for a in axes),
        total_exposed_time_s=sum(a.exposed_time_s for a in axes),
        notes=notes,
    )
