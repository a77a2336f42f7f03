"""Rank placement: which ranks form each parallel group, and which links each group crosses.

Ranks are laid out on a mesh whose axes are taken in a *mesh order*, innermost first
(default ``tp, cp, ep, pp, dp``; Llama 3 used [TP, CP, PP, DP], arXiv 2407.21783 §3.3.2),
and rank ``r`` runs on device ``r`` of the cluster (see :mod:`planner.comm.network` for the
numbering and the bandwidth model). Expert parallelism is carved out of the ``cp·dp``
ranks: its ``gcd(ep, cp)`` inner part shares the CP factor and the rest (``ep / gcd``) is a
mesh factor of its own at the place ``ep`` takes in the order (just inside dp when the
order leaves ``ep`` out). With expert tensor parallelism ``etp = 1 < tp`` (Megatron-Core's
MoE parallel folding) the tp axis splits into ``tpt`` (etp, inner) and ``tpe`` (tp/etp): the
EP group is ``tpe`` × the ``ep/(tp/etp)`` ranks carved out of cp·dp as above. Besides the
mesh axes, two derived groups carry gradients: ``dp_cp`` (dense weights are replicated over
dp·cp; ZeRO shards over it) and ``edp`` (expert weights, dp·cp·(tp/etp)/ep). Placements
are cached per (cluster, gpus, order, sizes), and each group's answer per the shape of the
mesh it sees (so axes of different layouts with the same groups share it), so the search
can evaluate many layouts cheaply.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel

from hwspecs.errors import PlanError
from hwspecs.schema import Cluster
from planner.comm.levels import ClusterView, Level, cluster_view
from planner.comm.mesh import (
    GROUP_AXES,
    GROUP_FACTORS,
    MESH_AXES,
    axis_groups,
    degrees,
    group_size,
    mesh_factors,
    resolve_order,
)
from planner.comm.network import mesh_levels
from planner.comm.point_to_point import pair_level
from planner.spec.layout import (
    DEFAULT_MESH_ORDER,
    Layout,
)

# ----- placements ----------------------------------------------------------------------


@dataclass(frozen=True)
class GroupPlacement:
    """All groups of one axis: their size, an example, and the levels they cross."""

    axis: str
    group_size: int
    num_groups: int
    example_ranks: tuple[int, ...]
    levels: tuple[Level, ...]
    neighbour_level: Level | None  # slowest level of stage-to-stage sends (pp only)


@dataclass(frozen=True)
class Placement:
    view: ClusterView
    order: tuple[str, ...]
    sizes: dict[str, int]
    groups: dict[str, GroupPlacement]
    #: What is worked out from this placement once, by name (the CP groups and inner degree
    #: of :mod:`planner.comm.context_parallel`): placements are cached, so each is derived once.
    derived: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)


_PLACEMENTS: dict[tuple, Placement] = {}
_PLACEMENT_CACHE_SIZE = 4096
#: Per cluster view (its ``cluster_key``): each tier's level by the part of a mesh it reads
#: (:func:`planner.comm.network.mesh_levels`), shared by the layouts that read the same part.
_TIER_LEVELS: dict[tuple, dict] = {}


def cluster_key(cluster: Cluster, gpus: int) -> tuple:
    """A cache key for a cluster's contents (two files may share an id)."""
    return (cluster.id, hash(cluster.model_dump_json()), gpus)


def place_groups(
    cluster: Cluster | str,
    layout: Layout | dict,
    order=DEFAULT_MESH_ORDER,
    gpus: int | None = None,
) -> Placement:
    """Place ``layout`` on the first tp·cp·pp·dp devices of ``cluster`` (cached).

    ``gpus``, when given, must equal tp·cp·pp·dp (the CLI's ``--gpus``). A dict without
    ``dp`` gets the dp that fills ``gpus`` (or the whole cluster).
    """
    sizes = degrees(layout)
    order = resolve_order(order)
    view = cluster_view(cluster, None)
    if gpus is not None:
        cluster_view(view.cluster, gpus)  # checks that the cluster has that many
    if isinstance(layout, dict) and "dp" not in layout:
        total, inner = gpus or view.num_gpus, sizes["tp"] * sizes["cp"] * sizes["pp"]
        if total % inner:
            raise PlanError(f"tp·cp·pp = {inner} does not tile {total} GPUs; pick sizes whose "
                            f"product divides {total}")  # fmt: skip
        sizes["dp"] = total // inner
    num_gpus = sizes["tp"] * sizes["cp"] * sizes["pp"] * sizes["dp"]
    if gpus is not None and gpus != num_gpus:
        raise PlanError(f"tp·cp·pp·dp = {num_gpus} but gpus is {gpus}; they must be equal")
    if num_gpus > view.num_gpus:
        raise PlanError(
            f"the layout needs tp·cp·pp·dp = {num_gpus} GPUs; cluster '{view.cluster.id}' "
            f"has {view.num_gpus}"
        )
    return placement_for_view(cluster_view(view.cluster, num_gpus), order, sizes)


