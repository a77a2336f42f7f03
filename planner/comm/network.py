"""What a set of ranks crosses on a cluster's network, and at which bandwidth per rank.

Devices are numbered so that each network tier's instances hold consecutive ranks (the
GPUs of one NVLink domain, then of one rack, one pod, …; the chips of a TPU torus in
x-fastest order). For the groups of one parallel axis (a 2-D array of ranks, all groups
running at the same time) :func:`group_levels` answers, for every network level the groups
cross: how many instances of the level below one group joins (``participants``), how many
of its members sit in each (``members_below``), how many ranks and concurrent groups push
traffic through that level's uplinks, and the per-rank bandwidth that results:

* scale-up tier: the link's per-GPU rate; a *full mesh* (a GPU has exactly one link to each
  peer of its domain, as AMD xGMI) gives a group only ``participants − 1`` of its links;
* scale-out / DCN tier: NIC port rate × ``nics_per_gpu``, times the tier's *share*: an
  instance of the level below owns ``instance_gpus / oversubscription`` lines of uplink,
  split among every rank (of every group of the axis) whose group leaves that instance:
  ``share = min(1, instance_gpus / (oversubscription · crossing_ranks))``. This is where
  Llama 3's 1:7 above the pods (arXiv 2407.21783 §3.3.1) and rail sharing show;
* torus tier (TPU): one level per torus axis the group spans; a hop is one ICI link
  (per-link rate, divided by the group's stride along the axis because interleaved groups
  share the links); a group that covers a whole axis with wraparound runs two
  counter-rotating rings (jax-ml/scaling-book, "sharded matrices": bidirectional ICI).

Group answers use integer arithmetic on rank numbers (no graph search) so the search can
cost thousands of layouts; :func:`planner.comm.graph.cluster_graph` draws the same structure.
:func:`mesh_levels` gives the same answer for the groups of a mesh axis from the mesh's
shape, keeping for each tier only the part of the mesh that tier can tell apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from hwspecs.schema import ClusterTier, LinkTier
from planner.comm.levels import (
    SCALE_OUT_KINDS,
    TORUS_AXIS_NAMES,
    ClusterView,
    Level,
)

# ----- what one set of groups crosses --------------------------------------------------


def _distinct_per_row(values: np.ndarray) -> np.ndarray:
    """Number of distinct values in each row of an integer array."""
    ordered = np.sort(values, axis=1)
    return 1 + (np.diff(ordered, axis=1) != 0).sum(axis=1)


def link_rate(view: ClusterView, link: LinkTier) -> float:
    """Per-rank line rate of a link: per GPU for scale-up, NIC port × NICs per GPU otherwise."""
    if link.kind in SCALE_OUT_KINDS:
        return link.bytes_per_s_per_direction * view.accelerator.nics_per_gpu
    return link.bytes_per_s_per_direction


def per_link_rate(link: LinkTier) -> float:
    """One link's rate per direction: the catalog's, else the per-GPU rate over its links."""
    if link.bytes_per_s_per_direction_per_link:
        return link.bytes_per_s_per_direction_per_link
    return link.bytes_per_s_per_direction / (link.links_per_gpu or 1)


def is_full_mesh(tier: ClusterTier, link: LinkTier) -> bool:
    """A switchless scale-up domain: every GPU has exactly one link to each of its peers."""
    return link.kind == "scale-up" and link.links_per_gpu == tier.group_size - 1 > 0


def group_levels(view: ClusterView, groups: np.ndarray) -> tuple[Level, ...]:
    """The levels crossed by ``groups`` (all groups of one axis, run concurrently), innermost first.

    Only each row's set of ranks matters. Rows are sorted once, so that a row's instances at
    every level come in runs: distinct counts and per-instance member counts are run
    lengths, with no sort or ``np.unique`` per level.
    """
    groups = np.asarray(groups, dtype=np.int64)
    if groups.shape[1] == 1 or not len(groups):
        return ()
    change = groups[:, 1:] != groups[:, :-1]
    if (groups[:, 1:] < groups[:, :-1]).any():
        groups = np.sort(groups, axis=1)
        change = groups[:, 1:] != groups[:, :-1]
    levels: list[Level] = []
    below, below_change, touched_below = groups, change, 1 + change.sum(axis=1)
    for index, tier in enumerate(view.tiers):
        if index and touched_below.max() == 1:
            break  # every group sits inside one instance: no level above is crossed
        link = view.links[tier.link]
        inst = groups // tier.group_size
        change = inst[:, 1:] != inst[:, :-1]
        touched = 1 + change.sum(axis=1)
        if view.is_torus_tier(index):
            levels.extend(
                _torus_levels(
                    view, _members_in_first_instance(groups, inst) % tier.group_size, tier, link
                )
            )
        else:
            level = _tier_level(view, index, below, below_change, touched_below, touched)
            if level is not None:
                levels.append(level)
        below, below_change, touched_below = inst, change, touched
    return tuple(levels)


def mesh_levels(
    view: ClusterView, factors: Sequence[tuple[int, bool]], tier_levels: dict | None = None
) -> tuple[Level, ...]:
    """:func:`group_levels` of a mesh axis's groups, from the mesh's shape alone.

    ``factors``: the mesh's factors innermost first as (size, whether the axis varies it); rank
    = Σ digit · stride, the groups fix the other digits. Each tier only needs the mesh between
    two strides: factors inside the largest stride that divides both its instance size and
    the one below (whole cells that never straddle an instance: they scale counts) and
    factors outside the smallest stride that both divide (whole blocks of instances that
    repeat the same pattern). Equal to ``group_levels(view, groups)`` on the groups' ranks,
    which a cluster with a torus tier still builds and hands to :func:`group_levels`.
    ``tier_levels``: a tier's level by the part of the mesh it reads (kept by the caller
    for one cluster view): meshes of other layouts often read the same part.
    """
    dims = [(prime, member) for size, member in factors for prime in _prime_factors(size)]
    if not any(member for _, member in dims):
        return ()
    if view.torus_shape is not None:
        return group_levels(view, _mesh_groups(dims))
    strides = [1]
    for size, _ in dims:
        strides.append(strides[-1] * size)
    levels: list[Level] = []
    below_size = 1
    for index, tier in enumerate(view.tiers):
        level = _mesh_tier_level(view, index, dims, strides, below_size, tier_levels)
        if level is not None:
            levels.append(level)
        below_size = tier.group_size
    return tuple(levels)


def _mesh_tier_level(view, index, dims, strides, below_size, known=None) -> Level | None:
    """Tier ``index``'s level for the mesh ``dims`` (prime factors, innermost first); ``known``:
    levels found, by what they read (the tier, the factors between the two strides, the cell
    and the three weights), and counts (:func:`_tier_counts`), by all that but the member and
    group weights, which only scale them."""
    size = view.tiers[index].group_size
    inner_size, outer_size = math.gcd(below_size, size), math.lcm(below_size, size)
    lo = max(k for k, stride in enumerate(strides) if inner_size % stride == 0)
    hi = next((k for k, stride in enumerate(strides) if stride % outer_size == 0), len(dims))
    if not any(member for _, member in dims[lo:hi]):
        return None  # inside a block each group is one cell: it joins no instances here
    member_weight = math.prod(n for n, member in dims[:lo] if member)
    group_weight = math.prod(n for n, member in dims[:lo] if not member)
    repeats = math.prod(n for n, member in dims[hi:] if member)
    cell = strides[lo]
    key = (index, tuple(dims[lo:hi]), cell, member_weight, group_weight, repeats)
    if known is not None and key in known:
        return known[key]
    counts_key = ("counts", *key[:3], repeats)
    counts = known.get(counts_key, False) if known is not None else False
    if counts is False:
        counts = _block_counts(view, index, dims[lo:hi], cell, below_size, repeats)
        if known is not None:
            known[counts_key] = counts
    level = _weighted_level(view, index, counts, member_weight, group_weight)
    if known is not None:
        known[key] = level
    return level


def _block_counts(view, index, block, cell, below_size, repeats) -> TierCounts | None:
    """Tier ``index``'s counts for the mesh between its two strides (:func:`_mesh_tier_level`)."""
    size = view.tiers[index].group_size
    groups = _mesh_groups(block)
    below, inst = groups // (below_size // cell), groups // (size // cell)
    below_change, change = below[:, 1:] != below[:, :-1], inst[:, 1:] != inst[:, :-1]
    touched_below = repeats * (1 + below_change.sum(axis=1))
    touched = repeats * (1 + change.sum(axis=1))
    return _tier_counts(view, index, below, below_change, touched_below, touched)


