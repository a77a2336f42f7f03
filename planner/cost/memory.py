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

import numpy as np

from hwspecs.schema import Accelerator
from planner.cost import activations as act
from planner.cost import adapters as ft
from planner.cost.model_states import FIRST_SHARDED_STAGE
from planner.pipeline import closed_form
from planner.pipeline.schedules.registry import BIDIRECTIONAL_SCHEDULES
from planner.spec.job import Job
from planner.spec.precision import (
    DTYPE_BYTES,
    optimizer_states_per_param,
    unsharded_bytes_per_param,
)
from planner.structure.params import layer_params_per_rank

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


#: HBM a GPU's runtime holds outside the program's buffers: the CUDA context and the
#: cuBLAS/NCCL workspaces. A documented default (PyTorch reports neither in its allocator's
#: figures); an accelerator's catalog entry or a job may set its own.
DEFAULT_RUNTIME_OVERHEAD_BYTES = 1 << 30


def runtime_overhead_bytes(job: Job, accelerator: Accelerator | None) -> float:
    """HBM the runtime holds outside the program's buffers: the job's own figure, else the
    accelerator's (none on TPUs, whose catalog capacity is what XLA leaves the program),
    else :data:`DEFAULT_RUNTIME_OVERHEAD_BYTES`."""
    for figure in (
        job.runtime_overhead_bytes,
        getattr(accelerator, "runtime_overhead_bytes", None),
    ):
        if figure is not None:
            return float(figure)
    return float(DEFAULT_RUNTIME_OVERHEAD_BYTES)


def usable_memory_bytes(capacity_bytes: float, mem_headroom: float = DEFAULT_MEM_HEADROOM) -> float:
    """What a layout may use of ``capacity_bytes``: HBM × (1 − headroom); one definition of
    "fits" for ``plan``, ``estimate`` and ``memory``."""
    return capacity_bytes * (1 - mem_headroom)


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


# ----- the memory model over columns of layouts --------------------------------------------


def _held(R: dict, key: str, factor) -> np.ndarray | float:
    """``R[key] · factor``: 0 where no row holds MoE layers or routed experts (left out)."""
    return R[key] * factor if key in R else 0.0


def model_state_columns(
    job: Job, zero, zero_group, expert_group, R: dict, tuned
) -> dict[str, np.ndarray]:
    """Model states per examined rank (weights, gradients, master weights, optimizer
    states), ZeRO-sharded over the dp·cp group (routed experts over ``expert_group``, the
    expert-data-parallel group: :func:`planner.spec.layout.expert_data_parallel_size`)."""
    model, precision = job.model, job.precision
    states_per_param = optimizer_states_per_param(precision.optimizer, model)
    whole = unsharded_bytes_per_param(precision, states_per_param)

    def shard(part_bytes: float, first_stage: int, group: np.ndarray) -> np.ndarray:
        return part_bytes / np.where(zero >= first_stage, group, 1)

    parts = {}
    for name, first_stage in FIRST_SHARDED_STAGE.items():
        if tuned:  # the recipe's states: unsharded + dense / divisor + expert / divisor
            parts[name] = (
                R[f"{name}_fixed"]
                + R[f"{name}_dense"] * shard(1.0, first_stage, zero_group)[:, None]
                + R[f"{name}_expert"] * shard(1.0, first_stage, expert_group)[:, None]
            )
            continue
        per_param = getattr(whole, name)
        parts[name] = R["dense_params"] * shard(per_param, first_stage, zero_group)[
            :, None
        ] + _held(R, "expert_params", shard(per_param, first_stage, expert_group)[:, None])
    return parts


def checkpoint_bytes_columns(
    job: Job, zero_group, expert_group, R: dict, tuned, copies
) -> np.ndarray:
    """Bytes the busiest-writing rank saves per checkpoint, per row: its weights, master
    weights and optimizer states with every replica split over its data-parallel group (as
    ZeRO-3 shards them: a distributed checkpoint writes each replicated tensor once, spread
    over the replicas; gradients are not saved). ``copies``: parameter copies per rank
    (DualPipe's two, each stage on two ranks, are replicas too)."""
    zero3 = np.full(len(zero_group), 3)
    parts = model_state_columns(job, zero3, zero_group, expert_group, R, tuned)
    saved = parts["weights"] + parts["master_weights"] + parts["optimizer_states"]
    return saved.max(axis=1) / copies


