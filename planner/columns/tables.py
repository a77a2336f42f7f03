"""Per-shape and per-structure tables for :func:`planner.evaluate.evaluate_columns`.

Pieces of the columns model that depend on a few layout fields only are computed once per
distinct value and broadcast to the rows by index (no Python loop per row):

* **shapes** (tp, cp, ep, etp, sequence parallelism, micro-batch size, recompute): one layer's
  F, B, W and recompute times (:func:`planner.cost.stage_times.shape_times`) and weight-pass
  bytes, once per shape without the recompute policy, which does not change them; its
  activation bytes and the first / last stages' extra tensors (:mod:`planner.cost.activations`);
* **structures** (tp, ep, etp, pp, vpp, schedule, layer split): what the examined pipeline ranks
  ("slots") hold — layers, parameters, embedding and head — and their model-state terms
  (:func:`planner.cost.model_states.slot_states`); layers and ends once per pipeline (pp,
  vpp, schedule, split), parameters per virtual stage once per (tp, ep, etp, pp, vpp,
  schedule, split).
"""

from __future__ import annotations

import numpy as np

from planner.columns.codes import Labels, distinct_rows, factorize
from planner.cost import activations as act
from planner.cost import adapters as ft
from planner.cost.compute import GpuRates
from planner.cost.model_states import slot_states
from planner.cost.stage_times import memo_linears, shape_times
from planner.cost.weight_pass import weight_pass_bytes_per_layer
from planner.pipeline.schedules.registry import BIDIRECTIONAL_SCHEDULES
from planner.spec.job import Job
from planner.spec.layout import Layout, dense_and_moe_layers_per_virtual_stage, virtual_stage_ranks
from planner.structure import op_counts
from planner.structure.params import params_per_virtual_stage, rank_sums
from planner.structure.stages import rank_structure

#: Shape-table entries the memory model reads; the others are per-layer times.
MEMORY_SHAPE_KEYS = (
    *("act_dense", "act_moe", "first_extra", "last_extra", "working", "backward", "logits"),
    *("wpass_dense", "wpass_moe"),
)
TIME_SHAPE_KEYS = (
    *("fd", "bd", "wd", "rd", "fm", "bm", "wm", "rm"),
    *("f_emb", "b_emb", "w_emb", "f_head", "b_head", "w_head"),
    *("wd_acc", "wm_acc", "w_head_acc"),  # W accumulating into the gradient buffer
)


def rows_by_value(column) -> list[tuple[object, np.ndarray]]:
    """(value, indices of the rows holding it) for each distinct value of ``column``."""
    if isinstance(column, Labels):
        return column.groups()
    codes, uniques = factorize(column)
    if not len(uniques):
        return []
    order = np.argsort(codes, kind="stable")
    bounds = np.cumsum(np.bincount(codes, minlength=len(uniques)))[:-1]
    return list(zip(uniques.tolist(), np.split(order, bounds), strict=True))


def one_value_or_column(column):
    """The value every row holds (string rules then run once, broadcast), else the column
    (labels as plain strings)."""
    if isinstance(column, Labels):
        present = column.present
        return present[0] if len(present) == 1 else column.strings()
    codes, uniques = factorize(column)
    return uniques[0] if len(uniques) == 1 and codes.min() == 0 else column


def _with_mirror(per_rank: list[float], mirrored: int) -> np.ndarray:
    """Per-rank values plus, for DualPipe, those of the rank's mirrored stage (pp − 1 − r)."""
    values = np.asarray(per_rank, dtype=float)
    return values + mirrored * values[::-1]


def examined_ranks(content: np.ndarray) -> np.ndarray:
    """The pipeline ranks whose memory and compute can peak, of ``content`` ([feature, rank]:
    what each rank holds — layers of each kind, embedding, head, DualPipe's mirrored stage).

    Ranks that hold the same take the same time, and their memory differs only by position:
    the schedule's in-flight micro-batches and weight-pass units at a rank
    (:func:`planner.pipeline.closed_form.peak_activation_units`) are monotone along the
    pipeline — falling for most schedules, rising for the zero-bubble ones when a micro-batch
    waiting for W holds more than one waiting for B (``M_W > M_B``) — and DualPipe's two
    directions are linear in the position with opposite signs. So the first and the last
    rank of each distinct content hold its peak; ``tests/consistency`` pins the choice
    against every rank."""
    first: dict[tuple, int] = {}
    last: dict[tuple, int] = {}
    for rank, held in enumerate(map(tuple, content.T.tolist())):  # few ranks: not unique()
        first.setdefault(held, rank)
        last[held] = rank
    return np.array(sorted({*first.values(), *last.values()}), dtype=np.int64)


