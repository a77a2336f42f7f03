"""The context-parallel algorithm as an axis of the search: each degree row once per
algorithm where cp > 1 (:func:`with_cp_algorithm`), hierarchical CP's inner degree on the
cluster (:func:`cp_inner_column`), and the algorithms the search need not time, those another
algorithm beats on the same layout (:func:`dominated_cp_rows`).

On one set of degrees and micro-batch size the CP algorithm changes only the CP collectives
(their exposed time per layer pass, forward and backward) and the K/V buffers
(:func:`planner.cost.context_parallel.cp_buffer_bytes`); the schedule, micro-batch count,
ZeRO stage and recomputation scale every algorithm's passes alike. So an algorithm whose
exposed CP time is no smaller, with and without full recomputation, and whose buffers are no
smaller than another's that the rules keep is dominated there: its rows would be no faster
and need no less memory. Ties keep the first algorithm of the search space. What this leaves
out: the time lost where CP shares a link with another axis (``link_contention``), which
the algorithms' different link use can change a little.

The probe is one call of :func:`planner.comm.traffic.axis_times_vectorized` on one row per
distinct (degrees, micro-batch size, algorithm), once without and once with full
recomputation (the two on threads, as the search's blocks: :mod:`planner.evaluate.blocks`).
"""

from __future__ import annotations

import numpy as np

from hwspecs.schema import Cluster
from planner.columns.codes import Labels, distinct_rows
from planner.comm.context_parallel import cp_inner_degree
from planner.comm.traffic import axis_times_vectorized
from planner.cost.context_parallel import cp_buffer_bytes
from planner.spec.layout import DEFAULT_MESH_ORDER, cp_algorithm_codes

#: Why rows whose CP algorithm another beats on the same layout are not timed.
CP_DOMINATED = (
    "CP algorithm beaten on the same layout by another (exposed CP time and K/V buffers no smaller)"
)
#: The degree and batch columns a probe row is made of.
PROBE_FIELDS = ("tp", "cp", "pp", "dp", "ep", "etp", "micro_batch_size")


def with_cp_algorithm(degrees: tuple, names: list[str]) -> tuple[tuple, np.ndarray]:
    """The degree rows with their CP algorithm (index into ``names``): each one where cp > 1,
    the first where cp = 1 (no CP: the algorithm means nothing)."""
    c = degrees[1]
    choices = np.broadcast_to(np.arange(len(names)), (len(c), len(names)))
    keep = np.ones(choices.shape, dtype=bool)
    keep[:, 1:] = (c > 1)[:, None]
    row = np.broadcast_to(np.arange(len(c))[:, None], choices.shape)[keep]
    return tuple(column[row] for column in degrees), choices[keep]


def hierarchical_inner_degrees(
    cluster: Cluster, order, degrees: tuple, hierarchical: np.ndarray
) -> np.ndarray:
    """Hierarchical CP's inner degree of the rows that run it (1 elsewhere): the CP ranks of
    one scale-up domain (:func:`planner.comm.context_parallel.cp_inner_degree`), once per
    distinct degrees."""
    inner = np.ones(len(degrees[0]), dtype=np.int64)
    rows = np.flatnonzero(hierarchical)
    if not len(rows):
        return inner
    stacked = np.stack([column[rows] for column in degrees], axis=-1)
    distinct, inverse = np.unique(stacked, axis=0, return_inverse=True)
    names = ("tp", "cp", "pp", "dp", "ep", "etp")
    found = [
        cp_inner_degree(dict(zip(names, values, strict=True)), order or DEFAULT_MESH_ORDER,
                        cluster.scale_up_domain_size)
        for values in distinct.tolist()
    ]  # fmt: skip
    inner[rows] = np.asarray(found, dtype=np.int64)[inverse.reshape(-1)]
    return inner


#: How the search counts hierarchical CP of one level (:func:`degenerate_hierarchy`).
DEGENERATE_HIERARCHY = ("hierarchical CP within one scale-up domain or one rank per domain "
                        "(listed once, as ulysses or ring)")  # fmt: skip


def degenerate_hierarchy(columns: dict) -> np.ndarray:
    """Rows of hierarchical CP with one level: all CP ranks in one scale-up domain (it is
    Ulysses) or one per domain (it is the ring); the search lists those once."""
    inner = columns.get("cp_inner", np.ones_like(columns["cp"]))
    return Labels.of(columns["cp_algorithm"]).isin(("hierarchical",)) & (
        (inner <= 1) | (inner >= columns["cp"])
    )


