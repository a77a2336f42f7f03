"""Collective cost tables for many layouts: each distinct (placement group, op) priced once as
``alpha + beta · bytes`` per algorithm (:func:`planner.comm.collectives.algorithm_costs`),
the cheapest algorithm per message, and the seconds each link is busy; the machinery
:mod:`planner.comm.traffic` prices its terms with."""

from __future__ import annotations

import numpy as np

from planner.comm.collectives import ALGORITHMS, algorithm_costs
from planner.comm.context_parallel import placement_group

#: Most algorithms :func:`planner.comm.collectives.algorithm_costs` offers for one op.
NUM_ALGORITHMS = len(ALGORITHMS)


#: Costs of each distinct (group levels, op, routing), shared by every call: the levels come
#: from :mod:`planner.comm.topology`'s caches, and each entry keeps its group alive, so the ids in
#: the key stay its own.
_GROUP_COSTS: dict[tuple, tuple] = {}


_GROUP_COSTS_SIZE = 16384


class CostTables:
    """alpha, beta [combination, algorithm] of one (placement group, op), priced on first
    use: every algorithm costs ``alpha + beta · bytes`` (:func:`planner.comm.collectives.algorithm_costs`),
    inf alpha where an algorithm is unavailable or the combination cannot be placed; and
    {link: seconds busy per byte [combination, algorithm]}. Each distinct group (placements
    share one levels tuple per group shape) is priced once (:data:`_GROUP_COSTS`)."""

    def __init__(self, placements: list, routing=None, cp_inner=None):
        self.placements = placements
        self.routing = routing  # the EP all-to-all's node-limited routing (ep_routing)
        # hierarchical CP's inner degree of each combination (None: its placement's)
        self.cp_inner = [None] * len(placements) if cp_inner is None else list(cp_inner)
        self.tables: dict[tuple[str, str], tuple] = {}
        self.group_rows: dict[str, tuple[np.ndarray, list]] = {}
        self.groups = _GROUP_COSTS

    def __call__(self, group_name: str, op: str) -> tuple[np.ndarray, np.ndarray, dict]:
        if (group_name, op) not in self.tables:
            self.tables[group_name, op] = self._price(group_name, op)
        return self.tables[group_name, op]

    def _distinct_groups(self, group_name: str) -> tuple[np.ndarray, list]:
        """Each combination's row in the stacked tables of one group (0: cannot be placed,
        1 + i: the i-th distinct group), and those distinct groups (first seen first)."""
        if group_name not in self.group_rows:
            rows: dict[tuple, int] = {}
            groups, where = [], np.zeros(len(self.placements), dtype=np.int64)
            for u, placement in enumerate(self.placements):
                if placement is None:
                    continue
                group = placement_group(placement, group_name, self.cp_inner[u])
                # Level holds a dict (not hashable): the identity of the shared levels is
                # the key, and the cost entry keeps the group (and so its levels) alive.
                key = (id(group.levels), id(group.neighbour_level), group.group_size)
                if key not in rows:
                    rows[key] = len(groups) + 1
                    groups.append(group)
                where[u] = rows[key]
            self.group_rows[group_name] = where, groups
        return self.group_rows[group_name]

    def _price(self, group_name: str, op: str) -> tuple[np.ndarray, np.ndarray, dict]:
        routing = self.routing if group_name == "ep" else None
        where, groups = self._distinct_groups(group_name)
        costs = [(np.full(NUM_ALGORITHMS, np.inf), np.zeros(NUM_ALGORITHMS), {})]
        for group in groups:
            key = (id(group.levels), id(group.neighbour_level), group.group_size, op, routing)
            entry = self.groups.get(key)
            if entry is None:  # built whole, then stored once (blocks run on threads)
                if len(self.groups) >= _GROUP_COSTS_SIZE:
                    self.groups.clear()
                entry = self.groups[key] = (*_group_costs(group, op, routing), group)
            costs.append(entry[:3])  # held here: emptying the cache cannot lose it
        alpha = np.stack([cost[0] for cost in costs])[where]
        beta = np.stack([cost[1] for cost in costs])[where]
        busy_links = dict.fromkeys(link for cost in costs for link in cost[2])
        zero = np.zeros(NUM_ALGORITHMS)
        links = {
            link: np.stack([cost[2].get(link, zero) for cost in costs])[where]
            for link in busy_links
        }
        usable = np.flatnonzero(np.isfinite(alpha).any(axis=0))
        if not len(usable):  # no combination can be placed: one column, priced at inf
            usable = np.arange(1)
        return alpha[:, usable], beta[:, usable], {k: v[:, usable] for k, v in links.items()}


def _group_costs(group, op: str, routing=None) -> tuple[np.ndarray, np.ndarray, dict]:
    """alpha, beta [algorithm] of ``op`` on one group placement (inf where unavailable) and
    {link: seconds busy per byte [algorithm]}; ``routing``: node-limited routing of an EP
    all-to-all (:func:`ep_routing`), or None."""
    alpha = np.full(NUM_ALGORITHMS, np.inf)
    beta = np.zeros_like(alpha)
    busy: dict[str, np.ndarray] = {}
    if op == "p2p":
        levels = (group.neighbour_level,) if group.neighbour_level else ()
    else:
        levels = group.levels
    costs = algorithm_costs(op, levels, group.group_size, routing)
    if not costs:  # a group of one rank: nothing to send
        alpha[0] = 0.0
    for a, cost in enumerate(costs.values()):
        alpha[a], beta[a] = cost.alpha_s, cost.beta_s_per_byte
        for link, seconds_per_byte in cost.link_busy_s_per_byte:
            busy.setdefault(link, np.zeros(NUM_ALGORITHMS))[a] = seconds_per_byte
    return alpha, beta, busy


def cheapest(alpha, beta, live: np.ndarray, num_bytes, shape) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest algorithm's time for one collective of ``num_bytes`` on the ``live`` rows
    (flat indices; ``alpha``, ``beta`` [live row, algorithm]), 0 on the other rows; and the
    index of that algorithm on each live row."""
    sent = np.broadcast_to(np.asarray(num_bytes, dtype=float), shape).ravel()[live]
    each = alpha + beta * sent[:, None]
    choice = each.argmin(axis=-1)
    time = np.zeros(int(np.prod(shape)))
    time[live] = each[np.arange(len(live)), choice]
    return time.reshape(shape), choice


def link_busy(per_byte: dict, at: np.ndarray, choice, live, sent, shape) -> dict:
    """{link: seconds the link is busy} of ``sent`` bytes per row on the chosen algorithm
    (``per_byte`` tables [combination, algorithm] read at combination ``at`` of each live row)."""
    busy = {}
    for link, table in per_byte.items():
        flat = np.zeros(int(np.prod(shape)))
        flat[live] = sent.ravel()[live] * table[at, choice]
        busy[link] = flat.reshape(shape)
    return busy