def _padded(values: np.ndarray, width: int) -> np.ndarray:
    """[..., slot] values widened to ``width`` slots by repeating the last (a repeated slot
    changes no sum's peak and no argmax's value)."""
    missing = width - values.shape[-1]
    if not missing:
        return values
    return np.concatenate([values, np.repeat(values[..., -1:], missing, axis=-1)], axis=-1)


def local_token_ratio(mbs, cp) -> tuple[np.ndarray, np.ndarray]:
    """The micro-batch over the CP degree in lowest terms (numerator, denominator): every
    per-shape quantity reads ``mbs`` and ``cp`` only through the rank's tokens ``s·mbs/cp``
    and the sequences ``mbs/cp`` (equal fractions round to the same float), and the
    op-dispatch cost through ``cp > 1``."""
    mbs, cp = np.asarray(mbs, dtype=np.int64), np.asarray(cp, dtype=np.int64)
    common = np.gcd(mbs, cp)
    return mbs // common, cp // common


def shape_table_of(
    job: Job, rates: GpuRates, tuned, tp, cp, ep, etp, sp, mbs, recompute, bf16_rates=None
) -> dict[str, np.ndarray]:
    """Per distinct layer shape, given one row each (the rows of ``tp``, … are distinct
    shapes, in the table's order; ``recompute``: their policies as :class:`Labels`):
    activation bytes and per-layer times.

    ``etp``: the routed experts' TP degree per row; ``bf16_rates``: under an FP8 recipe,
    the rates of the ops that stay in BF16.

    Each quantity is worked out once per distinct value of the fields it reads, on one
    shape holding it: times and weight-pass bytes per (tp, ep, etp, SP, mbs/cp, cp > 1
    where dispatch costs time), without the recompute policy; activation bytes per (tp,
    etp, SP, mbs/cp, the routed load of ep, recompute) (:func:`local_token_ratio`;
    ``tests/columns/test_shape_fields.py`` holds the functions to those fields)."""
    model, e = job.model, job.precision.activation_bytes
    t, c, x, et, s, b = (np.asarray(col) for col in (tp, cp, ep, etp, sp, mbs))
    r = recompute.codes
    num, den = local_token_ratio(b, c)
    many_cp = (c > 1) if rates.op_overhead_s else np.zeros(len(c), dtype=bool)
    load = model.routed_load_factor(x) if model.is_moe else np.ones(len(x))
    time_rows, time_of = distinct_rows(t, x, et, s, num, den, many_cp)
    act_rows, act_of = distinct_rows(t, et, s, num, den, load, r)
    measures = job.active_memory_measures

    def activation_shape(u: int) -> act.ActivationShape:
        return act.ActivationShape(
            seq_len=job.seq_len, micro_batch_size=int(b[u]), tp=int(t[u]), cp=int(c[u]),
            sequence_parallel=bool(s[u]), flash_attention=job.flash_attention,
            recompute=recompute.values[r[u]], element_bytes=e, measures=measures,
            ep=int(x[u]), etp=None if et[u] == t[u] else int(et[u]),
        )  # fmt: skip

    memo = {}  # the pieces of a shape that read fewer fields (stage_times.shape_times)
    free_rows = [
        _recompute_free(job, rates, tuned, bf16_rates, activation_shape(u), int(x[u]), memo)
        for u in time_rows.tolist()
    ]
    own_rows = [_activation_entries(job, tuned, activation_shape(u)) for u in act_rows.tolist()]
    own = np.array(own_rows, dtype=float).reshape(-1, len(ACTIVATION_SHAPE_KEYS))[act_of].T
    free = np.array([row for *_, row in free_rows], dtype=float).reshape(-1, len(FREE_SHAPE_KEYS))
    columns = dict(zip(ACTIVATION_SHAPE_KEYS, own, strict=True))
    columns.update(zip(FREE_SHAPE_KEYS, free[time_of].T, strict=True))
    # Recompute seconds: the shape's layer times under its policy (once per time × policy).
    policies = recompute.values
    rerun = np.array(
        [[(times.dense.recompute_s(p), moe_t.recompute_s(p)) for p in policies]
         for times, moe_t, _ in free_rows],
        dtype=float,
    ).reshape(len(free_rows), len(policies), 2)  # fmt: skip
    columns["rd"], columns["rm"] = rerun[time_of, r].T
    return {key: columns[key] for key in MEMORY_SHAPE_KEYS + TIME_SHAPE_KEYS}