def placement_for_view(
    view: ClusterView, order: tuple[str, ...], sizes: dict, view_key: tuple | None = None
) -> Placement:
    """The cached placement of ``sizes`` on ``view`` (whose num_gpus is tp·cp·pp·dp);
    ``view_key``: ``cluster_key(view.cluster, view.num_gpus)``, when the caller has it."""
    view_key = view_key or cluster_key(view.cluster, view.num_gpus)
    key = (view_key, order, tuple(sorted(sizes.items())))
    found = _PLACEMENTS.get(key)
    if found is not None:
        return found
    factors = mesh_factors(sizes, order)  # validates ep against dp·cp
    groups = {}
    for axis in GROUP_AXES:
        shape = _group_shape(factors, axis)
        group_key = (view_key, axis == "pp", shape)
        fields = _GROUP_FIELDS.get(group_key)
        if fields is None:
            fields = _group_fields(view, axis, shape, sizes, order, view_key)
            if len(_GROUP_FIELDS) >= _PLACEMENT_CACHE_SIZE:
                _GROUP_FIELDS.clear()
            _GROUP_FIELDS[group_key] = fields
        groups[axis] = GroupPlacement(axis, *fields)
    if len(_PLACEMENTS) >= _PLACEMENT_CACHE_SIZE:
        _PLACEMENTS.clear()
    placement = Placement(view, order, dict(sizes), groups)
    _PLACEMENTS[key] = placement
    return placement


#: GroupPlacement fields but the axis, per (cluster key, pp?, group shape): axes of different
#: layouts whose groups have the same shape share them.
_GROUP_FIELDS: dict[tuple, tuple] = {}


def _group_shape(factors: list[tuple[str, int]], axis: str) -> tuple[tuple[int, bool], ...]:
    """The mesh as ``axis`` sees it: (size, in the group) innermost first, runs merged.

    Two meshes with the same shape have the same groups (neighbouring factors that are both
    in, or both out of, the group act as one factor of their product).
    """
    return merged_runs((size, name in GROUP_FACTORS[axis]) for name, size in factors)


def merged_runs(pieces) -> tuple[tuple[int, bool], ...]:
    """(size, in the group) pieces, innermost first, as a mesh shape: pieces of size 1
    dropped, neighbours both in (or both out of) the group merged into their product."""
    shape: list[tuple[int, bool]] = []
    for size, member in pieces:
        if size == 1:
            continue
        if shape and shape[-1][1] == member:
            shape[-1] = (shape[-1][0] * size, member)
        else:
            shape.append((size, member))
    return tuple(shape)


def _group_fields(
    view: ClusterView, axis: str, shape, sizes: dict, order, view_key: tuple | None = None
) -> tuple:
    """group_size, num_groups, example_ranks, levels, neighbour_level of ``axis``'s groups
    (``view_key``: the view's ``cluster_key``, to share tier levels with other layouts)."""
    size = math.prod(n for n, member in shape if member)
    example, stride = np.zeros(1, dtype=np.int64), 1  # the group of rank 0, ascending
    for n, member in shape:
        if member:
            example = (np.arange(n, dtype=np.int64)[:, None] * stride + example).ravel()
        stride *= n
    neighbour = None
    if axis == "pp" and size > 1:
        ranks = axis_groups(axis, sizes, order)
        neighbour = pair_level(view, ranks[:, :-1].ravel(), ranks[:, 1:].ravel())
    if len(_TIER_LEVELS) >= _PLACEMENT_CACHE_SIZE:
        _TIER_LEVELS.clear()
    known = None if view_key is None else _TIER_LEVELS.setdefault(view_key, {})
    levels = mesh_levels(view, shape, known)
    num_groups = math.prod(n for n, _ in shape) // size
    return size, num_groups, tuple(example.tolist()), levels, neighbour


# ----- the report ----------------------------------------------------------------------


