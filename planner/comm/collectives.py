"""Collective times: alpha-beta models over the network levels a process group crosses.

Sizes and bandwidths follow nccl-tests (NVIDIA/nccl-tests doc/PERFORMANCE.md): ``num_bytes``
S is the all-reduce buffer, the all-gather *output*, the reduce-scatter *input*, each rank's
all-to-all send buffer, or the bytes one rank sends point-to-point. ``algbw = S / t`` and
``busbw = algbw × factor`` with ``factor`` = 2(n−1)/n for all-reduce, (n−1)/n for all-gather,
reduce-scatter and all-to-all, 1 for p2p; ``factor × S`` is also what each rank sends.

Every algorithm costs ``t = alpha + beta · S`` (Hockney's model; Thakur, Rabenseifner and
Gropp 2005 for the ring, tree and pairwise forms). A level's achieved bus bandwidth is the
per-rank link rate from :mod:`planner.comm.network` (already shared among concurrent groups)
× the link's measured ``busbw_efficiency[algorithm]`` (falling back to its ``ring`` figure,
then to 1.0 where a link has none). Latency per ring step is the link's ``latency_s``
(NCCL's per-step hardware latency); NCCL's fixed launch overhead is not added. Algorithms:

* ``ring`` — one flat ring (NCCL's, with one channel per member inside each instance below a
  level, so level ``l`` carries ``members_below · rate``): ``beta = factor / min_l(bus_l)``,
  ``alpha = k · Σ_l steps_l · latency_l`` (k = 2 for all-reduce), NCCL's ring latency model
  (src/graph/tuning.cc) extended to more than two levels.
* ``tree`` — all-reduce over ≥ 2 levels: NCCL's chain inside the lower levels and double
  binary tree on top: ring bandwidth (``tree`` efficiency when the link has one),
  ``alpha = 2 · (Σ_lower (p_l − 1) · latency_l + ⌈log2 p_top⌉ · latency_top)``.
* ``hierarchical`` — ≥ 2 levels: reduce-scatter inside each level going up, all-reduce at
  the top, all-gather going down; level ``l`` moves S / members_below_l:
  ``beta = Σ_l k(p_l − 1)/p_l / (members_below_l · rate_l · eff_l)``.
* ``nvls`` — all-reduce, when a level reduces in the switch (NVLink SHARP): hierarchical, the
  in-network levels at their ``nvls`` efficiency and two latencies (one push, one pull).
* ``torus`` — TPU: hierarchical over the torus axes, each a bidirectional ring (2× the
  per-link rate) when the group wraps around the whole axis (jax-ml/scaling-book).
* ``pairwise`` — all-to-all: every rank sends S/n to each peer at once; each level is busy
  for the bytes that cross it (scale-up: to peers inside its instance; scale-out: every byte
  leaving the instance below, through the rank's NIC); levels work concurrently, so
  ``beta = max_l``; on a torus axis the bisection bounds it: S·(p−1)/8 per link-direction
  with wraparound, S·(p−1)/4 without. ``alpha = Σ_l latency_l`` (sends are posted together).
* ``node-limited`` — the EP all-to-all of a model whose tokens reach at most M nodes
  (DeepSeek-V3 §2.1.2, §3.2.2): S holds a token's k expert copies; a token crosses each
  scale-out level once per destination node (``min(k, M, nodes)`` of its k copies; a
  router that limits expert groups reaches more nodes once a group spans several:
  :func:`nodes_reached`) and is
  forwarded over the scale-up level to each expert's GPU there, so scale-out levels carry
  ``min(k, M, nodes)/k`` of pairwise's bytes and the scale-up level ``(p−1)/p`` of S.
* ``direct`` — p2p over the slowest level between the two ranks.
* ``measured`` — a fit ``t = alpha + S / bytes_per_s`` the link lists for exactly this op and
  group size (:attr:`hwspecs.schema.LinkTier.collective_fits`, written by ``llmplan
  calibrate`` for gloo on loopback); it replaces the formulas above (catalog links list none).

Without an ``algorithm`` the cheapest available one is used, as NCCL's tuner does.

Each cost also says how long every physical link of a rank is busy per byte of S
(``link_busy_s_per_byte``, keyed by :func:`planner.comm.network.link_key`): the bytes that cross a
level divided by that level's achieved rate, i.e. the terms of ``beta`` before they are
combined. Levels of one link (a GPU's NIC serves every scale-out tier) add up where the
algorithm runs them as phases one after another (hierarchical, nvls, torus) and take the
largest where they run at once and the outer level's bytes are a subset of the inner one's
(ring, tree, pairwise, node-limited). :mod:`planner.comm.contention` prices links shared by axes
from these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel

from hwspecs.errors import PlanError
from hwspecs.schema import Cluster
from planner.comm.levels import SCALE_OUT_KINDS, Level, cluster_view, link_key
from planner.comm.network import group_levels
from planner.comm.point_to_point import pair_level

OPS: tuple[str, ...] = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "p2p")
ALGORITHMS: tuple[str, ...] = (
    "ring",
    "tree",
    "hierarchical",
    "nvls",
    "torus",
    "pairwise",
    "node-limited",
    "direct",
    "measured",
)
#: busbw_efficiency key each algorithm reads (ring's figure is the fallback).
EFFICIENCY_KEY = {
    "ring": "ring",
    "tree": "tree",
    "hierarchical": "ring",
    "nvls": "nvls",
    "torus": "torus",
    "pairwise": "alltoall",
    "node-limited": "alltoall",
    "direct": "p2p",
    "measured": "p2p",
}


@dataclass(frozen=True)
class Cost:
    """``time_s = alpha_s + beta_s_per_byte · num_bytes``; ``link_busy_s_per_byte``: seconds
    each physical link of a rank is busy per byte of S, as (link key, s/B) pairs."""

    alpha_s: float
    beta_s_per_byte: float
    link_busy_s_per_byte: tuple[tuple[str, float], ...] = ()

    def time_s(self, num_bytes: float) -> float:
        return self.alpha_s + self.beta_s_per_byte * num_bytes


def check_op(op: str) -> None:
    if op not in OPS:
        raise PlanError(f"unknown op '{op}'; choose one of: {', '.join(OPS)}")


def volume_factor(op: str, n):
    """Bytes each rank sends per byte of S (= busbw / algbw). Works on arrays."""
    if isinstance(n, (int, np.integer)):
        fraction = (n - 1) / n if n > 1 else 0.0
        return {"all-reduce": 2 * fraction, "p2p": float(n > 1)}.get(op, fraction)
    n = np.asarray(n, dtype=float)
    fraction = np.where(n > 1, (n - 1) / np.maximum(n, 1), 0.0)
    return {"all-reduce": 2 * fraction, "p2p": np.where(n > 1, 1.0, 0.0)}.get(op, fraction)


def efficiency(level: Level, algorithm: str) -> float:
    """The level's measured bus-bandwidth fraction for ``algorithm`` (ring's, else 1.0)."""
    table = level.busbw_efficiency
    return table.get(EFFICIENCY_KEY[algorithm], table.get("ring", 1.0))


def _bus(level: Level, algorithm: str, bidirectional: bool = False) -> float:
    """Bytes/s a level moves per rank of the group for ``algorithm`` (members × rate × eff)."""
    double = 2 if bidirectional and level.bidirectional else 1
    return level.members_below * level.bytes_per_s_per_rank * efficiency(level, algorithm) * double


def _per_link(levels: tuple[Level, ...], busy, at_once: bool) -> tuple[tuple[str, float], ...]:
    """Seconds per byte each physical link is busy, from each level's ``busy`` (s/B): levels
    of one link add (phases in turn) or, ``at_once``, the largest counts (nested bytes)."""
    if len(levels) == 1:
        return ((link_key(levels[0]), busy[0]),)
    links: dict[str, float] = {}
    for level, seconds in zip(levels, busy, strict=True):
        key = link_key(level)
        links[key] = max(links.get(key, 0.0), seconds) if at_once else links.get(key, 0.0) + seconds
    return tuple(links.items())


def _ring(op: str, levels: tuple[Level, ...], n: int) -> Cost:
    rounds = 2 if op == "all-reduce" else 1
    factor = volume_factor(op, n)
    busy = [factor / _bus(level, "ring") for level in levels]
    return Cost(
        rounds * sum(level.steps * level.latency_s for level in levels),
        max(busy),
        _per_link(levels, busy, at_once=True),
    )


def _tree(levels: tuple[Level, ...], n: int) -> Cost:
    *lower, top = levels
    alpha = sum((level.participants - 1) * level.latency_s for level in lower)
    alpha += math.ceil(math.log2(top.participants)) * top.latency_s
    factor = volume_factor("all-reduce", n)
    busy = [factor / _bus(level, "tree") for level in levels]
    return Cost(2 * alpha, max(busy), _per_link(levels, busy, at_once=True))


def _hierarchical(op: str, levels: tuple[Level, ...], mode: str) -> Cost:
    """Phases level by level; ``mode`` picks per-level algorithm (hierarchical/nvls/torus)."""
    rounds = 2 if op == "all-reduce" else 1
    alpha, busy = 0.0, []
    for level in levels:
        fraction = rounds * (level.participants - 1) / level.participants
        if mode == "nvls" and level.in_network_reduction and "nvls" in level.busbw_efficiency:
            alpha += 2 * level.latency_s
            busy.append(fraction / _bus(level, "nvls"))
        elif mode == "torus" and level.is_torus:
            alpha += rounds * (level.participants - 1) * level.latency_s
            busy.append(fraction / _bus(level, "torus", bidirectional=True))
        else:
            alpha += rounds * (level.participants - 1) * level.latency_s
            busy.append(fraction / _bus(level, "ring"))
    return Cost(alpha, sum(busy), _per_link(levels, busy, at_once=False))


def _pairwise(levels: tuple[Level, ...], n: int) -> Cost:
    busy = []
    for level in levels:
        rate = level.bytes_per_s_per_rank * efficiency(level, "pairwise")
        if level.is_torus:
            per_link = (level.participants - 1) / (8 if level.bidirectional else 4)
            busy.append(per_link / rate)
        elif level.kind in ("scale-out", "dcn"):
            busy.append((n - level.members_below) / n / rate)
        else:
            inside = level.members_below * (level.participants - 1)
            busy.append(inside / n / rate)
    return Cost(
        sum(level.latency_s for level in levels), max(busy), _per_link(levels, busy, at_once=True)
    )


def nodes_reached(top_k: int, max_nodes: int, groups: int | None, nodes: int) -> int:
    """The most nodes one token's ``top_k`` experts lie on, over an EP group of ``nodes``.

    Node-limited routing (DeepSeek-V3 §2.1.2) keeps a token on ``max_nodes`` nodes. Where
    the router limits expert *groups* instead (``groups``: HF ``n_group``, Megatron-Core's
    ``moe_router_num_groups``; ``max_nodes`` is then ``topk_group``), that is a node limit
    only while each node holds whole groups: experts placed contiguously, a group spans
    ``⌈nodes/groups⌉`` nodes, so a token reaches ``max_nodes·⌈nodes/groups⌉`` of them
    (Megatron-Core ``transformer_config.py``: "set moe_router_num_groups equal to number of
    nodes in EP group" for node-limited routing).
    """
    span = 1 if groups is None else -(-nodes // groups)
    return min(top_k, max_nodes * span, nodes)


def _node_limited(
    levels: tuple[Level, ...], n: int, top_k: int, max_nodes: int, groups: int | None = None
) -> Cost:
    """All-to-all under node-limited routing (DeepSeek-V3 §3.2.2); see the module docstring.

    Each token goes once over IB to every destination node (:func:`nodes_reached` of them)
    and NVLink forwards it to its experts' GPUs; levels work concurrently (``beta = max``).
    """
    scale_out = [level.kind in SCALE_OUT_KINDS for level in levels]
    nodes = n // levels[scale_out.index(True)].members_below
    node_share = nodes_reached(top_k, max_nodes, groups, nodes) / top_k
    busy = []
    for level, crosses_nodes in zip(levels, scale_out, strict=True):
        rate = level.bytes_per_s_per_rank * efficiency(level, "node-limited")
        if crosses_nodes:
            busy.append(node_share * (n - level.members_below) / n / rate)
        else:
            busy.append((level.participants - 1) / level.participants / rate)
    return Cost(
        sum(level.latency_s for level in levels), max(busy), _per_link(levels, busy, at_once=True)
    )


def measured_cost(op: str, levels: tuple[Level, ...], n: int) -> Cost | None:
    """The link's measured fit for ``op`` on ``n`` ranks (:attr:`LinkTier.collective_fits`),
    when the group stays on one level of a link that lists one; else None.

    A fit is what the runtime really takes for that op and group size (gloo over loopback
    follows no ring factor: its reduce-scatter is an all-reduce plus a copy), so it replaces
    every formula. The link is busy for the whole transfer term (``1/bytes_per_s`` per byte).
    """
    if len(levels) != 1:
        return None
    (level,) = levels
    fit = next((f for f in level.collective_fits if (f.op, f.group_size) == (op, n)), None)
    if fit is None:
        return None
    beta = 1.0 / fit.bytes_per_s
    return Cost(fit.alpha_s, beta, ((link_key(level), beta),))


def algorithm_costs(
    op: str, levels: tuple[Level, ...], n: int, routing: tuple[int, int, int | None] | None = None
) -> dict[str, Cost]:
    """Every algorithm available for ``op`` on a group of ``n`` ranks crossing ``levels``.

    ``routing``: (top-k, max nodes per token, expert groups or None) of an EP all-to-all
    under node-limited routing; the all-to-all then runs ``node-limited`` where the group
    spans nodes.
    """
    check_op(op)
    if n <= 1 or not levels:
        return {}
    measured = measured_cost(op, levels, n)
    if measured is not None:
        return {"measured": measured}
    if op == "p2p":
        (level,) = levels
        busy = 1 / (level.bytes_per_s_per_rank * efficiency(level, "direct"))
        return {"direct": Cost(level.latency_s, busy, ((link_key(level), busy),))}
    if op == "all-to-all":
        spans_nodes = any(level.kind in SCALE_OUT_KINDS for level in levels)
        if routing is not None and spans_nodes and not any(lv.is_torus for lv in levels):
            return {"node-limited": _node_limited(levels, n, *routing)}
        return {"pairwise": _pairwise(levels, n)}
    costs = {"ring": _ring(op, levels, n)}
    has_torus = any(level.is_torus for level in levels)
    if len(levels) >= 2:
        costs["hierarchical"] = _hierarchical(op, levels, "hierarchical")
        if op == "all-reduce" and not has_torus:
            costs["tree"] = _tree(levels, n)
    if has_torus:
        costs["torus"] = _hierarchical(op, levels, "torus")
    if op == "all-reduce" and any(
        level.in_network_reduction and "nvls" in level.busbw_efficiency for level in levels
    ):
        costs["nvls"] = _hierarchical(op, levels, "nvls")
    return costs


def choose(
    costs: dict[str, Cost], num_bytes: float, algorithm: str | None = None, where: str = ""
) -> tuple[str, Cost]:
    """The requested algorithm (checked) or the cheapest at ``num_bytes``."""
    if algorithm is not None:
        if algorithm not in ALGORITHMS:
            raise PlanError(
                f"unknown algorithm '{algorithm}'; choose one of: {', '.join(ALGORITHMS)}"
            )
        if algorithm not in costs:
            available = ", ".join(costs) or "none (a group of one rank)"
            raise PlanError(
                f"algorithm '{algorithm}' is not available {where}; available: {available}"
            )
        return algorithm, costs[algorithm]
    name = min(costs, key=lambda key: costs[key].time_s(num_bytes))
    return name, costs[name]


class CollectiveResult(BaseModel):
    """One collective on one group: time, bandwidths and the links it ran over."""

    op: str
    num_bytes: float
    ranks: int
    algorithm: str
    time_s: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    bytes_per_rank: float
    latency_s: float
    tiers: list[str]
    alternatives: dict[str, float]


def collective_time(
    op: str,
    num_bytes: float,
    ranks: int,
    cluster: Cluster | str,
    algorithm: str | None = None,
    gpus: int | None = None,
) -> CollectiveResult:
    """Time of one ``op`` of ``num_bytes`` over ``ranks`` consecutive ranks of ``cluster``.

    The group fills the innermost tier first (ranks 0 … ranks−1); p2p sends from rank 0 to
    rank ``ranks − 1``. ``gpus`` keeps only the first ``gpus`` devices of the cluster.
    """
    check_op(op)
    if num_bytes < 0 or ranks < 1:
        raise PlanError(f"bytes must be ≥ 0 and ranks ≥ 1, got bytes {num_bytes}, ranks {ranks}")
    view = cluster_view(cluster, gpus)
    if ranks > view.num_gpus:
        raise PlanError(
            f"ranks {ranks} exceed the {view.num_gpus} GPUs of cluster '{view.cluster.id}'"
        )
    if op == "p2p":
        level = pair_level(view, np.array([0]), np.array([ranks - 1]))
        levels = (level,) if level else ()
    else:
        levels = group_levels(view, np.arange(ranks)[None, :])
    costs = algorithm_costs(op, levels, ranks)
    if not costs:
        if algorithm is not None:
            choose(costs, num_bytes, algorithm, f"for {op} on a group of one rank")
        return CollectiveResult(
            op=op,
            num_bytes=num_bytes,
            ranks=ranks,
            algorithm="none",
            time_s=0.0,
            algbw_bytes_per_s=0.0,
            busbw_bytes_per_s=0.0,
            bytes_per_rank=0.0,
            latency_s=0.0,
            tiers=[],
            alternatives={},
        )
    where = f"for {op} over {ranks} ranks of '{view.cluster.id}' ({tier_names(levels)})"
    name, cost = choose(costs, num_bytes, algorithm, where)
    time_s = cost.time_s(num_bytes)
    algbw = num_bytes / time_s if time_s > 0 else 0.0
    return CollectiveResult(
        op=op,
        num_bytes=num_bytes,
        ranks=ranks,
        algorithm=name,
        time_s=time_s,
        algbw_bytes_per_s=algbw,
        busbw_bytes_per_s=algbw * volume_factor(op, ranks),
        bytes_per_rank=num_bytes * volume_factor(op, ranks),
        latency_s=cost.alpha_s,
        tiers=[level.tier for level in levels],
        alternatives={key: value.time_s(num_bytes) for key, value in costs.items()},
    )


def tier_names(levels: tuple[Level, ...]) -> str:
    return " + ".join(level.tier for level in levels) or "no link"


def parse_num_bytes(text: str | float | int) -> float:
    """Bytes from ``4096``, ``1e9``, ``512MB`` (10^6) or ``1GiB`` (2^30) (:mod:`planner.spec.units`)."""
    from planner.spec.units import parse_bytes

    return parse_bytes(text, "--bytes")
