"""Rows of layouts as the per-axis traffic reads them (:mod:`planner.comm.traffic`): their
distinct combinations of what the terms depend on (:func:`keyed_rows`), each degree
combination's placement (cached by :func:`planner.comm.topology.placement_for_view`),
whether a row can be placed at all, its model chunks per rank, and the string-column
helpers these read the rows with."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from hwspecs.schema import Cluster
from planner.columns.codes import Labels, distinct_rows, factorize
from planner.comm.levels import cluster_view
from planner.comm.topology import cluster_key, placement_for_view
from planner.pipeline.closed_form import combined_1f1b_paired_share, dualpipe_paired_share
from planner.pipeline.schedules.registry import (
    BIDIRECTIONAL_SCHEDULES,
    EP_OVERLAP_SCHEDULES,
    SCHEDULES,
    V_SHAPE_SCHEDULES,
    get_schedule,
)
from planner.spec.layout import cp_algorithm_codes, resolved_etp
from planner.spec.rules import expert_split_ok, layers_broken


def placements_of(cluster: Cluster, combos: np.ndarray, order: tuple[str, ...]) -> list:
    """The placement of each (tp, cp, ep, pp, dp, etp) combination; None where it cannot be
    placed."""
    views, placements = {}, []
    tp, cp, ep, pp, dp, etp = combos.T
    placed = (tp * cp * pp * dp <= cluster.num_gpus) & expert_split_ok(tp, cp, dp, ep, etp)
    for (tp, cp, ep, pp, dp, etp), ok in zip(combos.tolist(), placed.tolist(), strict=True):
        if not ok:
            placements.append(None)  # stays unpriced: the row cannot be placed
            continue
        num_gpus = tp * cp * pp * dp
        if num_gpus not in views:
            views[num_gpus] = cluster_view(cluster, num_gpus), cluster_key(cluster, num_gpus)
        view, view_key = views[num_gpus]
        sizes = {"tp": tp, "cp": cp, "ep": ep, "pp": pp, "dp": dp}
        if etp != tp:
            sizes["etp"] = etp
        placements.append(placement_for_view(view, order, sizes, view_key))
    return placements


def chunks_column(schedule: np.ndarray, vpp: np.ndarray) -> np.ndarray:
    """Model chunks per rank: the vpp, except zbv and dualpipev, which always run two."""
    fixed = {name: spec.fixed_vpp for name, spec in SCHEDULES.items() if spec.fixed_vpp}
    codes, names = column_codes(schedule)
    per_name = np.array([fixed.get(name, 0) for name in names], dtype=np.int64)
    return np.where(per_name[codes] > 0, per_name[codes], vpp) if len(names) else vpp.copy()


def column_codes(column) -> tuple[np.ndarray, list]:
    """Each row's index into the column's distinct values, and those values
    (:func:`planner.columns.codes.factorize`, unless the column comes as its ``Labels``)."""
    if isinstance(column, Labels):
        return column.codes, list(column.values)
    values = np.asarray(column)
    codes, names = factorize(values)
    return codes.reshape(values.shape), names.tolist()


def distinct_values(column) -> list:
    """The column's distinct values (:func:`column_codes`)."""
    return column_codes(column)[1]


def ep_paired_share(job, schedule, pp, m, chunks, ep, full) -> np.ndarray:
    """Per row, the share of a rank's forward chunks whose EP all-to-alls run beside another
    micro-batch's compute (0: none overlap): DualPipe's F&B pairs
    (:func:`planner.pipeline.closed_form.dualpipe_paired_share`), or, where the job runs
    Megatron-Core's combined 1F1B (``job.ep_comm_overlap``), the interleaved or unpipelined
    1F1B steps it pairs (:func:`planner.pipeline.closed_form.combined_1f1b_paired_share`;
    Megatron-Core asserts no full recomputation there). Works on numpy arrays."""
    return ep_pairing_share(ep_pairing(job, schedule, pp, chunks, ep, full), pp, m, chunks)


#: How a row's EP all-to-alls overlap compute (:func:`ep_pairing`): not at all, in
#: DualPipe's F&B pairs, in Megatron-Core's combined 1F1B.
NO_PAIRING, DUALPIPE_PAIRING, COMBINED_1F1B_PAIRING = 0, 1, 2


def ep_pairing(job, schedule, pp, chunks, ep, full) -> np.ndarray:
    """Per row, how its EP all-to-alls overlap compute (:data:`NO_PAIRING` …): DualPipe's
    schedules always; Megatron-Core's combined 1F1B where :func:`runs_combined_1f1b`. Works
    on numpy arrays."""
    dual = is_one_of(schedule, EP_OVERLAP_SCHEDULES)
    combined = runs_combined_1f1b(job, schedule, pp, chunks, ep, full)
    return np.where(dual, DUALPIPE_PAIRING, np.where(combined, COMBINED_1F1B_PAIRING, NO_PAIRING))


def ep_pairing_share(pairing, pp, m, chunks) -> np.ndarray:
    """The share of paired chunks of each row's :func:`ep_pairing`. Works on numpy arrays."""
    dual = dualpipe_paired_share(pp, m, chunks)
    combined = combined_1f1b_paired_share(pp, m, chunks)
    return np.where(
        pairing == DUALPIPE_PAIRING, dual, np.where(pairing == COMBINED_1F1B_PAIRING, combined, 0.0)
    )