class LevelReport(BaseModel):
    """One network level a group crosses."""

    tier: str
    link: str
    kind: str
    participants: int
    members_per_instance_below: int
    crossing_ranks_per_instance: int
    concurrent_groups: int
    oversubscription: float
    share: float
    bytes_per_s_per_rank: float
    bidirectional: bool
    latency_s: float

    @classmethod
    def of(cls, level: Level) -> LevelReport:
        fields = dataclasses.asdict(level)
        fields["members_per_instance_below"] = fields.pop("members_below")
        fields["crossing_ranks_per_instance"] = fields.pop("crossing_ranks")
        return cls.model_validate({k: v for k, v in fields.items() if k in cls.model_fields})


class AxisPlacement(BaseModel):
    """Where the groups of one axis sit and what they cross."""

    axis: str
    group_size: int
    num_groups: int
    example_ranks: list[int]
    tiers: list[str]
    tier: str
    bottleneck_tier: str
    bottleneck_bytes_per_s_per_rank: float
    levels: list[LevelReport]
    neighbour_level: LevelReport | None = None


class TierReport(BaseModel):
    name: str
    link: str
    kind: str
    group_size: int
    instances: int
    oversubscription: float
    bytes_per_s_per_direction: float


class TopologyReport(BaseModel):
    """Rank placement of one layout on one cluster."""

    cluster: str
    num_gpus: int
    order: list[str]
    sizes: dict[str, int]
    torus_shape: list[int] | None
    tiers: list[TierReport]
    axes: list[AxisPlacement]
    notes: list[str]


def bottleneck(levels: tuple[Level, ...]) -> Level | None:
    """The level with the lowest bus-bandwidth ceiling per rank (outermost on ties)."""
    if not levels:
        return None
    return min(reversed(levels), key=lambda level: level.group_bytes_per_s)


def axis_report(group: GroupPlacement) -> AxisPlacement:
    levels = group.levels
    if group.axis == "pp" and group.neighbour_level is not None:
        levels = (group.neighbour_level,)
    slowest = bottleneck(levels)
    tiers = list(
        dict.fromkeys(
            level.tier.split("-")[0] if level.kind == "torus" else level.tier for level in levels
        )
    )
    return AxisPlacement(
        axis=group.axis,
        group_size=group.group_size,
        num_groups=group.num_groups,
        example_ranks=list(group.example_ranks),
        tiers=tiers,
        tier=tiers[-1] if tiers else "local",
        bottleneck_tier=slowest.tier if slowest else "local",
        bottleneck_bytes_per_s_per_rank=slowest.group_bytes_per_s if slowest else 0.0,
        levels=[LevelReport.of(level) for level in group.levels],
        neighbour_level=LevelReport.of(group.neighbour_level) if group.neighbour_level else None,
    )


def topology_report(
    cluster: Cluster | str,
    layout: Layout | dict,
    order=DEFAULT_MESH_ORDER,
    gpus: int | None = None,
) -> TopologyReport:
    """Which ranks form each group, which tiers they cross, at which bandwidth per rank.

    Lists the five mesh axes, plus ``dp_cp`` when cp > 1 and ``edp`` when ep > 1.
    ``bottleneck_bytes_per_s_per_rank`` is the bus-bandwidth ceiling of the slowest level:
    members of the group per instance below × per-rank link rate after sharing (× 2 for a
    bidirectional torus ring), before the collective algorithm's efficiency.
    """
    placement = place_groups(cluster, layout, order, gpus)
    view, sizes = placement.view, placement.sizes
    shown = list(MESH_AXES)
    if sizes["cp"] > 1 and sizes["dp"] > 1:
        shown.append("dp_cp")
    if sizes["ep"] > 1 and group_size("edp", sizes) > 1:
        shown.append("edp")
    tiers = [
        TierReport(
            name=tier.name,
            link=tier.link,
            kind=view.links[tier.link].kind,
            group_size=tier.group_size,
            instances=-(-view.num_gpus // tier.group_size),
            oversubscription=tier.oversubscription,
            bytes_per_s_per_direction=view.links[tier.link].bytes_per_s_per_direction,
        )
        for tier in view.tiers
    ]
    notes = [
        "ranks fill the innermost tier first; all groups of an axis run at the same time",
        "pp levels: the stage-to-stage sends; other axes: the whole group's collectives",
    ]
    return TopologyReport(
        cluster=view.cluster.id,
        num_gpus=view.num_gpus,
        order=list(placement.order),
        sizes=sizes,
        torus_shape=list(view.torus_shape) if view.torus_shape else None,
        tiers=tiers,
        axes=[axis_report(placement.groups[axis]) for axis in shown],
        notes=notes,
    )


# ----- the cluster as a graph ----------------------------------------------------------
