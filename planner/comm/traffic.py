"""Per-axis communication for many layouts at once: the search's form of :mod:`planner.comm.report`.

:func:`axis_times_vectorized` takes one numpy column per layout field (scalars broadcast)
and returns one column per quantity, with no Python loop per row. The terms come from
:func:`planner.comm.report.step_terms` (the same formulas the explained report uses); the
collective times come from cost tables built once per distinct (tp, cp, ep, pp, dp, etp): every
algorithm costs ``alpha + beta · bytes`` (:mod:`planner.comm.collectives`), so a row's time is
``min over algorithms of alpha[combo] + beta[combo] · message_bytes``. Placements are cached
by :func:`planner.comm.topology.placement_for_view`, so repeated calls are cheap. Everything but
the exposure depends on a few fields (degrees, chunks, micro-batches, SP, full recompute,
ZeRO stage, layer split): terms, bytes and raw times are worked out once per distinct
combination of them and broadcast; only terms whose exposure reads the compute times are
split into exposed and hidden per row (:mod:`planner.columns.codes`).

The same tables say how long each physical link of a rank is busy per byte
(:class:`planner.comm.collectives.Cost`), so each row also gets, per link, the seconds each axis keeps
it busy, exposed and hidden; :mod:`planner.comm.contention` turns those into the time lost where
axes share a link (``link_contention_s``).
"""

from __future__ import annotations

import numpy as np

from hwspecs.catalog import load_accelerator
from hwspecs.schema import Cluster
from planner.comm.collectives import volume_factor
from planner.comm.contention import sharing_delay
from planner.comm.context_parallel import (
    ALL_TO_ALL_RULE,
    RING_RULE,
    cp_inner_column,
    ring_exposed_time,
)
from planner.comm.cost_tables import CostTables, cheapest, link_busy
from planner.comm.exposure import ep_overlap_sm_share, exposed_floor, exposed_time
from planner.comm.levels import as_cluster
from planner.comm.mesh import resolve_order
from planner.comm.rows import (
    keyed_rows,
    placeable,
    placements_of,
)
from planner.comm.terms import (
    AXIS_GROUPS,
    ep_routing,
    step_terms,
)
from planner.spec.job import Job
from planner.spec.layout import (
    DEFAULT_MESH_ORDER,
    expert_data_parallel_size,
)

#: Axes whose columns :func:`axis_times_vectorized` returns (all of them, zeros where idle).
AXES: tuple[str, ...] = tuple(AXIS_GROUPS)


