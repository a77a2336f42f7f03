"""The collectives of the context-parallel algorithms beyond Llama 3's all-gather, and the
groups they run on.

Per layer and micro-batch on the busiest pipeline rank (``layers · m`` layer passes;
forward passes again under full recomputation), with ``kv`` a rank's K and V per token and
``q``, ``o`` its queries and attention output (:mod:`planner.cost.context_parallel`):

* **ring** (Liu et al. 2023 §3; Brandon et al. 2023; TransformerEngine
  ``AttnFuncWithCPAndKVP2P``, torch ``context_parallel``): forward sends cp − 1 K/V blocks of
  ``b·(s/cp)·kv`` bytes to the next rank of the ring; backward visits the blocks in the
  forward's reverse order, ending on the rank's own (diagonal) block, and sends the K/V
  blocks again with the dK, dV accumulated on the ranks each block visits, one step behind
  them: the first step carries the block alone, cp − 2 carry both, and the last the dK, dV
  alone — the sum arriving at the block's owner while it computes its own block
  (TransformerEngine ``AttnFuncWithCPAndKVP2P.backward``: "in reversed order of fwd", the
  dKV-only send at ``i == cp − 1``, waited for after that step's kernel). Each step's
  transfer is launched before the step's kernel and waited for after it, so a step exposes
  ``max(0, transfer − block compute)`` — the block being
  ``1/cp`` of the rank's attention (the zig-zag split balances the causal work) — plus the
  step's own kernels and rescaling (:func:`planner.cost.context_parallel.ring_step_overhead_s`)
  and its share of what the short block kernels lose against one kernel over the whole
  sequence (:func:`planner.cost.context_parallel.ring_block_slowdown`).
  Short sequences (attention ∝ s², the block ∝ s) or fast attention expose the transfer.
* **ulysses** (Jacobs et al. 2023 §3.1; TransformerEngine ``AttnFuncWithCPAndQKVOA2A``): an
  all-to-all of Q, K, V (sequence → heads) before attention and one of the output (heads →
  sequence) after it in forward; backward mirrors them (dO in, dQ, dK, dV out). Attention
  needs the whole sequence of its heads first: exposed. Under ``Job.ulysses_kv_heads =
  "replicate"`` the K/V heads go ``max(cp // kv, 1)`` times over (verl's ``repeat_kv``;
  :func:`planner.cost.context_parallel.ulysses_kv_repeats`).
* **hierarchical** (Megatron-Core ``a2a+p2p``): Ulysses over the ``k`` CP ranks of one
  scale-up domain (:func:`cp_inner_degree`), then a ring over the ``cp/k`` groups of them
  (``cp/k − 1`` steps, each block ``k/cp`` of the rank's attention after the re-shard).

Three groups besides ``cp`` carry them (:func:`placement_group`): ``cp_ring`` (a ring step:
a send between neighbours at the slowest level the CP group crosses), ``cp_inner`` (the
inner all-to-all's k ranks) and ``cp_outer`` (a step of the outer ring).
"""

from __future__ import annotations

import math

import numpy as np

from hwspecs.errors import PlanError
from planner.columns.codes import distinct_rows
from planner.comm.levels import Level
from planner.comm.topology import (
    GroupPlacement,
    Placement,
    _group_fields,
    _group_shape,
    merged_runs,
    mesh_factors,
)
from planner.cost.context_parallel import (
    ALL_GATHER,
    HIERARCHICAL,
    RING,
    ULYSSES,
    kv_block_bytes,
    rank_attention_core_s,
    ring_block_slowdown,
    ring_step_overhead_s,
    ulysses_bytes,
    ulysses_kv_repeats,
)
from planner.spec.layout import CP_ALGORITHMS, cp_algorithm_codes

#: The groups of :func:`placement_group` beyond the placement's own.
CP_GROUPS = ("cp_ring", "cp_inner", "cp_outer")
#: Exposure rules of the terms here (planner.comm.terms.RULES holds their text).
RING_RULE, ALL_TO_ALL_RULE = "cp_ring", "cp_a2a"

__all__ = ["ALL_GATHER", "CP_ALGORITHMS", "CP_GROUPS", "cp_algorithm_codes", "cp_inner_degree",
           "placement_group"]  # fmt: skip


