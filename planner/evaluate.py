"""Step time, throughput and memory for many layouts at once (numpy columns, one row each).

This is the one model the search screens with and the single-layout estimate reports.
Pieces that depend only on a few layout fields are computed once per distinct value
(per-layer times per (tp, cp, ep, SP, micro-batch) shape; what each pipeline rank holds
per (pp, vpp, schedule); in-flight micro-batches per (schedule, pp, m, vpp); collective
cost tables per degree combination) and broadcast to the rows; everything else is numpy
arithmetic over the rows. No Python loop runs per row.

Per row: the busiest pipeline rank's F, B (+ recomputation) and W per micro-batch feed the
schedule's closed-form step time (:mod:`planner.schedules.closed_form`); the exposed
communication per axis (:mod:`planner.traffic_columns`) and the optimizer step are added
after it. Ranks are examined at a few slots — the first two, the last two and the first
rank with the most layers — which hold the compute and memory peaks of every schedule
here (in-flight counts fall along the pipeline or are flat; the ends hold the embedding
and the head); a test checks the slots against every rank.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hwspecs.schema import Accelerator, Cluster
from planner import activations as act
from planner import finetune_costs as ft
from planner.compute import GpuRates
from planner.evaluate_states import FIRST_SHARDED_STAGE, optimizer_columns, slot_states
from planner.flops import model_flops_per_token, recompute_flops_per_token, sum_ops
from planner.job import Job
from planner.layout import Layout
from planner.memory import params_per_virtual_stage, rank_sums
from planner.precision import DTYPE_BYTES, optimizer_states_per_param, unsharded_bytes_per_param
from planner.schedules import closed_form
from planner.stage_times import rank_structure, shape_times
from planner.traffic_columns import AXES, axis_times_vectorized

NUM_SLOTS = 5
RECOMPUTE_CODES = ("none", "selective", "full")


def _unique_rows(*columns: np.ndarray) -> tuple[list[tuple], np.ndarray]:
    """Distinct value tuples of the given columns and each row's index into them.

    Each column is factorized to integer codes first, so strings cost no more than ints.
    """
    codes, values = [], []
    for column in columns:
        code, uniques = pd.factorize(np.asarray(column).reshape(-1))  # hashing: O(rows)
        codes.append(code)
        values.append(np.asarray(uniques))
    key = np.ravel_multi_index(tuple(codes), tuple(len(v) for v in values))
    unique_keys, inverse = np.unique(key, return_inverse=True)
    parts = np.unravel_index(unique_keys, tuple(len(v) for v in values))
    rows = list(zip(*(v[i].tolist() for v, i in zip(values, parts, strict=True)), strict=True))
    return rows, inverse.reshape(-1)


def _rows_by_value(column: np.ndarray) -> list[tuple[object, np.ndarray]]:
    """(value, indices of the rows holding it) for each distinct value of ``column``."""
    codes, uniques = pd.factorize(np.asarray(column).reshape(-1))
    order = np.argsort(codes, kind="stable")
    bounds = np.cumsum(np.bincount(codes, minlength=len(uniques)))[:-1]
    return list(zip(uniques.tolist(), np.split(order, bounds), strict=True))


def _with_mirror(per_rank: list[float], mirrored: int) -> np.ndarray:
    """Per-rank values plus, for DualPipe, those of the rank's mirrored stage (pp − 1 − r)."""
    values = np.asarray(per_rank, dtype=float)
    return values + mirrored * values[::-1]


def _slots(pp: int, layers: np.ndarray) -> np.ndarray:
    """The ranks examined for peaks: 0, 1, the first with the most layers, pp−2, pp−1."""
    candidates = [0, 1, int(np.argmax(layers)), pp - 2, pp - 1]
    ranks = sorted({r for r in candidates if 0 <= r < pp})
    return np.array((ranks + [ranks[-1]] * NUM_SLOTS)[:NUM_SLOTS])