def dominated_cp_rows(job, cluster, order, columns: dict, alive: np.ndarray) -> np.ndarray:
    """Rows of the screening grid (``columns``; ``alive``: the rows the rules keep) whose CP
    algorithm another kept algorithm beats on the same degrees and micro-batch size."""
    if "cp_algorithm" not in columns:
        return np.zeros(len(alive), dtype=bool)
    labels = Labels.of(columns["cp_algorithm"])
    codes = cp_algorithm_codes(labels, alive.shape)
    rows = np.flatnonzero(alive & (columns["cp"] > 1))
    if not len(rows) or len(labels.present) < 2:
        return np.zeros(len(alive), dtype=bool)
    degrees = [np.asarray(columns[k])[rows] for k in PROBE_FIELDS]
    group_rows, group_of = distinct_rows(*degrees)
    # hierarchical CP at each inner degree is a variant of its own (planner.cp_inner)
    inner = np.where(codes[rows] == 3, np.asarray(columns.get("cp_inner", 0) + 0 * columns["cp"])
                     [rows], 0)  # fmt: skip
    probe_rows, probe_of = distinct_rows(group_of, codes[rows], inner)
    probe = {k: column[probe_rows] for k, column in zip(PROBE_FIELDS, degrees, strict=True)}
    algorithm, probe["cp_inner"] = codes[rows][probe_rows], inner[probe_rows]
    variants, variant = np.unique(np.stack([algorithm, probe["cp_inner"]], axis=-1), axis=0,
                                  return_inverse=True)  # fmt: skip
    variant = variant.reshape(-1)
    cost = list(_exposed_cp_s(job, cluster, order, probe, algorithm, ("none", "full")))
    cost.append(cp_buffer_bytes(job.model, job.seq_len, probe["micro_batch_size"], probe["tp"],
                                probe["cp"], algorithm, job.precision.activation_bytes,
                                job.ulysses_kv_heads == "replicate"))  # fmt: skip
    # [group, variant] tables of each cost (inf where the rules keep no such row).
    num_groups, num_variants = len(group_rows), len(variants)
    group = group_of[probe_rows]
    tables = []
    for values in cost:
        table = np.full((num_groups, num_variants), np.inf)
        table[group, variant] = np.nan_to_num(np.asarray(values, dtype=float), nan=np.inf)
        tables.append(table)
    order_of = {code: i for i, code in enumerate(cp_algorithm_codes(np.array(labels.values),
                                                                    (len(labels.values),)))}  # fmt: skip
    rank = [order_of.get(int(code), len(order_of)) for code in variants[:, 0]]
    beaten = np.zeros((num_groups, num_variants), dtype=bool)
    for a in range(num_variants):
        for b in range(num_variants):
            if a == b:
                continue
            no_worse = np.all([t[:, b] <= t[:, a] for t in tables], axis=0)
            better = np.any([t[:, b] < t[:, a] for t in tables], axis=0)
            first = rank[b] < rank[a]
            kept = np.isfinite(tables[0][:, b])
            beaten[:, a] |= kept & no_worse & (better | first)
    out = np.zeros(len(alive), dtype=bool)
    out[rows] = beaten[group[probe_of], variant[probe_of]]
    return out


def _exposed_cp_s(
    job, cluster, order, probe: dict, algorithm, recompute: tuple[str, ...]
) -> np.ndarray:
    """Exposed CP seconds of one micro-batch per probe row under each policy of
    ``recompute`` ([policy, probe row]; compute given: the ring's overlap applies; NaN where a
    row cannot be placed), in one call: the policies share the probe rows' placements."""
    count, policies = len(algorithm), len(recompute)
    ones = np.ones(count * policies)
    out = axis_times_vectorized(
        job, cluster, **{k: np.tile(probe[k], policies) for k in ("tp", "cp", "pp", "dp", "ep",
                                                                  "etp", "micro_batch_size")},
        num_microbatches=1, zero_stage=0,
        recompute=Labels(np.repeat(np.arange(policies, dtype=np.int8), count), recompute),
        schedule="1f1b", order=order or ("tp", "cp", "ep", "pp", "dp"), forward_s=ones,
        backward_s=ones, cp_algorithm=np.tile(algorithm, policies),
        cp_inner=None if probe.get("cp_inner") is None else np.tile(probe["cp_inner"], policies),
        axes=("cp",),
    )  # fmt: skip
    return out["cp_exposed_time_s"].reshape(policies, count)
