"""Links shared by parallel axes: the step time lost when one axis's traffic meets another's.

Each axis's collectives are priced as if their group had the links alone
(:mod:`planner.comm.terms`): overlapped ("hidden") traffic costs nothing and exposed
traffic costs its alpha-beta time. But every axis leaves a GPU through the same few physical
links — its scale-up ports and its NIC, which serves every scale-out tier
(:func:`planner.comm.network.link_key`) — and each axis has its own NCCL communicator, whose
channels run concurrently over the same NICs and share their bandwidth (NCCL user guide,
"Using multiple NCCL communicators concurrently"). Llama 3 orders its mesh [TP, CP, PP, DP]
for exactly this reason (arXiv 2407.21783 §3.3.2, "network-aware parallelism
configuration": the axes with the most traffic innermost, on the fastest links): the model
has to see the cost when several axes land on one NIC.

Per physical link L of the busiest rank and per axis a the traffic model gives the seconds
L is busy (bytes crossing L / L's achieved rate, the same bus-bandwidth efficiency as the
collective's time, :mod:`planner.comm.collectives`), split by each collective's overlap rule into the
part on the critical path, ``e[a, L]`` (exposed), and the hidden rest, ``h[a, L]``. Two
physical facts then bound the step:

1. **Sharing** (the hidden traffic of one axis cannot hide while the link carries another
   axis's exposed traffic). Hidden traffic is sent while the rank computes: it occupies L a
   fraction ``h[a, L] / C`` of the compute window ``C = m·(F + B)`` in which every overlap
   rule hides it (wherever inside C its own window lies). Exposed traffic (TP and CP per
   layer, EP per MoE layer, …) falls inside C too, layer by layer, and is taken as spread
   evenly over it. While an exposed transfer of axis b runs, the other axes' hidden
   transfers in flight take their share of L, so to first order the transfer waits
   ``e[b, L] · Σ_{a≠b} h[a, L] / C``. A transfer sharing L fairly keeps at least half the
   rate, so the wait is at most ``e[b, L]`` (the share is capped at 1)::

       link_contention_s = Σ_L Σ_b e[b, L] · min(1, Σ_{a≠b} h[a, L] / C)

   The sum over L counts the exposed time spent on each link once; phases of one collective
   on different links run one after another.
2. **Occupancy** (roofline-style bound: a step is no shorter than its busiest link's busy
   time, Williams, Waterman and Patterson 2009 applied to a link): the step is at least
   ``Σ_a (e + h)[a, L]`` for every L. Only the part above what one axis alone already takes
   counts here (each axis's own overlap rules price its own traffic)::

       occupancy_excess_s = max_L max(0, busy[L] − max(step, max_a busy[a, L]))

The term reported is ``max(sharing, occupancy excess)``: both bound the same loss from below.
It is zero when a link carries one axis only, never negative, and touches neither FLOPs nor
memory. Not modelled: bursts (transfers are taken as spread evenly), the placement of the
pipeline's fill and drain transfers at the step's ends, and traffic hidden in bubbles.
"""

from __future__ import annotations

import numpy as np


def sharing_delay(exposed: dict, hidden: dict, window) -> np.ndarray | float:
    """Seconds exposed transfers wait for other axes' hidden traffic on one link.

    ``exposed``, ``hidden``: {axis: seconds the link is busy per step} (arrays, one row per
    layout); ``window``: the compute window ``C`` (seconds) the hidden traffic is spread over.
    ``Σ_b e_b · min(1, (H − h_b) / C)`` with ``H = Σ_a h_a`` (module docstring, point 1).
    """
    total_hidden = sum(hidden.values(), 0.0)
    delay = 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        for axis, exposed_s in exposed.items():
            others = total_hidden - hidden.get(axis, 0.0)
            share = np.where(window > 0, np.minimum(1.0, others / window), 0.0)
            delay = delay + exposed_s * np.maximum(share, 0.0)
    return delay


def occupancy_excess(busy, busiest_axis, step_s) -> np.ndarray:
    """``max_L max(0, busy[L] − max(step, busiest_axis[L]))`` (module docstring, point 2).

    ``busy``, ``busiest_axis``: [row, link] seconds the link is busy per step with all axes,
    and with the one axis that uses it most; ``step_s``: [row] step time without the term.
    """
    busy = np.asarray(busy, dtype=float)
    if busy.shape[-1] == 0:
        return np.zeros(np.shape(step_s))
    floor = np.maximum(np.asarray(step_s, dtype=float)[..., None], busiest_axis)
    return np.maximum(busy - floor, 0.0).max(axis=-1)