def evaluate_columns(
    job: Job,
    cluster: Cluster,
    accelerator: Accelerator,
    columns: dict,
    order=None,
    mfu_dtype: str = "bf16",
) -> dict[str, np.ndarray]:
    """Evaluate rows of layouts. ``columns``: tp, cp, pp, dp, ep, vpp, micro_batch_size,
    num_microbatches, zero_stage (ints), sequence_parallel (bool), recompute, schedule,
    pipeline_layer_split (str). Returns one array per quantity (see :data:`OUTPUTS`)."""
    model, precision = job.model, job.precision
    n = len(columns["tp"])
    col = {k: np.asarray(v) for k, v in columns.items()}
    tp, cp, pp, dp, ep, vpp = (
        col[k].astype(np.int64) for k in ("tp", "cp", "pp", "dp", "ep", "vpp")
    )
    mbs, m, zero = (
        col[k].astype(np.int64) for k in ("micro_batch_size", "num_microbatches", "zero_stage")
    )
    sp = col["sequence_parallel"].astype(bool) & (tp > 1)
    schedule, recompute, split = col["schedule"], col["recompute"], col["pipeline_layer_split"]
    rates = GpuRates.of(accelerator, precision.gemm_dtype)
    e = precision.activation_bytes

    # Shapes: per-layer times and per-layer activation bytes.
    shapes, shape_inv = _unique_rows(tp, cp, ep, sp, mbs, recompute)
    shape_keys = [
        *("act_dense", "act_moe", "first_extra", "last_extra", "working", "logits"),
        *("fd", "bd", "wd", "rd", "ad", "fm", "bm", "wm", "rm", "am"),
        *("f_emb", "b_emb", "w_emb", "f_head", "b_head", "w_head"),
    ]
    shape_cols = {key: np.zeros(len(shapes)) for key in shape_keys}
    tuned = job.finetune if job.finetune is not None and job.finetune.trains_adapters else None
    timed = {}  # op times do not depend on the recompute policy: once per shape
    for u, (t, c, x, s, b, r) in enumerate(shapes):
        if (t, c, x, s, b) not in timed:
            timed[t, c, x, s, b] = shape_times(
                model, job.seq_len, b, t, c, x, s, job.flash_attention, rates, e, tuned
            )
        times = timed[t, c, x, s, b]
        shape = act.ActivationShape(
            seq_len=job.seq_len,
            micro_batch_size=b,
            tp=t,
            cp=c,
            sequence_parallel=s,
            flash_attention=job.flash_attention,
            recompute=r,
            element_bytes=e,
        )
        moe_t = times.moe or times.dense
        adapters = ft.adapter_layer_bytes(model, tuned, shape)
        act_moe = act.activation_bytes_per_layer(model, shape, True) if model.is_moe else 0.0
        values = {
            "act_dense": act.activation_bytes_per_layer(model, shape, False) + adapters[False],
            "act_moe": act_moe + adapters[True] if model.is_moe else 0.0,
            "first_extra": sum(act.first_stage_tensors(model, shape).values()),
            "last_extra": sum(act.last_stage_tensors(model, shape).values()),
            "working": max(
                act.recompute_working_bytes(model, shape, False),
                act.recompute_working_bytes(model, shape, True) if model.is_moe else 0.0,
            )
            + sum(ft.adapter_working_max(model, tuned, shape).values()),
            "logits": act.logits_buffer_bytes(model, shape),
            "fd": times.dense.forward_s,
            "bd": times.dense.input_grad_s,
            "wd": times.dense.weight_grad_s,
            "rd": times.dense.recompute_s(r),
            "ad": times.dense.attention_forward_s + times.dense.attention_backward_s,
            "fm": moe_t.forward_s,
            "bm": moe_t.input_grad_s,
            "wm": moe_t.weight_grad_s,
            "rm": moe_t.recompute_s(r),
            "am": moe_t.attention_forward_s + moe_t.attention_backward_s,
            "f_emb": times.embedding.forward_s,
            "b_emb": times.embedding.input_grad_s,
            "w_emb": 0.0,
            "f_head": sum(op.forward_s for op in times.head),
            "b_head": sum(op.input_grad_s for op in times.head),
            "w_head": sum(op.weight_grad_s for op in times.head),
        }
        for key, value in values.items():
            shape_cols[key][u] = value
    S = {key: value[shape_inv] for key, value in shape_cols.items()}

    # Structure: what each examined rank holds (layers, parameters, embedding, head).
    structs, struct_inv = _unique_rows(tp, ep, pp, vpp, schedule, split)
    fields = ("dense_layers", "moe_layers", "emb", "head", "dense_params", "expert_params", "slot")
    table = {key: np.zeros((len(structs), NUM_SLOTS)) for key in fields}
    for u, (t, x, p, v, sch, spl) in enumerate(structs):
        structure = rank_structure(model, p, v, sch, spl)
        layout = Layout(tp=t, ep=x, pp=p, vpp=v, dp=x, schedule=sch, pipeline_layer_split=spl)
        dense_stage, expert_stage = params_per_virtual_stage(model, layout)
        layers = np.asarray(structure.dense_layers) + np.asarray(structure.moe_layers)
        slots = _slots(p, layers)
        table["slot"][u] = slots
        table["dense_layers"][u] = np.asarray(structure.dense_layers)[slots]
        table["moe_layers"][u] = np.asarray(structure.moe_layers)[slots]
        table["emb"][u] = np.asarray(structure.has_embedding, dtype=float)[slots]
        table["head"][u] = np.asarray(structure.has_head, dtype=float)[slots]
        table["dense_params"][u] = rank_sums(dense_stage, layout)[slots]
        table["expert_params"][u] = rank_sums(expert_stage, layout)[slots]
        # Model states cover both of DualPipe's directions: add the mirrored stage's layers.
        mirrored = 1 if sch == "dualpipe" else 0
        states = slot_states(
            job, t, x, table["dense_params"][u], table["expert_params"][u],
            _with_mirror(structure.dense_layers, mirrored)[slots],
            _with_mirror(structure.moe_layers, mirrored)[slots],
        )  # fmt: skip
        for key, value in states.items():
            table.setdefault(key, np.zeros((len(structs), NUM_SLOTS)))[u] = value
    R = {key: value[struct_inv] for key, value in table.items()}
    if "dualpipe" in set(schedule.tolist()):  # the mirrored direction's embedding and head
        mirrored = schedule[:, None] == "dualpipe"
        last = R["slot"] == (pp[:, None] - 1)
        R["emb"] = np.where(mirrored & last, 1.0, R["emb"])
        R["head"] = np.where(mirrored & (R["slot"] == 0), 1.0, R["head"])

    # Compute per examined rank; the busiest one sets the pipeline's pace.
    def on_slots(dense_key, moe_key, emb_key=None, head_key=None):
        total = R["dense_layers"] * S[dense_key][:, None] + R["moe_layers"] * S[moe_key][:, None]
        if emb_key:
            total = total + R["emb"] * S[emb_key][:, None] + R["head"] * S[head_key][:, None]
        return total

    F = on_slots("fd", "fm", "f_emb", "f_head")
    B = on_slots("bd", "bm", "b_emb", "b_head")
    W = on_slots("wd", "wm", "w_emb", "w_head")
    Rc = on_slots("rd", "rm")
    A = on_slots("ad", "am")
    busiest = np.argmax(F + B + W + Rc, axis=1)
    pick = np.arange(n), busiest
    f, b, w, rc, attention = F[pick], B[pick], W[pick], Rc[pick], A[pick]

    # Pipeline step time by closed form: one call per schedule on its rows' columns.
    pipeline = np.zeros(n)
    busy = np.zeros(n)
    inflight = np.zeros((n, NUM_SLOTS))
    for sch, rows in _rows_by_value(schedule):
        args = (sch, pp[rows], m[rows], vpp[rows])
        backward = b[rows] + rc[rows]
        pipeline[rows] = closed_form.step_time(*args, f[rows], backward, w[rows])
        busy[rows] = closed_form.busy_time(*args, f[rows], backward, w[rows])
        per_row = (column[:, None] for column in args[1:])  # against the (rows, slots) ranks
        inflight[rows] = closed_form.activation_microbatches_at(
            sch, *per_row, R["slot"][rows].astype(np.int64)
        )

    # Communication: exposed time per axis under the overlap rules.
    comm = axis_times_vectorized(
        job,
        cluster,
        tp=tp,
        cp=cp,
        pp=pp,
        dp=dp,
        ep=ep,
        vpp=vpp,
        micro_batch_size=mbs,
        num_microbatches=m,
        zero_stage=zero,
        sequence_parallel=sp,
        recompute=recompute,
        schedule=schedule,
        pipeline_layer_split=split,
        order=order or ("tp", "cp", "ep", "pp", "dp"),
        forward_s=f,
        backward_s=b + rc + w,
        attention_s=attention,
    )

    # Memory per examined rank; the peak is memory per GPU.
    states_per_param = optimizer_states_per_param(precision.optimizer, model)
    whole = unsharded_bytes_per_param(precision, states_per_param)
    zero_group = dp * cp
    expert_group = np.maximum(zero_group // ep, 1)

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
        parts[name] = (
            R["dense_params"] * shard(per_param, first_stage, zero_group)[:, None]
            + R["expert_params"] * shard(per_param, first_stage, expert_group)[:, None]
        )
    act_layers = R["dense_layers"] + R["moe_layers"]
    activations = (
        R["dense_layers"] * S["act_dense"][:, None] + R["moe_layers"] * S["act_moe"][:, None]
    ) * inflight
    activations = activations + S["working"][:, None] * (act_layers > 0)
    activations = activations + inflight * (
        R["emb"] * S["first_extra"][:, None] + R["head"] * S["last_extra"][:, None]
    )
    parts["activations"] = activations
    parts["logits_buffers"] = R["head"] * S["logits"][:, None]
    comm_buffer = _comm_buffer_columns(model, job, tp, cp, pp, ep, zero, sp, mbs, tuned)
    parts["comm_buffers"] = np.broadcast_to(comm_buffer[:, None], (n, NUM_SLOTS))
    parts["runtime_overhead"] = np.full((n, NUM_SLOTS), float(job.runtime_overhead_bytes))
    total = sum(parts.values())
    peak_slot = np.argmax(total, axis=1)
    peak_pick = np.arange(n), peak_slot
    memory = total[peak_pick]

    # Optimizer: the trainable parameters' update (and Muon's orthogonalization and gather).
    with np.errstate(divide="ignore", invalid="ignore"):  # the DP group's achieved bus rate
        dp_rate = np.where(
            comm["dp_time_s"] > 0, comm["dp_bytes_per_step"] / comm["dp_time_s"], np.inf
        )
    optimizer_s, optimizer_comm_s = optimizer_columns(
        R, zero, zero_group, rates.hbm_bytes_per_s,
        accelerator.achievable_matmul_flops_per_s("bf16"), np.nan_to_num(dp_rate, nan=np.inf),
    )  # fmt: skip

    exposed = sum(comm[f"{axis}_exposed_time_s"] for axis in AXES)
    step = pipeline + exposed + optimizer_s + optimizer_comm_s
    num_gpus = tp * cp * pp * dp
    tokens = job.global_batch_tokens if job.global_batch_tokens else dp * m * mbs * job.seq_len
    tokens_per_s_per_gpu = tokens / step / num_gpus
    flops_token = _model_flops_per_token(job, tuned, causal=False)
    flops_token_causal = _model_flops_per_token(job, tuned, causal=True)
    peak = accelerator.peak_flops_per_s(mfu_dtype)
    recompute_flops = np.array(
        [recompute_flops_per_token(model, job.seq_len, r) for r in RECOMPUTE_CODES]
    )
    extra = recompute_flops[_codes(recompute)]
    out = {
        "step_time_s": step,
        "pipeline_time_s": pipeline,
        "compute_s": busy - rc * m,
        "recompute_s": rc * m,
        "pipeline_bubble_s": pipeline - busy,
        "optimizer_s": optimizer_s,
        "optimizer_comm_s": optimizer_comm_s,
        "forward_s": f,
        "input_grad_s": b,
        "weight_grad_s": w,
        "recompute_per_microbatch_s": rc,
        "tokens_per_s_per_gpu": tokens_per_s_per_gpu,
        "model_tflops_per_gpu": tokens_per_s_per_gpu * flops_token / 1e12,
        "hardware_tflops_per_gpu": tokens_per_s_per_gpu * (flops_token + extra) / 1e12,
        "mfu": tokens_per_s_per_gpu * flops_token / peak,
        "mfu_causal": tokens_per_s_per_gpu * flops_token_causal / peak,
        "hfu": tokens_per_s_per_gpu * (flops_token + extra) / peak,
        "memory_per_gpu_bytes": memory,
        "peak_rank": R["slot"][peak_pick].astype(np.int64),
        "exposed_comm_s": exposed,
        "valid": comm["valid"],
    }
    out["bubble_fraction"] = out["pipeline_bubble_s"] / step
    for name, value in parts.items():
        out[f"memory_{name}_bytes"] = value[peak_pick]
    for axis in AXES:
        out[f"{axis}_exposed_time_s"] = comm[f"{axis}_exposed_time_s"]
        out[f"{axis}_time_s"] = comm[f"{axis}_time_s"]
        out[f"{axis}_bytes_per_step"] = comm[f"{axis}_bytes_per_step"]
    return out


def _codes(recompute: np.ndarray) -> np.ndarray:
    """Index of each row's recompute policy in :data:`RECOMPUTE_CODES`."""
    code, uniques = pd.factorize(np.asarray(recompute).reshape(-1))
    lookup = np.array([RECOMPUTE_CODES.index(name) for name in uniques], dtype=np.int64)
    return lookup[code]


def _model_flops_per_token(job: Job, tuned, causal: bool) -> float:
    """Model FLOPs per token for MFU: full training's, or the recipe's (frozen base: no W)."""
    if tuned is None:
        return model_flops_per_token(job.model, job.seq_len, causal=causal)
    ops = ft.finetune_ops_per_sequence(job.model, tuned, job.seq_len, causal)
    return sum_ops(ops).total / job.seq_len


def _comm_buffer_columns(model, job, tp, cp, pp, ep, zero, sp, mbs, tuned=None) -> np.ndarray:
    """:func:`planner.memory._comm_buffer_bytes` as column arithmetic (same terms)."""
    from planner.memory import layer_params_per_rank

    e, h = job.precision.activation_bytes, model.hidden_size
    tokens = job.seq_len * mbs / cp
    replicated = np.where(sp, 1.0 / tp, 1.0)
    total = np.where(pp > 1, 2 * tokens * h * e * replicated, 0.0)
    total = total + np.where(sp, tokens * h * e, 0.0)
    keys, inverse = _unique_rows(tp, ep)
    if tuned is None:
        layer = np.array([sum(layer_params_per_rank(model, t, x, model.is_moe)) for t, x in keys])
        weights = layer * DTYPE_BYTES[job.precision.weight_dtype]
        grads = layer * DTYPE_BYTES[job.precision.gradient_dtype]
    else:  # weights as stored (NF4 for QLoRA), gradients the adapters'
        weights, grads = np.array(
            [
                ft.layer_weight_and_grad_bytes(model, tuned, job.precision, model.is_moe, t, x)
                for t, x in keys
            ]
        ).T
    total = total + np.where(zero >= 3, 2 * weights[inverse], 0.0)
    return total + np.where(zero >= 2, grads[inverse], 0.0)