def _prime_factors(n: int) -> list[int]:
    primes, p = [], 2
    while p * p <= n:
        while n % p == 0:
            primes.append(p)
            n //= p
        p += 1
    return primes + ([n] if n > 1 else [])


def _mesh_groups(dims: Sequence[tuple[int, bool]]) -> np.ndarray:
    """The groups of a mesh (factors innermost first, as (size, member)), rows ascending."""
    merged: list[list] = []
    for size, member in dims:
        if merged and merged[-1][1] == member:
            merged[-1][0] *= size
        else:
            merged.append([size, member])
    sizes = [size for size, _ in merged]
    grid = np.arange(math.prod(sizes), dtype=np.int64).reshape(sizes[::-1] or [1])
    last = len(sizes) - 1
    members = sorted(last - i for i, (_, member) in enumerate(merged) if member)
    others = [axis for axis in range(grid.ndim) if axis not in members]
    width = math.prod(grid.shape[axis] for axis in members)
    return grid.transpose(others + members).reshape(-1, width)


def _run_lengths(first: np.ndarray, total: int) -> np.ndarray:
    """Lengths of the runs starting at ``first`` (ascending, from 0) among ``total`` items:
    ``np.diff(first, append=total)`` without its concatenation (hundreds of small calls)."""
    lengths = np.empty_like(first)
    lengths[:-1] = first[1:] - first[:-1]
    lengths[-1:] = total - first[-1:]
    return lengths


