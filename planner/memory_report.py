"""Memory per GPU of one layout, on every pipeline rank, by part: a view of the columns
model (:func:`planner.evaluate.memory_every_rank` on a 1-row column) — the same numbers the
search screens with — with the detail a person reads: the terms with their formulas, one
layer's activation tensors, and a fine-tuning recipe's parts of the peak rank."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict

from planner.cost import activations as act
from planner.cost import adapters as ft
from planner.cost.memory import DEFAULT_MEM_HEADROOM, MEMORY_PARTS, usable_memory_bytes
from planner.evaluate import layout_columns, memory_every_rank
from planner.pipeline.closed_form import parameter_copies
from planner.pipeline.schedules.registry import BIDIRECTIONAL_SCHEDULES
from planner.spec.job import Job
from planner.spec.layout import Layout
from planner.spec.measures import measures_label
from planner.spec.precision import (
    optimizer_states_per_param,
    sharded_bytes_per_param,
    zero_shard_factors,
)
from planner.spec.rules import check_layout


class StageMemory(BaseModel):
    """Bytes on one GPU of one pipeline rank, by part."""

    model_config = ConfigDict(frozen=True)

    rank: int
    num_layers: int
    num_params: int
    num_expert_params: int
    inflight_microbatches: float
    weights: float
    gradients: float
    master_weights: float
    optimizer_states: float
    activations: float
    logits_buffers: float
    comm_buffers: float
    runtime_overhead: float
    #: This rank's parts summed (the JSON key of the quantity in every command).
    memory_per_gpu_bytes: float

    @property
    def total_bytes(self) -> float:
        """The same as ``memory_per_gpu_bytes`` (the key every command's JSON uses)."""
        return self.memory_per_gpu_bytes


class ExplainTerm(BaseModel):
    """One memory term with its formula and the numbers that went into it."""

    term: str
    formula: str
    values: str
    bytes: float


class MemoryReport(BaseModel):
    """Memory per GPU for one job and layout: the worst rank, its parts, and every rank."""

    model: str
    accelerator: str | None
    layout: Layout
    seq_len: int
    num_microbatches: int
    #: The peak rank's bytes (``plan``/``estimate`` name it the same).
    memory_per_gpu_bytes: float
    capacity_bytes: int | None
    #: The fraction of HBM kept free, and what that leaves (:func:`usable_memory_bytes`).
    mem_headroom: float
    usable_bytes: float | None
    fits: bool | None
    peak_rank: int
    breakdown_bytes: dict[str, float]
    activation_tensors_per_layer: dict[str, float]
    per_stage: list[StageMemory]
    explain: list[ExplainTerm]
    recipe: str = "full"
    #: The peak rank's bytes split by a fine-tuning recipe's parts (sums to memory_per_gpu_bytes).
    recipe_breakdown_bytes: dict[str, float] | None = None

    @property
    def total_bytes(self) -> float:
        """The same as ``memory_per_gpu_bytes`` (the key every command's JSON uses)."""
        return self.memory_per_gpu_bytes


def memory_report(
    job: Job, layout: Layout, accelerator=None, mem_headroom: float = DEFAULT_MEM_HEADROOM
) -> MemoryReport:
    """Bytes per GPU on every pipeline rank for ``job`` under ``layout`` (the columns model
    with every rank examined; see :mod:`planner.cost.memory`)."""
    model = job.model
    check_layout(layout, model, job.seq_len, replicate_kv=job.ulysses_kv_heads == "replicate")
    m = layout.resolved_num_microbatches(job.global_batch_size)
    memory, held = memory_every_rank(job, accelerator, layout_columns(layout, m))
    pp = layout.pp
    stages = []
    for slot in range(pp):
        parts = {part: float(memory[f"rank_{part}_bytes"][0, slot]) for part in MEMORY_PARTS
                 if f"rank_{part}_bytes" in memory}  # fmt: skip
        parts["comm_buffers"] = float(memory["memory_comm_buffers_bytes"][0])
        parts["runtime_overhead"] = float(memory["memory_runtime_overhead_bytes"][0])
        dense, expert = held["dense_params"][0, slot], held["expert_params"][0, slot]
        stages.append(
            StageMemory(
                rank=int(memory["rank_slot"][0, slot]),
                num_layers=round(held["held_layers"][0, slot]),
                num_params=round(dense + expert),
                num_expert_params=round(expert),
                inflight_microbatches=float(memory["rank_units"][0, slot]),
                memory_per_gpu_bytes=math.fsum(parts[part] for part in MEMORY_PARTS),
                **{part: parts[part] for part in MEMORY_PARTS},
            )
        )
    peak = max(stages, key=lambda stage: stage.total_bytes)
    capacity = accelerator.hbm_bytes if accelerator is not None else None
    usable = None if capacity is None else usable_memory_bytes(capacity, mem_headroom)
    shape = _activation_shape(job, layout)
    tuned = job.finetune if job.finetune is not None and job.finetune.trains_adapters else None
    dense_tensors = act.layer_activation_tensors(model, shape, moe_layer=False)
    dense_tensors |= ft.adapter_activation_tensors(model, tuned, shape, False) if tuned else {}
    states = optimizer_states_per_param(job.precision.optimizer, model)
    dense_bpp = sharded_bytes_per_param(
        job.precision, layout.zero_stage, layout.zero_group_size, states
    )
    per_dense_layer = math.fsum(dense_tensors.values())
    copies = parameter_copies(layout.schedule)
    explain = _explain(model, layout, job, peak, dense_bpp, per_dense_layer, m, copies)
    recipe_parts = None
    if tuned:
        recipe_parts = _recipe_parts(job, layout, tuned, shape, peak, held, m)
        peak_states = ft.FinetuneStateBytes(**{k: recipe_parts[k] for k in ft.STATE_PARTS})
        explain[:3] = [
            ExplainTerm(**term)
            for term in ft.explain_terms(model, tuned, job.precision, peak_states)
        ]
    return MemoryReport(
        model=model.name,
        accelerator=accelerator.id if accelerator is not None else None,
        layout=layout,
        seq_len=job.seq_len,
        num_microbatches=m,
        memory_per_gpu_bytes=peak.total_bytes,
        capacity_bytes=capacity,
        mem_headroom=mem_headroom,
        usable_bytes=usable,
        fits=None if usable is None else peak.total_bytes <= usable,
        peak_rank=peak.rank,
        breakdown_bytes={part: getattr(peak, part) for part in MEMORY_PARTS},
        activation_tensors_per_layer=dense_tensors,
        per_stage=stages,
        explain=explain,
        recipe=job.finetune.recipe if job.finetune is not None else "full",
        recipe_breakdown_bytes=recipe_parts,
    )


def _activation_shape(job: Job, layout: Layout) -> act.ActivationShape:
    return act.ActivationShape(
        seq_len=job.seq_len,
        micro_batch_size=layout.micro_batch_size,
        tp=layout.tp,
        cp=layout.cp,
        sequence_parallel=layout.sequence_parallel and layout.tp > 1,
        flash_attention=job.flash_attention,
        recompute=layout.recompute,
        element_bytes=job.precision.activation_bytes,
        measures=job.active_memory_measures,
        ep=layout.ep,
        etp=layout.etp,
    )


def _recipe_parts(job, layout, tuned, shape, peak: StageMemory, held, m) -> dict[str, float]:
    """The peak rank's bytes split by a fine-tuning recipe's parts (adapters, frozen base,
    their optimizer states and working buffers; :func:`planner.cost.adapters.recipe_breakdown`)."""
    from planner.pipeline.closed_form import peak_activation_microbatches

    model, precision, rank = job.model, job.precision, peak.rank
    slot = rank  # every rank is a slot, in order
    dense, expert = held["dense_params"][0, slot], held["expert_params"][0, slot]
    moe = peak.num_layers - _dense_layers(job, layout, rank)
    shards = (
        zero_shard_factors(layout.zero_stage, layout.zero_group_size),
        zero_shard_factors(layout.zero_stage, layout.expert_zero_group_size),
    )
    states = ft.rank_state_bytes(
        model, tuned, precision, (dense, expert), (peak.num_layers - moe, moe),
        layout.tp, layout.ep, shards, etp=layout.etp,
    )  # fmt: skip
    inflight = peak_activation_microbatches(layout.schedule, layout.pp, m, layout.vpp)
    adapter_layer = ft.adapter_layer_bytes(model, tuned, shape)
    own = _own_layers(job, layout, rank)
    adapter_acts = (own[0] * adapter_layer[False] + own[1] * adapter_layer[True]) * inflight[rank]
    working = ft.adapter_working_max(model, tuned, shape)
    buffers = {k: v * bool(sum(own)) for k, v in working.items()}
    base_working = act.rebuilt_layer_bytes(model, shape) + act.backward_working_bytes(model, shape)
    buffers = ft.buffers_beside_logits(buffers, base_working, peak.logits_buffers)
    parts = {part: getattr(peak, part) for part in MEMORY_PARTS}
    return ft.recipe_breakdown(states, parts, adapter_acts, buffers)


def _own_layers(job: Job, layout: Layout, rank: int) -> tuple[float, float]:
    """(dense, MoE) layers of one direction's stages on ``rank``."""
    from planner.structure.stages import rank_structure

    ranks = rank_structure(job.model, layout.pp, layout.vpp, layout.schedule,
                           layout.pipeline_layer_split)  # fmt: skip
    return ranks.dense_layers[rank], ranks.moe_layers[rank]


def _dense_layers(job: Job, layout: Layout, rank: int) -> float:
    """Dense layers the rank holds (both of DualPipe's copies)."""
    dense, _ = _own_layers(job, layout, rank)
    if layout.schedule in BIDIRECTIONAL_SCHEDULES:
        dense += _own_layers(job, layout, layout.pp - 1 - rank)[0]
    return dense


def _explain(model, layout, job, peak, bpp, per_dense_layer, m, copies) -> list[ExplainTerm]:
    gib = 2**30
    rank = peak.rank
    params = peak.num_params
    terms = [
        ExplainTerm(
            term="weights",
            formula="params on rank × weight bytes / (dp·cp if ZeRO-3)",
            values=f"{params:,} × {bpp.weights:.4g} B (parameter copies: {copies})",
            bytes=peak.weights,
        ),
        ExplainTerm(
            term="gradients",
            formula="params on rank × grad bytes / (dp·cp if ZeRO ≥ 2)",
            values=f"{params:,} × {bpp.gradients:.4g} B ({job.precision.gradient_dtype})",
            bytes=peak.gradients,
        ),
        ExplainTerm(
            term="master_weights + optimizer_states",
            formula="params on rank × (master + states) bytes / (dp·cp if ZeRO ≥ 1)",
            values=f"{params:,} × {bpp.master_weights + bpp.optimizer_states:.4g} B "
            f"({job.precision.optimizer}, zero_stage {layout.zero_stage}, dp·cp {layout.zero_group_size})",
            bytes=peak.master_weights + peak.optimizer_states,
        ),
        ExplainTerm(
            term="activations",
            formula="layers on rank × bytes per layer × micro-batches in flight, those waiting only "
            "for W at M_W/M_B (+ embedding/head tensors)",
            values=f"{peak.num_layers} × {per_dense_layer / gib:.4g} GiB × {peak.inflight_microbatches:g} "
            f"(schedule {layout.schedule}, rank {rank}, m {m}, recompute {layout.recompute}, "
            f"memory measures {measures_label(job.active_memory_measures)})",
            bytes=peak.activations,
        ),
        ExplainTerm(
            term="logits_buffers",
            formula="s·b/cp × vocab × (e + 4 + e bytes: logits, FP32 softmax, logits gradient; "
            "fused cross-entropy: e + e) / tp on the last stage",
            values=f"{job.seq_len}·{layout.micro_batch_size}/{layout.cp} × {model.vocab_size} × "
            f"{act.logits_bytes_per_element(job.precision.activation_bytes, job.cross_entropy):g} "
            f"/ {layout.tp} ({job.cross_entropy} cross-entropy)",
            bytes=peak.logits_buffers,
        ),
        ExplainTerm(
            term="comm_buffers",
            formula="PP send/recv + SP all-gather + ZeRO-3 prefetch + one layer's gradients (ZeRO ≥ 2)",
            values="see planner.cost.memory.comm_buffer_columns",
            bytes=peak.comm_buffers,
        ),
        ExplainTerm(
            term="runtime_overhead",
            formula="the runtime's own HBM: CUDA context and workspaces on a GPU, none on "
            "a TPU (the job's figure where it sets one)",
            values=f"{peak.runtime_overhead / gib:.3g} GiB",
            bytes=peak.runtime_overhead,
        ),
    ]
    return terms
