"""Memory per GPU: model states per pipeline rank, activations in flight, buffers.

For each pipeline rank (stage) the model states are its parameters — its layers split by
TP (KV heads replicated beyond the KV head count), routed experts split by EP, the
embedding on the first stage and the LM head on the last — times bytes per parameter
after ZeRO sharding over the data-parallel group (:mod:`planner.spec.precision`). Activations
are one layer's stored tensors (:mod:`planner.cost.activations`) times the rank's layers times
the micro-batches its schedule keeps in flight (1F1B: p − i on rank i). Buffers that
exist once are added: logits and loss on the last stage, communication buffers, and the
runtime overhead (CUDA context and workspaces), reported apart. Memory per GPU is the
maximum over ranks. A fine-tuning recipe (``job.finetune``: LoRA, QLoRA, DoRA, VeRA) swaps
in its model states, adapter activations and working buffers from
:mod:`planner.cost.adapters`, and reports them apart in ``recipe_breakdown_bytes``.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, ConfigDict

from planner.cost import activations as act
from planner.cost import adapters as ft
from planner.cost.weight_pass import weight_pass_bytes_per_layer
from planner.pipeline.closed_form import (
    parameter_copies,
    peak_activation_microbatches,
    peak_activation_units,
)
from planner.pipeline.schedules.registry import BIDIRECTIONAL_SCHEDULES
from planner.spec.job import Job
from planner.spec.layout import (
    Layout,
    dense_and_moe_layers_per_virtual_stage,
    virtual_stage_ranks,
)
from planner.spec.model import ModelSpec
from planner.spec.precision import (
    DTYPE_BYTES,
    optimizer_states_per_param,
    sharded_bytes_per_param,
    zero_shard_factors,
)
from planner.spec.rules import check_layout
from planner.structure.params import (
    layer_params_per_rank,
    params_per_virtual_stage,
    rank_sums,
)

MEMORY_PARTS = (
    "weights",
    "gradients",
    "master_weights",
    "optimizer_states",
    "activations",
    "logits_buffers",
    "comm_buffers",
    "runtime_overhead",
)


#: Fraction of HBM kept free in every "fits" verdict (allocator fragmentation and caching
#: slack; PyTorch's caching allocator reserves more than it allocates). A documented default
#: a user sets with ``--mem-headroom``; the same in every command.
DEFAULT_MEM_HEADROOM = 0.05


def usable_memory_bytes(capacity_bytes: float, mem_headroom: float = DEFAULT_MEM_HEADROOM) -> float:
    """What a layout may use of ``capacity_bytes``: HBM × (1 − headroom); one definition of
    "fits" for ``plan``, ``estimate`` and ``memory``."""
    return capacity_bytes * (1 - mem_headroom)


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
    total_bytes: float


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
    total_bytes: float
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
    #: The peak rank's bytes split by a fine-tuning recipe's parts (sums to total_bytes).
    recipe_breakdown_bytes: dict[str, float] | None = None


def dualpipe_activations(stage_bytes: np.ndarray) -> np.ndarray:
    """Activations per DualPipe rank from one micro-batch's bytes of each stage (direction 1).

    Each direction fills like 1F1B: rank r holds ``pp − r`` micro-batches of its own stage
    r and ``r + 1`` of the mirrored stage ``pp − 1 − r``, the README's PP + 1 chunks in all
    (deepseek-ai/DualPipe; DeepSeek-V3 §3.2.1). So the first and last ranks hold many
    chunks of the embedding's stage and one of the head's (with any MTP module).
    """
    pp = len(stage_bytes)
    rank = np.arange(pp)
    return stage_bytes * (pp - rank) + stage_bytes[::-1] * (rank + 1)


# ----- the report -----------------------------------------------------------------------


def memory_report(
    job: Job, layout: Layout, accelerator=None, mem_headroom: float = DEFAULT_MEM_HEADROOM
) -> MemoryReport:
    """Bytes per GPU on every pipeline rank for ``job`` under ``layout``; see module docstring."""
    model = job.model
    check_layout(layout, model, job.seq_len)
    m = layout.resolved_num_microbatches(job.global_batch_size)
    precision = job.precision
    states = optimizer_states_per_param(precision.optimizer, model)
    dense_bpp = sharded_bytes_per_param(
        precision, layout.zero_stage, layout.zero_group_size, states
    )
    expert_group = layout.expert_zero_group_size
    expert_bpp = sharded_bytes_per_param(precision, layout.zero_stage, expert_group, states)

    dense_stage, expert_stage = params_per_virtual_stage(model, layout)
    dense = rank_sums(dense_stage, layout)
    expert = rank_sums(expert_stage, layout)
    dense_stage_layers, moe_stage_layers = dense_and_moe_layers_per_virtual_stage(
        model, layout.pp, layout.vpp, layout.pipeline_layer_split
    )
    layers = rank_sums((dense_stage_layers + moe_stage_layers).astype(float), layout)
    moe_layers = rank_sums(moe_stage_layers.astype(float), layout)
    # Activations are counted in micro-batches of one direction's share of layers (the
    # schedule's units); DualPipe's mirrored stage shows up in its in-flight count.
    ranks_of_stage = virtual_stage_ranks(layout.schedule, layout.pp, layout.vpp)
    act_moe_layers = np.bincount(ranks_of_stage, weights=moe_stage_layers, minlength=layout.pp)
    act_layers = act_moe_layers + np.bincount(
        ranks_of_stage, weights=dense_stage_layers, minlength=layout.pp
    )

    shape = act.ActivationShape(
        seq_len=job.seq_len,
        micro_batch_size=layout.micro_batch_size,
        tp=layout.tp,
        cp=layout.cp,
        sequence_parallel=layout.sequence_parallel and layout.tp > 1,
        flash_attention=job.flash_attention,
        recompute=layout.recompute,
        element_bytes=precision.activation_bytes,
        measures=job.active_memory_measures,
        ep=layout.ep,
        etp=layout.etp,
    )
    tuned = job.finetune if job.finetune is not None and job.finetune.trains_adapters else None
    dense_tensors = act.layer_activation_tensors(model, shape, moe_layer=False)
    adapter_layer = ft.adapter_layer_bytes(model, tuned, shape)
    dense_tensors |= ft.adapter_activation_tensors(model, tuned, shape, False) if tuned else {}
    per_dense_layer = math.fsum(dense_tensors.values())
    per_moe_layer = (
        act.activation_bytes_per_layer(model, shape, moe_layer=True) + adapter_layer[True]
        if model.is_moe
        else 0.0
    )
    inflight = np.asarray(
        peak_activation_microbatches(layout.schedule, layout.pp, m, layout.vpp), dtype=float
    )
    first_rank, last_rank = int(ranks_of_stage[0]), int(ranks_of_stage[-1])
    first_extra = math.fsum(act.first_stage_tensors(model, shape).values())
    last_extra = math.fsum(act.last_stage_tensors(model, shape).values())
    working = max(
        act.recompute_working_bytes(model, shape, moe_layer=False),
        act.recompute_working_bytes(model, shape, moe_layer=True) if model.is_moe else 0.0,
    )
    adapter_working = ft.adapter_working_max(model, tuned, shape)
    working += math.fsum(adapter_working.values())

    per_layer = (act_layers - act_moe_layers) * per_dense_layer + act_moe_layers * per_moe_layer
    logits_bytes = act.logits_buffer_bytes(model, shape)
    holds_head = np.zeros(layout.pp)
    holds_head[last_rank] = 1.0
    if layout.schedule in BIDIRECTIONAL_SCHEDULES:
        holds_head[first_rank] = 1.0
    working = working + act.backward_working_beside_logits(
        act.backward_working_bytes(model, shape), logits_bytes, holds_head
    )
    # Zero-bubble schedules: a micro-batch waiting only for W still holds M_W per layer.
    per_layer_w = (act_layers - act_moe_layers) * weight_pass_bytes_per_layer(
        model, shape, False, job.weight_pass_memory
    ) + act_moe_layers * (
        weight_pass_bytes_per_layer(model, shape, True, job.weight_pass_memory)
        if model.is_moe
        else 0.0
    )
    weight_ratio = np.divide(per_layer_w, per_layer, out=np.zeros(layout.pp), where=per_layer > 0)
    units = peak_activation_units(
        layout.schedule, layout.pp, m, layout.vpp, np.arange(layout.pp), weight_ratio
    )
    activations = per_layer * units + working * (act_layers > 0)
    adapter_acts = (act_layers - act_moe_layers) * adapter_layer[False] * inflight
    adapter_acts += act_moe_layers * adapter_layer[True] * inflight
    activations[first_rank] += first_extra * inflight[first_rank]
    activations[last_rank] += last_extra * inflight[last_rank]
    if layout.schedule in BIDIRECTIONAL_SCHEDULES:
        stage_bytes = per_layer.copy()
        stage_bytes[first_rank] += first_extra
        stage_bytes[last_rank] += last_extra
        activations = dualpipe_activations(stage_bytes) + working * (act_layers > 0)
    logits = holds_head * logits_bytes

    comm = _comm_buffer_bytes(model, layout, shape, precision, tuned)
    copies = parameter_copies(layout.schedule)
    shards = (
        zero_shard_factors(layout.zero_stage, layout.zero_group_size),
        zero_shard_factors(layout.zero_stage, expert_group),
    )
    stages, recipe_parts = [], []
    for rank in range(layout.pp):
        parts = {
            "weights": dense[rank] * dense_bpp.weights + expert[rank] * expert_bpp.weights,
            "gradients": dense[rank] * dense_bpp.gradients + expert[rank] * expert_bpp.gradients,
            "master_weights": dense[rank] * dense_bpp.master_weights
            + expert[rank] * expert_bpp.master_weights,
            "optimizer_states": dense[rank] * dense_bpp.optimizer_states
            + expert[rank] * expert_bpp.optimizer_states,
            "activations": float(activations[rank]),
            "logits_buffers": float(logits[rank]),
            "comm_buffers": comm,
            "runtime_overhead": float(job.runtime_overhead_bytes),
        }
        if tuned:
            states = ft.rank_state_bytes(
                model,
                tuned,
                precision,
                (dense[rank], expert[rank]),
                (layers[rank] - moe_layers[rank], moe_layers[rank]),
                layout.tp,
                layout.ep,
                shards,
                etp=layout.etp,
            )
            parts |= states.memory_parts()
            buffers = {k: v * bool(act_layers[rank]) for k, v in adapter_working.items()}
            recipe_parts.append(ft.recipe_breakdown(states, parts, adapter_acts[rank], buffers))
        stages.append(
            StageMemory(
                rank=rank,
                num_layers=round(layers[rank]),
                num_params=round(dense[rank] + expert[rank]),
                num_expert_params=round(expert[rank]),
                inflight_microbatches=float(units[rank]),
                total_bytes=math.fsum(parts.values()),
                **{k: float(v) for k, v in parts.items()},
            )
        )
    peak = max(stages, key=lambda stage: stage.total_bytes)
    capacity = accelerator.hbm_bytes if accelerator is not None else None
    usable = None if capacity is None else usable_memory_bytes(capacity, mem_headroom)
    explain = _explain(model, layout, job, peak, dense_bpp, per_dense_layer, m, copies)
    if tuned:
        peak_states = ft.FinetuneStateBytes(
            **{k: recipe_parts[peak.rank][k] for k in ft.STATE_PARTS}
        )
        explain[:3] = [
            ExplainTerm(**term) for term in ft.explain_terms(model, tuned, precision, peak_states)
        ]
    return MemoryReport(
        model=model.name,
        accelerator=accelerator.id if accelerator is not None else None,
        layout=layout,
        seq_len=job.seq_len,
        num_microbatches=m,
        total_bytes=peak.total_bytes,
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
        recipe_breakdown_bytes=recipe_parts[peak.rank] if tuned else None,
    )


def _comm_buffer_bytes(model: ModelSpec, layout: Layout, shape, precision, tuned=None) -> float:
    """Buffers that communication needs at its peak on one GPU.

    Pipeline send/receive of one micro-batch's activations in both directions; the
    all-gathered sequence under SP (one layer input, whole); under ZeRO-3 two layers'
    gathered weights (the current one and the prefetched next one); with sharded gradients
    (ZeRO ≥ 2) one layer's unsharded gradients, the input of its reduce-scatter (FSDP
    reduces per layer; with whole gradients, ZeRO 0–1 reduce in place). Under a fine-tuning
    recipe a layer's weights are as stored (NF4 for QLoRA) and its gradients the adapters'.
    """
    h, e = model.hidden_size, shape.element_bytes
    total = 0.0
    if layout.pp > 1:
        total += 2 * shape.local_tokens * h * e * shape.replicated_share
    if shape.sequence_parallel:
        total += shape.local_tokens * h * e
    dense_layer, expert_layer = layer_params_per_rank(
        model, layout.tp, layout.ep, model.is_moe, layout.etp
    )
    layer_weights = (dense_layer + expert_layer) * DTYPE_BYTES[precision.weight_dtype]
    layer_grads = (dense_layer + expert_layer) * DTYPE_BYTES[precision.gradient_dtype]
    if tuned is not None:
        layer_weights, layer_grads = ft.layer_weight_and_grad_bytes(
            model, tuned, precision, model.is_moe, layout.tp, layout.ep, layout.etp
        )
    if layout.zero_stage >= 3:
        total += 2 * layer_weights
    if layout.zero_stage >= 2:
        total += layer_grads
    return total


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
            f"(schedule {layout.schedule}, rank {rank}, m {m}, recompute {layout.recompute})",
            bytes=peak.activations,
        ),
        ExplainTerm(
            term="logits_buffers",
            formula="s·b/cp × vocab × (e + 4 + e bytes: logits, FP32 softmax, logits gradient) / tp on the last stage",
            values=f"{job.seq_len}·{layout.micro_batch_size}/{layout.cp} × {model.vocab_size} × "
            f"{2 * job.precision.activation_bytes + 4:g} / {layout.tp}",
            bytes=peak.logits_buffers,
        ),
        ExplainTerm(
            term="comm_buffers",
            formula="PP send/recv + SP all-gather + ZeRO-3 prefetch + one layer's gradients (ZeRO ≥ 2)",
            values="see planner.cost.memory._comm_buffer_bytes",
            bytes=peak.comm_buffers,
        ),
        ExplainTerm(
            term="runtime_overhead",
            formula="CUDA context and library workspaces (documented default)",
            values=f"{job.runtime_overhead_bytes / gib:.3g} GiB",
            bytes=peak.runtime_overhead,
        ),
    ]
    return terms
