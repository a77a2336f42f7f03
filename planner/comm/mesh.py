"""The device mesh: its axes, the process groups the traffic model uses, the mesh's factors in
a mesh order (innermost first; default ``tp, cp, ep, pp, dp``, Llama 3's [TP, CP, PP, DP] with
EP inside DP, arXiv 2407.21783 §3.3.2) and the ranks of each group. Expert parallelism is
carved out of the ``cp·dp`` ranks (and out of tp under ``etp = 1``); see
:mod:`planner.comm.topology` for where the groups land on the cluster."""

from __future__ import annotations

import functools
import math
from enum import StrEnum

import numpy as np

from hwspecs.errors import PlanError
from planner.spec.layout import (
    DEFAULT_MESH_ORDER,
    Layout,
    MeshAxis,
    check_expert_tp,
    expert_data_parallel_size,
)

#: Mesh axes a user may order, innermost first by default (see planner.spec.layout).
MESH_AXES: tuple[MeshAxis, ...] = DEFAULT_MESH_ORDER


class ProcessGroup(StrEnum):
    """Process groups the traffic model uses: the mesh axes, the dense-gradient group dp·cp
    (CP ranks hold the same weights) and the expert-data-parallel group dp·cp·(tp/etp)/ep."""

    TP = MeshAxis.TP.value
    CP = MeshAxis.CP.value
    EP = MeshAxis.EP.value
    PP = MeshAxis.PP.value
    DP = MeshAxis.DP.value
    DP_CP = "dp_cp"
    EXPERT_DP = "edp"


GROUP_AXES: tuple[ProcessGroup, ...] = tuple(ProcessGroup)


#: Mesh factors each group is made of (tpt = the routed experts' TP part, etp; tpe = tp ∩ ep,
#: tp/etp; cpe = cp ∩ ep, cpr = rest of cp, dpe = dp ∩ ep, dpr = rest of dp).
GROUP_FACTORS: dict[ProcessGroup, tuple[str, ...]] = {
    ProcessGroup.TP: ("tpt", "tpe"),
    ProcessGroup.CP: ("cpe", "cpr"),
    ProcessGroup.EP: ("tpe", "cpe", "dpe"),
    ProcessGroup.PP: ("pp",),
    ProcessGroup.DP: ("dpe", "dpr"),
    ProcessGroup.DP_CP: ("cpe", "cpr", "dpe", "dpr"),
    ProcessGroup.EXPERT_DP: ("cpr", "dpr"),
}


def resolve_order(order) -> tuple[MeshAxis, ...]:
    """Validate a mesh order (innermost first); ``ep`` may be left out (it then sits in dp).
    Each distinct order is resolved once (every placement reads its mesh's order)."""
    return _resolved_order(order if isinstance(order, str) else tuple(order))


@functools.lru_cache(maxsize=64)
def _resolved_order(order: str | tuple) -> tuple[MeshAxis, ...]:
    if isinstance(order, str):
        order = [part.strip() for part in order.split(",") if part.strip()]
    order = tuple(order)
    required = {MeshAxis.TP, MeshAxis.CP, MeshAxis.PP, MeshAxis.DP}
    unknown = [axis for axis in order if axis not in MESH_AXES]
    if unknown or len(set(order)) != len(order) or not required <= set(order):
        raise PlanError(
            f"order {','.join(order)!r} must name each of tp, cp, pp, dp once (and ep at most "
            f"once), innermost first, e.g. {','.join(MESH_AXES)}"
        )
    return tuple(MeshAxis(axis) for axis in order)


def mesh_factors(sizes: dict[str, int], order) -> list[tuple[str, int]]:
    """The mesh's factors, innermost first, as (name, size); ``sizes`` may give ``etp``."""
    tp, cp, pp, dp, ep = (int(sizes.get(axis, 1)) for axis in ("tp", "cp", "pp", "dp", "ep"))
    if min(tp, cp, pp, dp, ep) < 1:
        raise PlanError(f"parallel degrees must be ≥ 1, got {sizes}")
    etp = int(sizes.get("etp") or tp)
    fold = check_expert_tp(tp, ep, dp * cp, etp)
    ep_rest = ep // fold  # the part of EP carved out of cp·dp
    ep_cp = math.gcd(ep_rest, cp)
    ep_dp = ep_rest // ep_cp  # divides dp whenever ep_rest divides dp·cp
    by_axis = {
        "tp": [("tpt", etp), ("tpe", fold)],
        "cp": [("cpe", ep_cp), ("cpr", cp // ep_cp)],
        "ep": [("dpe", ep_dp)],
        "pp": [("pp", pp)],
        "dp": [("dpr", dp // ep_dp)],
    }
    order = resolve_order(order)
    if "ep" not in order:
        by_axis["dp"] = by_axis["ep"] + by_axis["dp"]
    return [factor for axis in order for factor in by_axis[axis]]


def axis_groups(axis: str, sizes: dict[str, int], order) -> np.ndarray:
    """Ranks of every group of ``axis``: an int array (num_groups, group_size), rows ascending."""
    factors = mesh_factors(sizes, order)
    dims = [size for _, size in factors]
    grid = np.arange(math.prod(dims), dtype=np.int64).reshape(dims[::-1])
    last = len(dims) - 1
    members = [last - i for i, (name, _) in enumerate(factors) if name in GROUP_FACTORS[axis]]
    others = [ax for ax in range(len(dims)) if ax not in members]
    group_size = math.prod(grid.shape[ax] for ax in members)
    return np.sort(grid.transpose(others + sorted(members)).reshape(-1, group_size), axis=1)


def degrees(layout: Layout | dict) -> dict[str, int]:
    """The five mesh degrees of a Layout (or of a dict holding some of them; the rest are 1),
    plus ``etp`` where the routed experts' TP degree is not tp."""
    if isinstance(layout, Layout):
        sizes = {axis: getattr(layout, axis) for axis in MESH_AXES}
        etp = layout.expert_tp
    else:
        unknown = set(layout) - {*MESH_AXES, "etp"}
        if unknown:
            raise PlanError(
                f"unknown axes {sorted(unknown)}; choose from {', '.join(MESH_AXES)} (and etp)"
            )
        sizes = {axis: int(layout.get(axis, 1)) for axis in MESH_AXES}
        etp = int(layout.get("etp") or sizes["tp"])
    if etp != sizes["tp"]:
        sizes["etp"] = etp
    return sizes


def group_size(axis: str, sizes: dict[str, int]) -> int:
    """Ranks in one group of ``axis`` (a mesh axis or a derived group)."""
    tp, cp, pp, dp, ep = (sizes[a] for a in ("tp", "cp", "pp", "dp", "ep"))
    return {
        "tp": tp,
        "cp": cp,
        "ep": ep,
        "pp": pp,
        "dp": dp,
        "dp_cp": dp * cp,
        "edp": int(expert_data_parallel_size(dp, cp, tp, ep, sizes.get("etp") or tp)),
    }[axis]