def _activation_entries(job: Job, tuned, shape: act.ActivationShape) -> tuple[float, ...]:
    """The values of :data:`ACTIVATION_SHAPE_KEYS` for one shape."""
    model = job.model
    adapters = ft.adapter_layer_bytes(model, tuned, shape)
    act_moe = act.activation_bytes_per_layer(model, shape, True) if model.is_moe else 0.0
    return (  # in the order of ACTIVATION_SHAPE_KEYS
        act.activation_bytes_per_layer(model, shape, False) + adapters[False],
        act_moe + adapters[True] if model.is_moe else 0.0,
        sum(act.first_stage_tensors(model, shape).values()),
        sum(act.last_stage_tensors(model, shape).values()),
        act.rebuilt_layer_bytes(model, shape)
        + sum(ft.adapter_working_max(model, tuned, shape).values()),
        act.backward_working_bytes(model, shape),
        act.logits_buffer_bytes(model, shape, job.cross_entropy),
    )


#: Shape-table entries of activation memory (:func:`_activation_entries`' order).
ACTIVATION_SHAPE_KEYS = ("act_dense", "act_moe", "first_extra", "last_extra", "working",
                         "backward", "logits")  # fmt: skip
#: Shape-table entries that do not depend on the recompute policy, in :func:`_recompute_free`'s
#: order.
FREE_SHAPE_KEYS = ("wpass_dense", "wpass_moe", "fd", "bd", "wd", "fm", "bm", "wm", "f_emb",
                   "b_emb", "w_emb", "f_head", "b_head", "w_head", "wd_acc", "wm_acc",
                   "w_head_acc")  # fmt: skip


def _recompute_free(job: Job, rates, tuned, bf16_rates, shape, ep: int, memo: dict):
    """(layer times, MoE layer times, the values of :data:`FREE_SHAPE_KEYS`): a shape's
    entries that do not depend on the recompute policy, per-layer times and weight-pass bytes
    (``memo``: kept over the shapes of one table, :func:`planner.cost.stage_times.shape_times`)."""
    model, t, b = job.model, shape.tp, shape.micro_batch_size
    times = shape_times(
        model, job.seq_len, b, t, shape.cp, ep, shape.sequence_parallel, job.flash_attention,
        rates, shape.element_bytes, tuned, bf16_rates, shape.measures, shape.etp, memo,
    )  # fmt: skip
    kept = job.weight_pass_memory

    def weight_pass(moe_layer: bool) -> float:
        linears = memo_linears(memo, model, moe_layer, t)
        return weight_pass_bytes_per_layer(model, shape, moe_layer, kept, linears)

    moe_t = times.moe or times.dense
    return (
        times,
        moe_t,
        (  # in the order of FREE_SHAPE_KEYS
            weight_pass(False),
            weight_pass(True) if model.is_moe else 0.0,
            times.dense.forward_s,
            times.dense.input_grad_s,
            times.dense.weight_grad_s,
            moe_t.forward_s,
            moe_t.input_grad_s,
            moe_t.weight_grad_s,
            times.embedding.forward_s,
            times.embedding.input_grad_s,
            0.0,
            sum(op.forward_s for op in times.head),
            sum(op.input_grad_s for op in times.head),
            sum(op.weight_grad_s for op in times.head),
            times.dense.weight_grad_accumulate_s,
            moe_t.weight_grad_accumulate_s,
            sum(op.accumulating_weight_grad_s for op in times.head),
        ),
    )


def _pipeline_slots(
    model, pp: int, vpp: int, schedule: str, split: str, layers, every_rank: bool = False
) -> dict[str, np.ndarray]:
    """What the examined ranks of one pipeline (pp, vpp, schedule, split; ``layers`` per
    virtual stage) hold, whatever the tp and ep: [slot] arrays of layers (own, paced,
    mirrored and both directions'), ends. ``every_rank``: every rank is a slot."""
    structure = rank_structure(model, pp, vpp, schedule, split, layers)
    dense, moe = np.asarray(structure.dense_layers), np.asarray(structure.moe_layers)
    emb, head = (np.asarray(v, dtype=float) for v in (structure.has_embedding, structure.has_head))
    dualpipe = schedule in BIDIRECTIONAL_SCHEDULES
    content = np.stack([dense, moe, emb, head, *((dense[::-1], moe[::-1]) if dualpipe else ())])
    slots = np.arange(pp) if every_rank else examined_ranks(content)
    out = {
        "dense_layers": dense[slots],
        "moe_layers": moe[slots],
        "emb": np.asarray(structure.has_embedding, dtype=float)[slots],
        "head": np.asarray(structure.has_head, dtype=float)[slots],
        "slot": slots.astype(float),
    }
    # Model states cover both of DualPipe's directions: add the mirrored stage's layers.
    mirrored = 1 if dualpipe else 0
    for kind, layers in (("dense_layers", dense), ("moe_layers", moe)):
        both = _with_mirror(layers, mirrored)
        out[f"paced_{kind}"] = (both / (1 + mirrored))[slots]  # per micro-batch: the mean
        out[f"mirror_{kind}"] = layers[::-1][slots]  # stage pp − 1 − r
        out[f"both_{kind}"] = both[slots]
    if dualpipe:  # the mirrored direction's embedding and head
        out["emb"] = np.where(slots == pp - 1, 1.0, out["emb"])
        out["head"] = np.where(slots == 0, 1.0, out["head"])
    return out


