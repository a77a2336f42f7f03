"""The scalar memory model, one layout at a time, kept as a reference for the consistency
property: every pipeline rank's parts computed directly from the formulas in
:mod:`planner.cost` (no columns, no examined-rank choice). The planner's own report
(:func:`planner.memory_report.memory_report`) is a view of the columns model; the tests hold
the two equal."""

from __future__ import annotations

import math

import numpy as np

from planner.cost import activations as act
from planner.cost import adapters as ft
from planner.cost.memory import dualpipe_activations
from planner.cost.weight_pass import weight_pass_bytes_per_layer
from planner.pipeline.closed_form import peak_activation_microbatches, peak_activation_units
from planner.pipeline.schedules.registry import BIDIRECTIONAL_SCHEDULES
from planner.spec.layout import Layout, dense_and_moe_layers_per_virtual_stage, virtual_stage_ranks
from planner.spec.model import ModelSpec
from planner.spec.precision import (
    DTYPE_BYTES,
    optimizer_states_per_param,
    sharded_bytes_per_param,
    zero_shard_factors,
)
from planner.spec.rules import check_layout
from planner.structure.params import layer_params_per_rank, params_per_virtual_stage, rank_sums


def reference_ranks(job, layout, accelerator) -> list[dict]:
    """Every pipeline rank's bytes by part, layers, parameters and in-flight units on
    ``accelerator`` (its runtime overhead unless the job sets one)."""
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
        model, layout.pp, layout.vpp, layout.pipeline_layer_split, layout.schedule
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
    base_working = working + act.backward_working_bytes(model, shape)
    adapter_working = ft.adapter_working_max(model, tuned, shape)
    working += math.fsum(adapter_working.values())

    per_layer = (act_layers - act_moe_layers) * per_dense_layer + act_moe_layers * per_moe_layer
    logits_bytes = act.logits_buffer_bytes(model, shape, job.cross_entropy)
    holds_head = np.zeros(layout.pp)
    holds_head[last_rank] = 1.0
    if layout.schedule in BIDIRECTIONAL_SCHEDULES:
        holds_head[first_rank] = 1.0
    working = act.layer_working_beside_logits(
        working + act.backward_working_bytes(model, shape), logits_bytes, holds_head
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
    shards = (
        zero_shard_factors(layout.zero_stage, layout.zero_group_size),
        zero_shard_factors(layout.zero_stage, expert_group),
    )
    # The job's figure, else the accelerator's, else a GPU's CUDA context and workspaces.
    figures = (job.runtime_overhead_bytes, accelerator.runtime_overhead_bytes, 1 << 30)
    runtime = float(next(b for b in figures if b is not None))
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
            "runtime_overhead": runtime,
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
            buffers = ft.buffers_beside_logits(buffers, base_working, float(logits[rank]))
            recipe_parts.append(ft.recipe_breakdown(states, parts, adapter_acts[rank], buffers))
        stages.append(
            {
                "rank": rank,
                "num_layers": round(layers[rank]),
                "num_params": round(dense[rank] + expert[rank]),
                "num_expert_params": round(expert[rank]),
                "inflight_microbatches": float(units[rank]),
                "total_bytes": math.fsum(parts.values()),
                **{k: float(v) for k, v in parts.items()},
                "recipe": recipe_parts[-1] if tuned else None,
            }
        )
    return stages


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
    return total + _cp_buffer_bytes(model, layout, shape)


def _cp_buffer_bytes(model: ModelSpec, layout: Layout, shape) -> float:
    """K/V buffers of the CP algorithm at one layer's backward: all-gather holds the whole
    sequence's K, V and their gradients; ring two K/V blocks and their dK, dV; Ulysses the
    head-sharded copies of Q, K, V and the output; hierarchical both of the last two."""
    if layout.cp == 1:
        return 0.0
    e, tokens, heads = (
        shape.element_bytes,
        shape.local_tokens,
        model.num_attention_heads / layout.tp,
    )
    if model.attention_kind == "mla":
        kv = heads * (model.head_dim + model.value_head_dim)
    else:
        kv = 2 * max(1, model.num_kv_heads // layout.tp) * model.head_dim
    ulysses = tokens * (heads * model.head_dim + kv + heads * model.value_head_dim) * e
    ring = 4 * tokens * kv * e
    return {
        "all-gather": 2 * tokens * layout.cp * kv * e,
        "ring": ring,
        "ulysses": ulysses,
        "hierarchical": ulysses + ring,
    }[layout.cp_algorithm]