def runs_combined_1f1b(job, schedule, pp, chunks, ep, full) -> np.ndarray:
    """Rows where ``job``'s stack runs Megatron-Core's combined 1F1B
    (``job.ep_comm_overlap``): an MoE job with EP, in interleaved 1F1B with virtual stages or
    without pipelining, and without full recomputation (``transformer_config.py`` asserts
    each). Works on numpy arrays."""
    if not (job.ep_comm_overlap and job.model.is_moe):
        return np.zeros(np.shape(ep), dtype=bool)
    pp, chunks = np.asarray(pp), np.asarray(chunks)
    interleaved = is_one_of(schedule, ("interleaved-1f1b",)) & (chunks > 1)
    unpipelined = is_one_of(schedule, ("1f1b",)) & (pp == 1)
    return (interleaved | unpipelined) & (np.asarray(ep) > 1) & (np.asarray(full) == 0)


def is_one_of(column, names) -> np.ndarray:
    """Rows whose value is one of ``names`` (string columns: one hash pass, no sort)."""
    codes, values = column_codes(column)
    return np.array([value in names for value in values], dtype=bool)[codes]


def placeable(
    cluster: Cluster, num_layers: int, tp, cp, pp, dp, ep, chunks, split="auto", etp=None
):
    """Rows that can be placed: the cluster has the GPUs, the EP group can be formed out of
    dp·cp and the tp/etp folded TP ranks (the combinations :class:`planner.comm.cost_tables.CostTables` leaves
    unpriced) and the layer split is legal (the rule table's ``layers`` rule)."""
    etp = tp if etp is None else etp
    priced = (tp * cp * pp * dp <= cluster.num_gpus) & expert_split_ok(tp, cp, dp, ep, etp)
    stages = {"pp": np.asarray(pp), "vpp": np.asarray(chunks), "split": split}
    return priced & ~layers_broken(num_layers, stages)


class Keyed(NamedTuple):
    """Rows of layouts and their distinct combinations of what every term but its exposure
    depends on (the degrees, chunks, micro-batches, SP, full recompute, ZeRO stage and
    layer split): :func:`keyed_rows`."""

    rows: tuple  # the rows' shape
    flat: dict  # every column over the rows, one dimension
    key: dict  # every column on one row per distinct combination
    inv: np.ndarray  # each row's combination
    split: object  # the layer split: one value, or a column of the combinations
    ep_paired: np.ndarray  # rows' share of chunks whose EP all-to-alls overlap (ep_paired_share)


def keyed_rows(
    job, tp, cp, pp, dp, ep, etp, vpp, micro_batch_size, num_microbatches, zero_stage,
    sequence_parallel, recompute, schedule, pipeline_layer_split, cp_algorithm, cp_inner,
) -> Keyed:  # fmt: skip
    """The rows (numpy columns, scalars broadcast; see :func:`planner.comm.traffic.axis_times_vectorized`) as one
    dimension, and one row per distinct combination of the fields every term but its
    exposure reads: terms, bytes and raw times are worked out on those and broadcast."""
    tp, cp, pp, dp, ep, vpp, b, zero = np.broadcast_arrays(
        *(
            np.asarray(x, dtype=np.int64)
            for x in (tp, cp, pp, dp, ep, vpp, micro_batch_size, zero_stage)
        )
    )
    etp = np.broadcast_to(resolved_etp(etp, tp), tp.shape)
    rows = tp.shape
    sp = np.broadcast_to(np.asarray(sequence_parallel, dtype=bool), rows)
    if isinstance(recompute, Labels):
        full = recompute.isin(("full",)).astype(np.int64).reshape(rows)
    else:
        full = np.broadcast_to(np.asarray(recompute) == "full", rows).astype(np.int64)
    if not isinstance(schedule, Labels):
        schedule = np.broadcast_to(np.asarray(schedule), rows)
    for name in distinct_values(schedule):
        get_schedule(str(name))  # an unknown name raises its one-line error
    chunks = chunks_column(schedule, vpp)
    batch_ok = np.ones(rows, dtype=bool)
    if num_microbatches is not None:
        m = np.broadcast_to(np.asarray(num_microbatches, dtype=np.int64), rows)
    elif job.global_batch_size is None:  # as Layout.resolved_num_microbatches
        m = np.where(vpp > 1, pp * vpp, pp)
    else:
        m, remainder = np.divmod(job.global_batch_size, dp * b)
        batch_ok = remainder == 0
    count_rows = int(np.prod(rows))
    flat = {  # every column over the rows, one dimension
        name: np.broadcast_to(column, rows).reshape(count_rows)
        for name, column in {
            "tp": tp, "cp": cp, "pp": pp, "dp": dp, "ep": ep, "etp": etp, "chunks": chunks,
            "b": b, "m": m,
            "sp": sp, "full": full, "zero": zero, "v_shape": is_one_of(schedule, V_SHAPE_SCHEDULES),
            "mirrored": is_one_of(schedule, BIDIRECTIONAL_SCHEDULES),  # two parameter copies per rank
            "cpa": cp_algorithm_codes(cp_algorithm, rows),
            "inner": np.zeros(rows, dtype=np.int64) if cp_inner is None else np.where(
                np.asarray(cp_algorithm_codes(cp_algorithm, rows)) == 3,
                np.asarray(cp_inner, dtype=np.int64), 0),
            "batch_ok": batch_ok,
            "ep_pairing": ep_pairing(job, schedule, pp, chunks, ep, full),
        }.items()
    }  # fmt: skip
    split = pipeline_layer_split
    if np.ndim(split):
        flat["split"] = np.broadcast_to(np.asarray(split), rows).reshape(count_rows)
    key_rows, inv = distinct_rows(*(flat[k] for k in flat if k != "batch_ok"))
    key = {name: column[key_rows] for name, column in flat.items()}
    # The paired share per combination (pp, m, chunks and the pairing are of its fields).
    key["ep_paired"] = ep_pairing_share(key["ep_pairing"], key["pp"], key["m"], key["chunks"])
    split_key = key["split"] if np.ndim(split) else split
    return Keyed(rows, flat, key, inv, split_key, key["ep_paired"][inv])