def activation_columns(job: Job, c, S: dict, R: dict, schedule_groups) -> dict[str, np.ndarray]:
    """Activations of the micro-batches in flight, the logits buffers and the in-flight units
    per examined rank (``c``: the rows' layout columns, of which pp, num_microbatches and vpp
    are read, :class:`planner.columns.layout.LayoutColumns`; ``S``: their shape-table entries, ``R``
    their structure-table entries; ``schedule_groups``: (schedule, rows) pairs)."""
    n = len(c.pp)
    layer_bytes = R["dense_layers"] * S["act_dense"][:, None] + _held(
        R, "moe_layers", S["act_moe"][:, None]
    )
    weight_bytes = R["dense_layers"] * S["wpass_dense"][:, None] + _held(
        R, "moe_layers", S["wpass_moe"][:, None]
    )
    weight_ratio = np.divide(
        weight_bytes, layer_bytes, out=np.zeros_like(layer_bytes), where=layer_bytes > 0
    )
    num_slots = R["slot"].shape[1]
    inflight = np.zeros((n, num_slots))  # micro-batches between F and B (the ends' tensors)
    units = np.zeros((n, num_slots))  # … and those waiting for W, at M_W / M_B
    for sch, rows in schedule_groups:
        # pp, micro-batches and vpp against the slots' ranks
        per_row = [c.pp[rows, None], c.num_microbatches[rows, None], c.vpp[rows, None]]
        slots = R["slot"][rows].astype(np.int64)
        inflight[rows] = closed_form.activation_microbatches_at(sch, *per_row, slots)
        units[rows] = closed_form.peak_activation_units(sch, *per_row, slots, weight_ratio[rows])
    act_layers = R["dense_layers"] + _held(R, "moe_layers", 1.0)
    activations = layer_bytes * units
    working = act.layer_working_beside_logits(
        S["working"][:, None] + S["backward"][:, None], S["logits"][:, None], R["head"]
    )
    activations = activations + working * (act_layers > 0)
    activations = activations + inflight * (
        R["emb"] * S["first_extra"][:, None] + R["head"] * S["last_extra"][:, None]
    )
    mirrored = [rows for sch, rows in schedule_groups if sch in BIDIRECTIONAL_SCHEDULES]
    dualpipe = np.concatenate(mirrored) if mirrored else np.zeros(0, dtype=np.int64)
    if len(dualpipe):  # rank r: pp − r own chunks, r + 1 mirrored
        d = dualpipe
        slot, p = R["slot"][d], c.pp[d, None]
        Sd = {key: S[key][d, None] for key in ("act_dense", "act_moe", "first_extra",
                                               "last_extra")}  # fmt: skip

        def stage_bytes(dense, moe, has_embedding, has_head):
            return (
                dense * Sd["act_dense"] + moe * Sd["act_moe"]
                + has_embedding * Sd["first_extra"] + has_head * Sd["last_extra"]
            )  # fmt: skip

        def on_dualpipe(key):
            return R[key][d] if key in R else 0.0

        own = stage_bytes(R["dense_layers"][d], on_dualpipe("moe_layers"), slot == 0, slot == p - 1)
        mirror = stage_bytes(R["mirror_dense_layers"][d], on_dualpipe("mirror_moe_layers"),
                             slot == p - 1, slot == 0)  # fmt: skip
        activations[d] = own * (p - slot) + mirror * (slot + 1) + working[d] * (act_layers[d] > 0)
    logits = R["head"] * S["logits"][:, None]
    return {"activations": activations, "logits_buffers": logits, "units": units}


def comm_buffer_columns(model, job, tp, cp, pp, ep, etp, zero, sp, mbs, tuned=None) -> np.ndarray:
    """Buffers that communication needs at its peak on one GPU, per row: pipeline send/receive
    of one micro-batch's activations both ways; the all-gathered sequence under SP; under
    ZeRO-3 two layers' gathered weights (the current and the prefetched next); with sharded
    gradients (ZeRO ≥ 2) one layer's unsharded gradients, the input of its reduce-scatter.
    Under a fine-tuning recipe a layer's weights are as stored (NF4 for QLoRA) and its
    gradients the adapters'."""

    e, h = job.precision.activation_bytes, model.hidden_size
    tokens = job.seq_len * mbs / cp
    replicated = np.where(sp, 1.0 / tp, 1.0)
    total = np.where(pp > 1, 2 * tokens * h * e * replicated, 0.0)
    total = total + np.where(sp, tokens * h * e, 0.0)
    keys, inverse = _distinct_degrees(tp, ep, etp)
    if tuned is None:
        layer = np.array(
            [sum(layer_params_per_rank(model, t, x, model.is_moe, et)) for t, x, et in keys]
        )
        weights = layer * DTYPE_BYTES[job.precision.weight_dtype]
        grads = layer * DTYPE_BYTES[job.precision.gradient_dtype]
    else:  # weights as stored (NF4 for QLoRA), gradients the adapters'
        weights, grads = np.array(
            [
                ft.layer_weight_and_grad_bytes(
                    model, tuned, job.precision, model.is_moe, t, x, None if et == t else et
                )
                for t, x, et in keys
            ]
        ).T
    total = total + np.where(zero >= 3, 2 * weights[inverse], 0.0)
    return total + np.where(zero >= 2, grads[inverse], 0.0)


def _distinct_degrees(*degrees) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The distinct tuples of the degree columns (non-negative integers), ascending, and
    each row's index among them: one integer per row in mixed radix (its order is the
    tuples'), so a 1-D unique rather than a sort of rows."""
    columns = [np.asarray(d, dtype=np.int64).reshape(-1) for d in degrees]
    radix = [int(column.max(initial=0)) + 1 for column in columns]
    key = np.zeros(len(columns[0]), dtype=np.int64)
    for column, base in zip(columns, radix, strict=True):
        key = key * base + column
    unique, inverse = np.unique(key, return_inverse=True)
    return list(zip(*(d.tolist() for d in np.unravel_index(unique, radix)), strict=True)), inverse