def cp_inner_degree(sizes: dict, order, scale_up_domain_size: int) -> int:
    """CP ranks that share one scale-up domain: hierarchical CP's Ulysses degree.

    The mesh places ``stride`` ranks (the factors inside cp in ``order``) between CP
    neighbours; a domain of ``S`` GPUs then holds ``gcd(cp, S/stride)`` ranks of each CP
    group when ``stride`` divides ``S``, else one (also where the degrees cannot be placed:
    the rule table rejects those rows)."""
    try:
        factors = mesh_factors(sizes, order)
    except PlanError:
        return 1
    cp = int(sizes.get("cp", 1))
    first = next(i for i, (name, _) in enumerate(factors) if name in ("cpe", "cpr"))
    stride = math.prod(size for _, size in factors[:first])
    if stride > scale_up_domain_size or scale_up_domain_size % stride:
        return 1
    return math.gcd(cp, scale_up_domain_size // stride)


def cp_inner_column(placements: list, default: int = 1) -> np.ndarray:
    """:func:`cp_inner_degree` of each placement (``default`` where it is None)."""
    return np.array([default if p is None else _inner_of(p) for p in placements], dtype=np.int64)


def _inner_of(placement: Placement) -> int:
    """:func:`cp_inner_degree` of the placement, worked out once per placement."""
    inner = placement.derived.get("cp_inner")
    if inner is None:
        scale_up = placement.view.cluster.scale_up_domain_size
        inner = placement.derived["cp_inner"] = cp_inner_degree(
            placement.sizes, placement.order, scale_up
        )
    return inner


#: (cluster key, cp group shape, inner degree) → the three groups; bounded like the placements'.
_CP_GROUPS: dict[tuple, dict[str, GroupPlacement]] = {}


def placement_group(placement: Placement, name: str, inner: int | None = None) -> GroupPlacement:
    """The placement's group ``name``: one of its own, or one of :data:`CP_GROUPS` for
    hierarchical CP's inner degree ``inner`` (None: the CP ranks of one scale-up domain)."""
    if name not in CP_GROUPS:
        return placement.groups[name]
    inner = inner or _inner_of(placement)
    derived = placement.derived.get(("cp_groups", inner))
    if derived is not None:
        return derived[name]
    factors = mesh_factors(placement.sizes, placement.order)
    shape = _group_shape(factors, "cp")
    key = (placement.view.cluster.id, placement.view.num_gpus, shape, inner)
    found = _CP_GROUPS.get(key)
    if found is None:
        if len(_CP_GROUPS) >= 4096:
            _CP_GROUPS.clear()
        found = _CP_GROUPS[key] = _cp_groups(placement, shape, inner)
    placement.derived["cp_groups", inner] = found
    return found[name]


def _split_shape(shape, inner: int, part: str) -> tuple:
    """The cp group's mesh shape with its member run split into the inner ``inner`` ranks
    and the rest; members: the inner part (``part == 'inner'``) or the outer one."""
    pieces = []
    for size, member in shape:
        pieces += [(inner, part == "inner"), (size // inner, part == "outer")] if member else [
            (size, False)]  # fmt: skip
    return merged_runs(pieces)


def _slowest_hop(levels: tuple[Level, ...]) -> Level | None:
    """The level a ring's slowest neighbour-to-neighbour send crosses (outermost on ties)."""
    if not levels:
        return None
    return min(reversed(levels), key=lambda level: level.bytes_per_s_per_rank)


def _cp_groups(placement: Placement, shape, inner: int) -> dict[str, GroupPlacement]:
    view, sizes, order = placement.view, placement.sizes, placement.order
    cp_group = placement.groups["cp"]
    groups = {}
    for name, sub_shape, size in (
        ("cp_ring", shape, cp_group.group_size),
        ("cp_inner", _split_shape(shape, inner, "inner"), inner),
        ("cp_outer", _split_shape(shape, inner, "outer"), cp_group.group_size // inner),
    ):
        if name == "cp_ring":
            fields = (cp_group.group_size, cp_group.num_groups, cp_group.example_ranks,
                      cp_group.levels, None)  # fmt: skip
        else:
            fields = _group_fields(view, "cp", sub_shape, sizes, order)
        _, num_groups, example, levels, _ = fields
        hop = _slowest_hop(levels) if name != "cp_inner" else None
        # A ring step is a send between two neighbours (its measured p2p fits are for 2).
        group_size = 2 if name != "cp_inner" and size > 1 else size
        groups[name] = GroupPlacement(name, group_size, num_groups, example, levels, hop)
    return groups


def context_parallel_terms(job, tp, cp, b, m, layers, full, algorithm, inner, rates=None):
    """The terms of ring, Ulysses and hierarchical CP (zero counts on the other rows) as
    :class:`planner.comm.terms.Term` (see the module docstring). ``algorithm``: codes of
    :data:`CP_ALGORITHMS`; ``inner``: hierarchical's inner degree per row; ``rates``: the
    GPU's :class:`planner.cost.compute.GpuRates` (None: no block compute to hide behind)."""
    from planner.comm.terms import Term

    model, s, e = job.model, job.seq_len, job.precision.activation_bytes
    tp, cp, b, algorithm, inner = np.broadcast_arrays(*(np.asarray(x) for x in (
        tp, cp, b, algorithm, inner)))  # fmt: skip
    many = cp > 1
    inner = np.where(algorithm == HIERARCHICAL, np.maximum(inner, 1), 1)
    ring_size = np.where(algorithm == RING, cp, np.where(algorithm == HIERARCHICAL, cp // inner, 1))
    forward_passes = layers * m * (1 + full)
    backward_passes = layers * m
    block = kv_block_bytes(model, s, b, tp, cp, e)
    repeats = ulysses_kv_repeats(model, tp, cp, job.ulysses_kv_heads == "replicate")
    qkv, out = ulysses_bytes(model, s, b, tp, cp, e, np.where(algorithm == ULYSSES, repeats, 1))
    overlap_f, overlap_b, extra_f, extra_b = _ring_step_times(job, tp, cp, b, ring_size, rates)
    terms = []
    for name, algo, group in (("ring", RING, "cp_ring"), ("outer ring", HIERARCHICAL, "cp_outer")):
        steps = np.where(many & (algorithm == algo), ring_size - 1, 0)
        # Backward: the K/V block leaves at steps 0 … cp−2 and the travelling dK, dV at steps
        # 1 … cp−1, so cp−2 steps carry both, the first the block alone and the last the
        # dK, dV alone, beside the rank's own block (the backward's last, TE's order).
        middle, ends = np.maximum(steps - 1, 0), np.where(steps > 0, 1, 0)
        terms += [
            Term("cp", "p2p", f"{name}: K/V block to the next rank, cp−1 steps per layer, fwd",
                 forward_passes * steps, block, RING_RULE, group=group, overlap_s=overlap_f,
                 extra_s=extra_f),
            Term("cp", "p2p", f"{name}: K/V block and the travelling dK, dV, cp−2 steps, bwd",
                 backward_passes * middle, 2 * block, RING_RULE, group=group,
                 overlap_s=overlap_b, extra_s=extra_b),
            Term("cp", "p2p", f"{name}: the first step's K/V block, bwd", backward_passes * ends,
                 block, RING_RULE, group=group, overlap_s=overlap_b, extra_s=extra_b),
            Term("cp", "p2p", f"{name}: the last step's dK, dV to the block's owner, bwd",
                 backward_passes * ends, block, RING_RULE, group=group, overlap_s=overlap_b),
        ]  # fmt: skip
    for name, on, group in (
        ("Ulysses", many & (algorithm == ULYSSES), "cp"),
        ("inner Ulysses", many & (algorithm == HIERARCHICAL) & (inner > 1), "cp_inner"),
    ):
        count = (forward_passes + backward_passes) * np.where(on, 1, 0)
        terms += [
            Term("cp", "all-to-all", f"{name}: Q, K, V sequence → heads fwd, dQ, dK, dV back bwd",
                 count, qkv, ALL_TO_ALL_RULE, group=group),
            Term("cp", "all-to-all", f"{name}: output heads → sequence fwd, dO back bwd",
                 count, out, ALL_TO_ALL_RULE, group=group),
        ]  # fmt: skip
    return terms


def _ring_step_times(job, tp, cp, b, ring_size, rates):
    """Per row: (forward, backward) attention of one ring step's block — the rank's
    attention over the ring's size, at the block's length — and (forward, backward) seconds
    the step adds: its kernels and rescaling and its share of what the blocks' short kernels
    lose (:func:`planner.cost.context_parallel.ring_block_slowdown`); once per distinct (tp,
    cp, b, ring size). Zeros without rates."""
    zeros = np.zeros(tp.shape)
    if rates is None or not tp.size:
        return zeros, zeros, zeros, zeros
    columns = [np.ravel(x) for x in (tp, cp, b, ring_size)]
    chosen, inverse = distinct_rows(*columns)  # integer keys through a table: no sort
    distinct = np.stack([column[chosen] for column in columns], axis=-1)
    model, s, e = job.model, job.seq_len, job.precision.activation_bytes
    table = []
    for t, c, mbs, ring in distinct.tolist():
        if ring <= 1:
            table.append((0.0, 0.0, 0.0, 0.0))
            continue
        forward, backward = rank_attention_core_s(model, s, mbs, t, c, job.flash_attention,
                                                  rates, e)  # fmt: skip
        slow_f, slow_b = ring_block_slowdown(rates, s, ring) if job.flash_attention else (1, 1)
        kernels_f, kernels_b = ring_step_overhead_s(model, s, mbs, t, c, rates, e)
        # The blocks' shortfall against the layer time's whole-sequence kernel, spread over
        # the ring - 1 steps that carry a transfer.
        table.append((forward * slow_f / ring, backward * slow_b / ring,
                      kernels_f + forward * (slow_f - 1) / (ring - 1),
                      kernels_b + backward * (slow_b - 1) / (ring - 1)))  # fmt: skip
    rows = np.asarray(table, dtype=float)[inverse.reshape(-1)]
    return tuple(rows[:, i].reshape(tp.shape) for i in range(4))


def ring_exposed_time(raw, count, one, overlap_s, extra_s):
    """Exposed seconds of ring steps: each step's transfer (``one``) beyond the block
    compute it runs beside (``overlap_s``), plus its own kernels, rescaling and short-block
    loss (``extra_s``): ``count · (max(0, one − overlap) + extra)``, 0 where nothing is sent."""
    exposed = count * (np.maximum(0.0, one - overlap_s) + extra_s)
    return np.where(count > 0, exposed, 0.0) + 0.0 * raw


def ring_step_overlap(job, layout, cluster, order=None) -> dict | None:
    """One ring step of ``layout``'s ring attention — forward, backward (a step carrying the
    block and the travelling dK, dV), the backward's first step (the block alone) and its
    last (the summed dK, dV alone, beside the own block) —: the transfer's seconds, the
    block attention it runs beside, the step's kernels, rescaling and short-block loss, and
    what it exposes
    (the numbers :func:`ring_exposed_time` reads); None without a ring."""
    from planner.comm.collectives import algorithm_costs, choose
    from planner.comm.topology import place_groups
    from planner.cost.compute import GpuRates
    from planner.spec.layout import DEFAULT_MESH_ORDER

    algorithm = CP_ALGORITHMS.index(layout.cp_algorithm)
    if layout.cp <= 1 or algorithm not in (RING, HIERARCHICAL):
        return None
    placement = place_groups(cluster, layout, order or DEFAULT_MESH_ORDER)
    inner = (layout.cp_inner or _inner_of(placement)) if algorithm == HIERARCHICAL else 1
    ring = layout.cp // inner
    if ring <= 1:
        return None
    group = placement_group(placement, "cp_ring" if algorithm == RING else "cp_outer", inner)
    rates = GpuRates.of(placement.view.accelerator, job.precision.gemm_dtype, job.attention_kernel)
    one = np.ones(1, dtype=np.int64)
    times = _ring_step_times(job, one * layout.tp, one * layout.cp, one * layout.micro_batch_size,
                             one * ring, rates)  # fmt: skip
    overlap_f, overlap_b, extra_f, extra_b = (float(x[0]) for x in times)
    block = float(kv_block_bytes(job.model, job.seq_len, layout.micro_batch_size, layout.tp,
                                 layout.cp, job.precision.activation_bytes))  # fmt: skip
    costs = algorithm_costs("p2p", (group.neighbour_level,), group.group_size)
    passes = {}
    for name, sent, overlap, extra in (("forward", block, overlap_f, extra_f),
                                       ("backward", 2 * block, overlap_b, extra_b),
                                       ("backward_first", block, overlap_b, extra_b),
                                       ("backward_last", block, overlap_b, 0.0)):  # fmt: skip
        transfer = choose(costs, sent)[1].time_s(sent)
        passes[name] = {
            "bytes": sent, "transfer_s": transfer, "block_attention_s": overlap,
            "step_overhead_s": extra, "exposed_s": max(0.0, transfer - overlap) + extra,
        }  # fmt: skip
    return {"ring_ranks": ring, "steps": ring - 1, "tier": group.neighbour_level.tier, **passes}