class TierCounts(NamedTuple):
    """A tier's counts of its groups, each member one rank (:func:`_weighted_level`)."""

    participants: int
    members_below: int
    steps: int
    crossing_ranks: int
    concurrent_groups: int


def _tier_level(view, index, below, below_change, touched_below, touched) -> Level | None:
    """Tier ``index``'s level (:func:`_tier_counts`), each member one rank."""
    counts = _tier_counts(view, index, below, below_change, touched_below, touched)
    return _weighted_level(view, index, counts)


def _tier_counts(view, index, below, below_change, touched_below, touched) -> TierCounts | None:
    """Tier ``index``'s counts, or None when no group joins instances of the level below.

    ``below``: each group's (sorted) instances of the level below; ``touched_below`` and
    ``touched``: how many instances below and of this tier each group touches.
    """
    active = touched_below > touched
    if not active.any():
        return None
    below_size = view.tiers[index - 1].group_size if index else 1
    num_groups, size = below.shape
    # runs of equal (row, instance below): the members of a group in one instance below
    starts = np.empty((num_groups, size), dtype=bool)
    starts[:, 0] = True
    starts[:, 1:] = below_change
    first = np.flatnonzero(starts)
    counts = _run_lengths(first, below.size)
    key_rows, key_below = first // size, below.ravel()[first]
    # runs of equal (row, instance of this tier) among those: instances below joined
    key_inst = key_below // (view.tiers[index].group_size // below_size)
    new = np.empty(len(first), dtype=bool)
    new[0] = True
    new[1:] = (key_rows[1:] != key_rows[:-1]) | (key_inst[1:] != key_inst[:-1])
    crossing_keys = (touched_below > 1)[key_rows]
    crossing_ranks = np.bincount(key_below[crossing_keys], weights=counts[crossing_keys])
    return TierCounts(
        participants=int(_run_lengths(np.flatnonzero(new), len(first)).max()),
        members_below=int(counts[active[key_rows]].min()),
        steps=int((touched_below - touched)[active].max()),
        crossing_ranks=int(crossing_ranks.max()),
        concurrent_groups=int(np.bincount(key_below[crossing_keys]).max()),
    )