def structure_table_of(job: Job, structs: list[tuple], every_rank: bool = False) -> dict:
    """Per distinct pipeline structure, given as (tp, ep, etp, pp, vpp, schedule, split)
    tuples in the table's order, [structure, slot] arrays of what the examined ranks
    (``every_rank``: all of them) hold (DualPipe's mirrored direction included).

    Layers and ends are worked out once per pipeline (pp, vpp, schedule, split), parameters
    per virtual stage once per (tp, ep, etp, pp, vpp, schedule, split), each distinct rank's
    states once."""
    model = job.model
    pipelines: dict[tuple, int] = {}  # (pp, vpp, schedule, split) → its index
    per_pipeline, layouts = [], []
    # (tp, ep, etp, pp, vpp, schedule, split) → (dense, expert) parameters per stage
    stage_params: dict[tuple, tuple] = {}
    stage_layers: dict[tuple, tuple] = {}  # (pp, vpp, schedule, split) → (dense, MoE) per stage
    pipe_of = np.zeros(len(structs), dtype=np.int64)
    for u, (_, _, _, p, v, sch, spl) in enumerate(structs):
        if (p, v, sch, spl) not in pipelines:
            stage_layers[p, v, sch, spl] = dense_and_moe_layers_per_virtual_stage(
                model, p, v, spl, sch
            )
            pipelines[p, v, sch, spl] = len(per_pipeline)
            per_pipeline.append(
                _pipeline_slots(model, p, v, sch, spl, stage_layers[p, v, sch, spl], every_rank)
            )
            layout = Layout(pp=p, vpp=v, schedule=sch, pipeline_layer_split=spl)
            layouts.append((layout, virtual_stage_ranks(sch, p, v)))
        pipe_of[u] = pipelines[p, v, sch, spl]
    width = max(len(pipe["slot"]) for pipe in per_pipeline)  # examined ranks, all padded alike
    per_pipeline = [{k: _padded(a, width) for k, a in pipe.items()} for pipe in per_pipeline]
    dense_params, expert_params = np.zeros((2, len(structs), width))
    for u, (t, x, et, p, v, sch, spl) in enumerate(structs):
        if (t, x, et, p, v, sch, spl) not in stage_params:
            layout = Layout(tp=t, ep=x, etp=None if et == t else et, pp=p, vpp=v, dp=x,
                            schedule=sch, pipeline_layer_split=spl)  # fmt: skip
            stage_params[t, x, et, p, v, sch, spl] = params_per_virtual_stage(
                model, layout, stage_layers[p, v, sch, spl]
            )
        dense_stage, expert_stage = stage_params[t, x, et, p, v, sch, spl]
        pipe = pipe_of[u]
        slots = per_pipeline[pipe]["slot"].astype(np.int64)
        dense_params[u] = rank_sums(dense_stage, *layouts[pipe])[slots]  # reads pp, vpp, schedule
        expert_params[u] = rank_sums(expert_stage, *layouts[pipe])[slots]
    table = {
        key: np.stack([pipe[key] for pipe in per_pipeline])[pipe_of] for key in per_pipeline[0]
    }
    table["dense_params"], table["expert_params"] = dense_params, expert_params
    both = table.pop("both_dense_layers"), table.pop("both_moe_layers")
    table["held_layers"] = both[0] + both[1]  # both of DualPipe's copies
    tp_ep = np.array([(t, x, et) for t, x, et, *_ in structs], dtype=np.int64).reshape(-1, 3)
    table.update(
        slot_states(job, tp_ep[:, 0], tp_ep[:, 1], dense_params, expert_params, *both, tp_ep[:, 2])
    )
    # Tensors the optimizer steps (both directions' for DualPipe): its dispatch count.
    table["param_tensors"] = op_counts.rank_param_tensors(
        model, job.finetune, *both, table["emb"], table["head"]
    )
    return table
