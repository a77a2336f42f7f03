"""What point-to-point sends cross on a cluster's network (a pipeline's stage-to-stage
sends, one pair of ranks per send, all at once): the slowest level, and its bandwidth per
send, as :mod:`planner.comm.network` prices a group's levels."""

from __future__ import annotations

import numpy as np

from planner.comm.levels import ClusterView, Level
from planner.comm.network import is_full_mesh, link_rate, per_link_rate


def pair_level(view: ClusterView, sources: np.ndarray, targets: np.ndarray) -> Level | None:
    """The slowest level crossed by point-to-point sends ``sources[i] → targets[i]``, all at once.

    On a switched tier each sender uses its own link (shared above oversubscribed tiers);
    on a torus, sends shifted by ``h`` hops along an axis load every link with ``h`` flows.
    """
    sources, targets = np.asarray(sources), np.asarray(targets)
    candidates: list[Level] = []
    # Each end's instance of the level below, then of this tier (a rank is its own below tier 0).
    source_below, target_below = sources, targets
    for index, tier in enumerate(view.tiers):
        link = view.links[tier.link]
        below_size = view.tiers[index - 1].group_size if index else 1
        source_in, target_in = sources // tier.group_size, targets // tier.group_size
        beyond = source_below != target_below
        crosses = beyond & (source_in == target_in)
        below, source_below, target_below = source_below, source_in, target_in
        if not crosses.any():
            continue
        common = {
            "tier": tier.name,
            "tier_index": index,
            "link": link.id,
            "kind": link.kind,
            "participants": 2,
            "members_below": 1,
            "steps": 1,
            "busbw_efficiency": dict(link.busbw_efficiency),
            "in_network_reduction": False,
            "bidirectional": False,
            "oversubscription": tier.oversubscription,
            "collective_fits": tuple(link.collective_fits),
        }
        if view.is_torus_tier(index):
            hops = _torus_hops(
                view.torus_shape,
                sources[crosses] % tier.group_size,
                targets[crosses] % tier.group_size,
                view.cluster.torus_wraparound,
            )
            candidates.append(
                Level(
                    **common,
                    bytes_per_s_per_rank=per_link_rate(link) / int(hops.max(axis=1).max()),
                    latency_s=link.latency_s * int(hops.sum(axis=1).max()),
                    share=1.0,
                    crossing_ranks=0,
                    concurrent_groups=1,
                )
            )
            continue
        crossing = int(np.bincount(below[beyond]).max())
        share = 1.0
        if tier.oversubscription > 1:
            share = min(1.0, below_size / (tier.oversubscription * crossing))
        rate = per_link_rate(link) if is_full_mesh(tier, link) else link_rate(view, link)
        candidates.append(
            Level(
                **common,
                bytes_per_s_per_rank=rate * share,
                latency_s=link.latency_s,
                share=share,
                crossing_ranks=crossing,
                concurrent_groups=crossing,
            )
        )
    if not candidates:
        return None
    return min(
        candidates,
        key=lambda level: (level.bytes_per_s_per_rank, -level.latency_s, -level.tier_index),
    )


def _torus_hops(shape, sources, targets, wraparound: bool) -> np.ndarray:
    """Hops along each torus axis between chips (shortest way round when wrapped)."""
    hops = []
    for extent in shape:
        delta = np.abs(sources % extent - targets % extent)
        hops.append(np.minimum(delta, extent - delta) if wraparound else delta)
        sources, targets = sources // extent, targets // extent
    return np.stack(hops, axis=1)