def _weighted_level(
    view, index, counts: TierCounts | None, member_weight: int = 1, group_weight: int = 1
) -> Level | None:
    """Tier ``index``'s level from its counts, each member standing for ``member_weight``
    ranks and each group for ``group_weight`` groups (whole numbers: exact products)."""
    if counts is None:
        return None
    tier = view.tiers[index]
    link = view.links[tier.link]
    below_size = view.tiers[index - 1].group_size if index else 1
    worst_crossing = counts.crossing_ranks * member_weight * group_weight
    share = 1.0
    if tier.oversubscription > 1:
        share = min(1.0, below_size / (tier.oversubscription * worst_crossing))
    rate = link_rate(view, link)
    if is_full_mesh(tier, link):
        rate = min(rate, per_link_rate(link) * (counts.participants - 1))
    return Level(
        tier=tier.name,
        tier_index=index,
        link=link.id,
        kind=link.kind,
        participants=counts.participants,
        members_below=counts.members_below * member_weight,
        steps=counts.steps,
        bytes_per_s_per_rank=rate * share,
        latency_s=link.latency_s,
        busbw_efficiency=dict(link.busbw_efficiency),
        in_network_reduction=link.in_network_reduction,
        bidirectional=False,
        oversubscription=tier.oversubscription,
        share=share,
        crossing_ranks=worst_crossing,
        concurrent_groups=counts.concurrent_groups * group_weight,
        collective_fits=tuple(link.collective_fits),
    )


def _members_in_first_instance(groups: np.ndarray, inst: np.ndarray) -> np.ndarray:
    """Each group's members inside the instance of its first member (rows of equal count)."""
    inside = inst == inst[:, :1]
    counts = inside.sum(axis=1)
    rows = counts == counts[0]
    return groups[rows][inside[rows]].reshape(int(rows.sum()), int(counts[0]))


def _torus_levels(view: ClusterView, local: np.ndarray, tier, link) -> list[Level]:
    """One level per torus axis along which the group's members differ (x fastest)."""
    shape = view.torus_shape
    size = local.shape[1]
    coords, rest = [], local
    for extent in shape:
        coords.append(rest % extent)
        rest = rest // extent
    counts = [int(_distinct_per_row(c).max()) for c in coords]
    common = {
        "tier_index": 0,
        "link": link.id,
        "kind": "torus",
        "latency_s": link.latency_s,
        "busbw_efficiency": dict(link.busbw_efficiency),
        "in_network_reduction": False,
        "oversubscription": 1.0,
        "share": 1.0,
        "crossing_ranks": 0,
        "concurrent_groups": 1,
    }
    if math.prod(counts) != size:  # not a sub-grid: a snake ring over single links
        return [
            Level(
                tier=tier.name,
                participants=size,
                members_below=1,
                steps=size - 1,
                bytes_per_s_per_rank=per_link_rate(link),
                bidirectional=False,
                **common,
            )
        ]
    levels, below = [], 1
    for axis, (extent, count, values) in enumerate(zip(shape, counts, coords, strict=True)):
        if count == 1:
            continue
        ordered = np.unique(values[0])
        stride = int(np.diff(ordered).min())
        whole = count * stride == extent and ordered[-1] - ordered[0] == (count - 1) * stride
        levels.append(
            Level(
                tier=f"{tier.name}-{TORUS_AXIS_NAMES[axis]}",
                participants=count,
                members_below=below,
                steps=size // below - size // (below * count),
                bytes_per_s_per_rank=per_link_rate(link) / stride,
                bidirectional=bool(whole and view.cluster.torus_wraparound),
                stride=stride,
                **common,
            )
        )
        below *= count
    return levels
