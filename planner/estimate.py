"""One layout → :class:`Estimate`: step time with its breakdown, throughput, MFU, memory.

The numbers come from :func:`planner.evaluate.evaluate_columns` on a single row — the same
code the search screens with — so an estimate and the search's row for that layout agree.
The per-stage memory table comes from :func:`planner.memory_report.memory_report` (a test checks
that its peak equals the row's). MFU follows PaLM Appendix B: model FLOPs per token (no
recomputation, attention counted non-causally as ``12·L·h·s``) × tokens per second per GPU
over the dense peak of ``mfu_dtype``; ``mfu_causal`` counts only the causal half of the
attention products, as DeepSeek reports; HFU adds recomputation. Under a fine-tuning recipe
the model FLOPs are the recipe's (frozen base: no weight gradients; adapters added), and the
optimizer term updates only the adapters; Muon's gather shows as ``optimizer_comm``.
``link_contention`` is the time lost where several axes' traffic shares one link
(:mod:`planner.comm.contention`); ``busiest_link_s`` is how long the busiest link of a GPU
carries traffic per step.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

from hwspecs.catalog import load_accelerator
from hwspecs.errors import PlanError
from hwspecs.schema import Cluster
from planner.comm.traffic import AXES
from planner.cost.goodput import TimeToTrain
from planner.cost.memory import DEFAULT_MEM_HEADROOM, MEMORY_PARTS
from planner.cost.profile import PROFILE_PARTS, profile_intervals
from planner.evaluate import evaluate_columns, layout_columns
from planner.layout_range import measured_layout_range, outside_reasons
from planner.memory_report import StageMemory, memory_report
from planner.spec.job import Job
from planner.spec.layout import Layout
from planner.spec.rules import check_layout

TIME_PARTS = (
    "compute",
    "recompute",
    "pipeline_bubble",
    *(f"{a}_exposed" for a in AXES),
    "optimizer",
    "optimizer_comm",
    "link_contention",
)


class Estimate(BaseModel):
    """Predicted step of one layout. JSON names are stable."""

    model: str
    cluster: str
    accelerator: str
    num_gpus: int
    layout: Layout
    num_microbatches: int
    step_time_s: float
    time_breakdown_s: dict[str, float]
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    mfu_causal: float
    hfu: float
    mfu_dtype: str
    bubble_fraction: float
    stage_times_s: dict[str, float]
    comm_bytes_per_step: dict[str, float]
    comm_time_s: dict[str, float]
    exposed_comm_s: float
    busiest_link_s: float
    memory_per_gpu_bytes: float
    memory_breakdown_bytes: dict[str, float]
    per_stage_memory: list[StageMemory]
    capacity_bytes: int
    mem_headroom: float
    usable_bytes: float
    fits: bool
    #: The efficiency profile applied (None: the ideal model) and, with one, the band its
    #: cross-validated error implies (10th–90th percentile of measured / predicted).
    profile: str | None = None
    #: Whether the job's stack overlaps TP communication with the GEMMs (the profile's
    #: ``tp_comm_overlap`` share of it is hidden; :mod:`planner.spec.stack`).
    tp_comm_overlap: bool = False
    #: Whether the stack runs Megatron-Core's combined 1F1B, which hides EP all-to-alls
    #: behind another micro-batch's compute (:func:`planner.comm.rows.ep_paired_share`).
    ep_comm_overlap: bool = False
    #: Whether the layers replay from CUDA graphs (no per-kernel launch cost).
    cuda_graphs: bool = False
    #: The fused attention kernel timed (None: the accelerator's default rates), the job's
    #: or its stack's (:func:`planner.spec.stack.stack_attention_kernel`).
    attention_kernel: str | None = None
    step_time_interval_s: tuple[float, float] | None = None
    tokens_per_s_per_gpu_interval: tuple[float, float] | None = None
    mfu_interval: tuple[float, float] | None = None
    #: The axes on which the layout lies beyond the runs the profile (the ideal model: the
    #: accelerator's shipped profile) was measured on, e.g. ``pp 64 > 16``: no measured
    #: error speaks for it there (:mod:`planner.layout_range`); empty inside them.
    outside_measured_layouts: list[str] = []
    #: Weights, master weights and optimizer states the busiest-writing rank saves per
    #: checkpoint (replicas split over the data-parallel group; :mod:`planner.cost.goodput`).
    checkpoint_bytes_per_rank: float = 0.0
    #: Time, GPU-hours, energy, cost and goodput of a token budget (``--train-tokens``).
    time_to_train: TimeToTrain | None = None


def estimate(
    job: Job,
    layout: Layout,
    cluster: Cluster,
    gpus: int | None = None,
    mfu_dtype: str = "bf16",
    mem_headroom: float = DEFAULT_MEM_HEADROOM,
    order=None,
) -> Estimate:
    """Predict one step of ``job`` under ``layout`` on ``cluster`` (its first ``gpus`` devices)."""
    return estimates(job, [layout], cluster, gpus, mfu_dtype, mem_headroom, order)[0]


def estimates(
    job: Job,
    layouts: list[Layout],
    cluster: Cluster,
    gpus: int | None = None,
    mfu_dtype: str = "bf16",
    mem_headroom: float = DEFAULT_MEM_HEADROOM,
    order=None,
) -> list[Estimate]:
    """:func:`estimate` of each of ``layouts``, their one-row columns evaluated in one call
    (a row's outputs are the same alone or beside others; a plan's results are its top
    rows' estimates)."""
    for layout in layouts:
        check_layout(layout, job.model, job.seq_len, cp_inner=_cp_inner(layout, cluster, order),
                     replicate_kv=job.ulysses_kv_heads == "replicate")  # fmt: skip
        if gpus is not None and gpus != layout.num_gpus:
            raise PlanError(f"tp·cp·pp·dp = {layout.num_gpus} GPUs, but --gpus is {gpus}")
        if layout.num_gpus > cluster.num_gpus:
            raise PlanError(
                f"layout needs {layout.num_gpus} GPUs, cluster {cluster.id} has {cluster.num_gpus}"
            )
    if not layouts:
        return []
    accelerator = load_accelerator(cluster.accelerator)
    counts = [layout.resolved_num_microbatches(job.global_batch_size) for layout in layouts]
    rows = [layout_columns(layout, m) for layout, m in zip(layouts, counts, strict=True)]
    columns = {key: np.concatenate([row[key] for row in rows]) for key in rows[0]}
    evaluated = evaluate_columns(
        job, cluster, accelerator, columns, order=order, mfu_dtype=mfu_dtype
    )  # fmt: skip
    return [
        _estimate(job, layout, cluster, accelerator, m,
                  {key: column[i] for key, column in evaluated.items()}, mfu_dtype, mem_headroom)
        for i, (layout, m) in enumerate(zip(layouts, counts, strict=True))
    ]  # fmt: skip


def _estimate(
    job: Job, layout: Layout, cluster: Cluster, accelerator, m: int, value: dict,
    mfu_dtype: str, mem_headroom: float,
) -> Estimate:  # fmt: skip
    """One layout's :class:`Estimate` from its row of the columns model (``value``)."""
    if not value["valid"]:
        raise PlanError("this layout cannot be placed on the cluster (see `llmplan topology`)")
    memory = memory_report(job, layout, accelerator, mem_headroom)
    breakdown = {
        "compute": float(value["compute_s"]),
        "recompute": float(value["recompute_s"]),
        "pipeline_bubble": float(value["pipeline_bubble_s"]),
        **{f"{axis}_exposed": float(value[f"{axis}_exposed_time_s"]) for axis in AXES},
        "optimizer": float(value["optimizer_s"]),
    }
    if job.precision.optimizer == "muon":  # Muon's gather of whole matrices, reported apart
        breakdown["optimizer_comm"] = float(value["optimizer_comm_s"])
    breakdown["link_contention"] = float(value["link_contention_s"])
    breakdown |= {part: float(value[f"{part}_s"]) for part in PROFILE_PARTS if f"{part}_s" in value}
    return Estimate(
        model=job.model.name,
        cluster=cluster.id,
        accelerator=accelerator.id,
        num_gpus=layout.num_gpus,
        layout=layout,
        num_microbatches=m,
        tp_comm_overlap=bool(job.tp_comm_overlap),
        ep_comm_overlap=job.ep_comm_overlap,
        cuda_graphs=job.cuda_graphs,
        attention_kernel=job.attention_kernel,
        step_time_s=float(value["step_time_s"]),
        time_breakdown_s=breakdown,
        tokens_per_s_per_gpu=float(value["tokens_per_s_per_gpu"]),
        model_tflops_per_gpu=float(value["model_tflops_per_gpu"]),
        hardware_tflops_per_gpu=float(value["hardware_tflops_per_gpu"]),
        mfu=float(value["mfu"]),
        mfu_causal=float(value["mfu_causal"]),
        hfu=float(value["hfu"]),
        mfu_dtype=mfu_dtype,
        bubble_fraction=float(value["bubble_fraction"]),
        stage_times_s={
            "forward": float(value["forward_s"]),
            "input_grad": float(value["input_grad_s"]),
            "weight_grad": float(value["weight_grad_s"]),
            "recompute": float(value["recompute_per_microbatch_s"]),
        },
        comm_bytes_per_step={axis: float(value[f"{axis}_bytes_per_step"]) for axis in AXES},
        comm_time_s={axis: float(value[f"{axis}_time_s"]) for axis in AXES},
        exposed_comm_s=float(value["exposed_comm_s"]),
        busiest_link_s=float(value["busiest_link_s"]),
        memory_per_gpu_bytes=memory.total_bytes,
        memory_breakdown_bytes={part: memory.breakdown_bytes[part] for part in MEMORY_PARTS},
        per_stage_memory=memory.per_stage,
        capacity_bytes=accelerator.hbm_bytes,
        mem_headroom=mem_headroom,
        usable_bytes=memory.usable_bytes,
        fits=memory.fits,
        **profile_intervals(job.efficiency_profile, value, _gemm_peak(accelerator, job)),
        outside_measured_layouts=_outside_measured_layouts(
            job, layout, accelerator.id, float(value["attention_share"])
        ),
        checkpoint_bytes_per_rank=float(value["checkpoint_bytes_per_rank"]),
    )


def _outside_measured_layouts(
    job: Job, layout: Layout, accelerator: str, attention_share: float
) -> list[str]:
    """The axes ``layout`` leaves the runs the job's profile was measured on, and an
    attention FLOP share (``attention_share``) beyond theirs."""
    measured = measured_layout_range(job.efficiency_profile, accelerator)
    return outside_reasons(
        layout.model_dump(), measured, job.seq_len, layout.num_gpus, attention_share
    )


def _gemm_peak(accelerator, job: Job) -> float | None:
    """The dense peak FLOP/s of the job's GEMM dtype (None where the spec lists none)."""
    try:
        return accelerator.peak_flops_per_s(job.precision.gemm_dtype)
    except ValueError:
        return None


def _cp_inner(layout: Layout, cluster: Cluster, order) -> int | None:
    """Hierarchical CP's inner degree on ``cluster`` (None for the other algorithms)."""
    if layout.cp_algorithm != "hierarchical":
        return None
    if layout.cp_inner is not None:
        return layout.cp_inner
    from planner.comm.context_parallel import cp_inner_degree
    from planner.comm.topology import degrees
    from planner.spec.layout import DEFAULT_MESH_ORDER

    scale_up = cluster.scale_up_domain_size
    return cp_inner_degree(degrees(layout), order or DEFAULT_MESH_ORDER, scale_up)