def _group_sizes(key: dict) -> dict[str, np.ndarray]:
    """Ranks in each placement group (:data:`AXIS_GROUPS`) of the rows."""
    tp, cp, pp, dp, ep, etp = (key[k] for k in ("tp", "cp", "pp", "dp", "ep", "etp"))
    inner = key.get("cp_inner", 1)
    return {"tp": tp, "cp": cp, "ep": ep, "pp": pp, "dp_cp": dp * cp,
            "edp": expert_data_parallel_size(dp, cp, tp, ep, etp),
            "cp_ring": cp, "cp_inner": inner + 0 * cp, "cp_outer": cp // inner}  # fmt: skip


def _priced_terms(
    job: Job, cluster: Cluster, order, key: dict, split, axes: tuple[str, ...] | None = None,
    links: bool = True,
):  # fmt: skip
    """Every collective term that some row runs (of ``axes``; None: all), priced on the rows
    of ``key`` (columns tp, cp, pp, dp, ep, etp, chunks, b, m, sp, full, zero, v_shape,
    mirrored), one after another: (term, count, message bytes, one collective's seconds, one
    bucket's seconds, raw seconds, {link: seconds busy}; with ``links`` False, None for the
    last, not worked out). A generator: a caller that reads each term once holds one term's
    columns at a time.

    Collective times come from cost tables built once per distinct (tp, cp, ep, pp, dp, etp,
    given inner degree). Sets ``key["cp_inner"]``, hierarchical CP's inner degree: the row's
    ``inner`` where given (> 0), else that of its placement (the CP ranks of one domain),
    before the first term."""
    rows = key["tp"].shape
    combos = np.stack([key[k] for k in ("tp", "cp", "ep", "pp", "dp", "etp", "inner")], axis=-1)
    combos = combos.reshape(-1, 7)
    radix = combos.max(axis=0, initial=0) + 1  # one integer key per row: np.unique on ints is fast
    keys = np.ravel_multi_index(tuple(combos.T), tuple(radix))
    unique_keys, inv = np.unique(keys, return_inverse=True)
    unique = np.stack(np.unravel_index(unique_keys, tuple(radix)), axis=1)
    inv = inv.reshape(rows)
    placements = placements_of(cluster, unique[:, :6], order)
    inners = np.where(unique[:, 6] > 0, unique[:, 6], cp_inner_column(placements))
    costs = CostTables(placements, ep_routing(job.model), inners)
    key["cp_inner"] = inners[inv]
    rates = None  # ring attention's blocks are timed at the GPU's rates
    if np.isin(key["cpa"], (1, 3)).any():
        from planner.cost.compute import GpuRates

        rates = GpuRates.of(
            load_accelerator(cluster.accelerator), job.precision.gemm_dtype, job.attention_kernel
        )
    terms = step_terms(
        job, *(key[k] for k in ("tp", "cp", "pp", "dp", "ep", "chunks", "b", "m", "sp", "full",
                                 "zero")), split, key["v_shape"], key["etp"], key["mirrored"],
        key["cpa"], key["cp_inner"], rates,
    )  # fmt: skip
    for term in terms:
        count = np.broadcast_to(np.asarray(term.count, dtype=float), rows)
        if not count.any() or (axes is not None and term.axis not in axes):
            continue
        yield _priced(term, count, costs, inv, rows, links)


def _priced(term, count: np.ndarray, costs, inv: np.ndarray, rows: tuple, links: bool) -> tuple:
    """One term priced on the rows (:func:`_priced_terms`' tuple)."""
    with np.errstate(invalid="ignore"):  # inf · 0 in rows that cannot be placed
        alpha, beta, per_byte = costs(term.group or AXIS_GROUPS[term.axis], term.op)
        message = np.broadcast_to(np.asarray(term.message_bytes, dtype=float), rows)
        # One collective's time, on the rows that run it (the others count 0 of them).
        live = np.flatnonzero(count > 0)
        at = inv.ravel()[live]
        ab = alpha[at], beta[at]
        one, choice = cheapest(*ab, live, message, rows)
        bucket = one
        if np.any(term.bucket_bytes):
            bucket = cheapest(*ab, live, term.bucket_bytes, rows)[0]
        raw = np.where(count > 0, count * one, 0.0)
        busy = link_busy(per_byte, at, choice, live, count * message, rows) if links else None
    return term, count, message, one, bucket, raw, busy


def _add(columns: dict, name: str, rows: np.ndarray | None, values: np.ndarray) -> None:
    """``columns[name] += values``, on ``rows`` of it only when given."""
    if rows is None:
        columns[name] = columns[name] + values
    else:
        columns[name][rows] += values


def _reshaped(out: dict, rows: tuple) -> dict:
    """Every column (and every column of a {link: column} dict) in the rows' shape."""
    return {
        name: {link: c.reshape(rows) for link, c in value.items()}
        if isinstance(value, dict)
        else value.reshape(rows)
        for name, value in out.items()
    }


def _reads_compute(term, tp_comm_overlap: bool) -> bool:
    """Whether a term's exposure reads the compute it hides behind (so is worked out per row
    when compute times are given): all but CP's and, unless TP overlaps, TP's."""
    return not (
        term.rule in ("cp_exposed", RING_RULE, ALL_TO_ALL_RULE)
        or (term.rule == "exposed" and not tp_comm_overlap)
    )


def _exposed_per_key(term, count, one, bucket, raw, key: dict, overlaps: bool) -> np.ndarray:
    """Exposed seconds of a term whose exposure reads no compute, per key: all of it, but
    ring attention's steps behind their block compute where the GPU overlaps (``overlaps``);
    0 where the term does not run."""
    exposed = exposed_time(term.rule, raw, one, bucket, key["m"], key["pp"], key["chunks"], None)
    if term.rule == RING_RULE and overlaps:  # behind the block compute
        exposed = ring_exposed_time(raw, count, one, term.overlap_s, term.extra_s)
    return np.where(count > 0, exposed, 0.0)


def exposed_floor_vectorized(
    job: Job,
    cluster: Cluster | str,
    *,
    tp,
    cp=1,
    pp=1,
    dp=1,
    ep=1,
    etp=None,
    vpp=1,
    micro_batch_size=1,
    num_microbatches=None,
    zero_stage=1,
    sequence_parallel=True,
    recompute="none",
    schedule="1f1b",
    pipeline_layer_split="auto",
    order=DEFAULT_MESH_ORDER,
    tp_comm_overlap=False,
    cp_algorithm=None,
    cp_inner=None,
    skip_axes: tuple[str, ...] = (),
) -> np.ndarray:
    """A lower bound of each row's exposed communication, read without its compute times:
    of the sum over the axes not in ``skip_axes`` of :func:`axis_times_vectorized`'s
    ``{axis}_exposed_time_s`` with any ``forward_s``, ``backward_s`` ≥ 0 (the same
    arguments otherwise). Worked out per key only: a term whose exposure reads no compute
    exposes what it does there, the others their
    :func:`planner.comm.exposure.exposed_floor`. NaN where a row cannot be placed."""
    cluster = as_cluster(cluster)
    order = resolve_order(order)
    rows, flat, key, inv, split_key, _ = keyed_rows(
        job, tp, cp, pp, dp, ep, etp, vpp, micro_batch_size, num_microbatches, zero_stage,
        sequence_parallel, recompute, schedule, pipeline_layer_split, cp_algorithm, cp_inner,
    )  # fmt: skip
    accelerator = load_accelerator(cluster.accelerator)
    overlaps = accelerator.overlaps_communication
    sm_share = ep_overlap_sm_share(accelerator.num_compute_units)
    floor = np.zeros(len(key["tp"]))  # per key (the EP overlap's share is one of its fields)
    priced = _priced_terms(job, cluster, order, key, split_key, links=False)  # one at a time
    with np.errstate(invalid="ignore"):  # inf · 0 in rows that cannot be placed
        for term, count, _, one, bucket, raw, _ in priced:
            if term.axis in skip_axes:
                continue
            if not (overlaps and _reads_compute(term, tp_comm_overlap)):
                exposed = _exposed_per_key(term, count, one, bucket, raw, key, overlaps)
            else:
                exposed = exposed_floor(term.rule, raw, one, bucket, key["m"], key["pp"],
                                        key["chunks"], tp_comm_overlap, key["ep_paired"],
                                        sm_share)  # fmt: skip
                exposed = np.where(count > 0, exposed, 0.0)
            floor += exposed
    valid = placeable(cluster, job.model.num_layers, key["tp"], key["cp"], key["pp"], key["dp"],
                      key["ep"], key["chunks"], split_key, key["etp"])[inv] & flat["batch_ok"]  # fmt: skip
    return np.where(valid, floor[inv], np.nan).reshape(rows)


def axis_times_vectorized(
    job: Job,
    cluster: Cluster | str,
    *,
    tp,
    cp=1,
    pp=1,
    dp=1,
    ep=1,
    etp=None,
    vpp=1,
    micro_batch_size=1,
    num_microbatches=None,
    zero_stage=1,
    sequence_parallel=True,
    recompute="none",
    schedule="1f1b",
    pipeline_layer_split="auto",
    order=DEFAULT_MESH_ORDER,
    forward_s=None,
    backward_s=None,
    tp_comm_overlap=False,
    cp_algorithm=None,
    cp_inner=None,
    axes: tuple[str, ...] | None = None,
) -> dict[str, np.ndarray]:
    """Per-axis bytes and times per step for rows of layouts (numpy columns, scalars broadcast).

    Integer columns: ``tp, cp, pp, dp, ep, etp`` (None: tp, the routed experts' TP degree),
    ``vpp, micro_batch_size, num_microbatches`` (None:
    global batch / (dp · micro_batch_size), as Layout resolves it), ``zero_stage``; boolean
    ``sequence_parallel``; string columns ``recompute`` ("none" / "selective" / "dots" / "full"),
    ``schedule`` (a registry name; zbv and dualpipev run 2 chunks), ``pipeline_layer_split``
    (``recompute`` and ``schedule`` may come as :class:`planner.columns.codes.Labels` of the rows),
    ``cp_algorithm`` (:data:`planner.spec.layout.CP_ALGORITHMS`; None: all-gather),
    ``cp_inner`` (hierarchical CP's inner degree; None or 0: the CP ranks of one scale-up
    domain). Optional float columns ``forward_s``, ``backward_s`` give compute
    per micro-batch on the busiest rank for the overlap rules; without them exposed = raw.
    ``axes``: only these axes' terms are priced (None: all); the others' columns are 0, and
    the links' columns and the contention see only these axes' traffic.

    Returns ``{axis}_bytes_per_step``, ``{axis}_time_s``, ``{axis}_exposed_time_s`` for each
    axis in :data:`AXES` (tp, cp, ep, pp, dp, edp), ``total_time_s``,
    ``total_exposed_time_s``, ``link_contention_s`` (:func:`planner.comm.contention.sharing_delay`
    summed over links; 0 without compute times), ``num_microbatches`` and ``valid``; and two
    dicts {link: column}: ``link_busy_s`` (seconds the rank's link is busy per step, all
    axes) and ``link_busiest_axis_s`` (the axis that keeps it busiest, alone). Rows that cannot be placed
    (more GPUs than the cluster, ep not dividing dp·cp, an illegal layer split, a batch that
    dp · micro_batch_size does not divide) are NaN and
    ``valid`` False; layout rules about the model (heads by tp, …) are the search's filter.
    """
    cluster = as_cluster(cluster)
    order = resolve_order(order)
    rows, flat, key, inv, split_key, ep_paired_rows = keyed_rows(
        job, tp, cp, pp, dp, ep, etp, vpp, micro_batch_size, num_microbatches, zero_stage,
        sequence_parallel, recompute, schedule, pipeline_layer_split, cp_algorithm, cp_inner,
    )  # fmt: skip
    count_rows, inv_keys = len(inv), key["tp"]
    compute = None  # None: every term exposed (also where compute runs the collectives)
    accelerator = load_accelerator(cluster.accelerator)
    if forward_s is not None and backward_s is not None and accelerator.overlaps_communication:
        compute = (
            np.asarray(forward_s, dtype=float),
            np.asarray(backward_s, dtype=float),
        )

    # Everything but the exposure is worked out on one row per distinct combination ("key")
    # and broadcast; only terms whose exposure reads the compute times are split into
    # exposed and hidden per row.
    priced = list(_priced_terms(job, cluster, order, key, split_key, axes))
    if compute is not None:
        compute = tuple(np.broadcast_to(x, rows).reshape(count_rows) for x in compute)
    # Axes whose exposure reads the compute times are summed per row; the others per key.
    per_row = {
        term.axis
        for term, *_ in priced
        if compute is not None and _reads_compute(term, tp_comm_overlap)
    }
    out, exposed_by_axis = {}, {}
    for axis in AXES:
        out[f"{axis}_bytes_per_step"] = np.zeros(len(inv_keys))
        out[f"{axis}_time_s"] = np.zeros(len(inv_keys))
        exposed_by_axis[axis] = np.zeros(count_rows if axis in per_row else len(inv_keys))
    link_exposed: dict[str, dict[str, np.ndarray]] = {}  # link → axis → busy seconds
    link_hidden: dict[str, dict[str, np.ndarray]] = {}
    pooled = sum(raw for term, *_, raw, _ in priced if term.rule == "ep")  # one DualPipe window
    sm_share = ep_overlap_sm_share(accelerator.num_compute_units)
    sizes, factors = _group_sizes(key), {}  # bytes sent per byte, per (op, group)
    with np.errstate(invalid="ignore"):  # inf · 0 in rows that cannot be placed
        for term, count, message, one, bucket, raw, busy in priced:
            group = term.group or ("pp" if term.op == "p2p" else AXIS_GROUPS[term.axis])
            if (term.op, group) not in factors:
                factors[term.op, group] = volume_factor(term.op, sizes[group])
            out[f"{term.axis}_bytes_per_step"] += count * message * factors[term.op, group]
            out[f"{term.axis}_time_s"] += raw
            if term.axis in per_row:  # on the rows that run the term (the others add 0)
                live = np.flatnonzero((count > 0)[inv])
                at = inv[live]
                exposed = exposed_time(
                    term.rule, raw[at], one[at], bucket[at], flat["m"][live], flat["pp"][live],
                    flat["chunks"][live], tuple(x[live] for x in compute), tp_comm_overlap,
                    ep_paired_rows[live], pooled[at] if term.rule == "ep" else None, sm_share,
                )  # fmt: skip
                raw, busy = raw[at], {link: seconds[at] for link, seconds in busy.items()}
            else:
                live = None  # exposed = raw under these rules: as without compute times
                exposed = _exposed_per_key(term, count, one, bucket, raw, key, compute is not None)
            _add(exposed_by_axis, term.axis, live, exposed)
            # Each link's busy time splits as the term's time does: exposed and hidden.
            exposed_share = np.where(raw > 0, np.minimum(exposed / np.where(raw > 0, raw, 1), 1), 1)
            size = count_rows if live is not None else len(inv_keys)
            for link, seconds in busy.items():
                for split_by, share in (
                    (link_exposed, exposed_share),
                    (link_hidden, 1 - exposed_share),
                ):
                    axes = split_by.setdefault(link, {})
                    if term.axis not in axes:
                        axes[term.axis] = np.zeros(size)
                    _add(axes, term.axis, live, seconds * share)
    valid = placeable(cluster, job.model.num_layers, key["tp"], key["cp"], key["pp"], key["dp"],
                      key["ep"], key["chunks"], split_key, key["etp"])[inv] & flat["batch_ok"]  # fmt: skip

    def rowwise(column: np.ndarray, axis: str) -> np.ndarray:
        """A per-key or per-row column of ``axis`` over the rows."""
        return column if axis in per_row else column[inv]

    for axis in AXES:
        out[f"{axis}_bytes_per_step"] = out[f"{axis}_bytes_per_step"][inv]
        out[f"{axis}_time_s"] = out[f"{axis}_time_s"][inv]
        out[f"{axis}_exposed_time_s"] = rowwise(exposed_by_axis[axis], axis)
    for key_name, column in out.items():
        out[key_name] = np.where(valid, column, np.nan)
    out["total_time_s"] = sum(out[f"{axis}_time_s"] for axis in AXES)
    out["total_exposed_time_s"] = sum(out[f"{axis}_exposed_time_s"] for axis in AXES)
    for split_by in (link_exposed, link_hidden):
        for axes in split_by.values():
            for axis in axes:
                axes[axis] = rowwise(axes[axis], axis)
    # Links and axes in one order whatever terms the rows run (sums then add alike whether
    # a row is evaluated alone or with others: the CP algorithms' terms reach links in
    # different orders).
    link_exposed, link_hidden = (
        {link: {a: split_by[link][a] for a in AXES if a in split_by[link]}
         for link in sorted(split_by)}
        for split_by in (link_exposed, link_hidden)
    )  # fmt: skip
    window = flat["m"] * (compute[0] + compute[1]) if compute is not None else np.zeros(count_rows)
    contention = sum(
        (sharing_delay(link_exposed[link], link_hidden[link], window) for link in link_exposed),
        np.zeros(count_rows),
    )
    out["link_contention_s"] = np.where(valid, contention, np.nan)
    out["num_microbatches"] = flat["m"]
    out["valid"] = valid
    out["link_busy_s"], out["link_busiest_axis_s"] = {}, {}
    for link in link_exposed:
        per_axis = [link_exposed[link][a] + link_hidden[link][a] for a in link_exposed[link]]
        out["link_busy_s"][link] = np.where(valid, sum(per_axis), np.nan)
        out["link_busiest_axis_s"][link] = np.where(valid, np.maximum.reduce(per_axis), np.nan)
    return _reshaped(out, rows)
