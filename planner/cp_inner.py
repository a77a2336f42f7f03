"""Hierarchical CP's inner degree as a search axis when pinned: each hierarchical row once
per pinned inner (Ulysses, all-to-all) degree ``k`` strictly between 1 and cp that divides cp
— Megatron-Core's ``--hierarchical-context-parallel-sizes [k, cp/k]``.

Unpinned, the search gives each hierarchical row the CP ranks of one scale-up domain, the
all-to-all inside the node and the ring across as Megatron-Core's ``a2a+p2p`` is meant to run
(:func:`planner.comm.context_parallel.cp_inner_degree`); every divisor as its own row would
add 31% to DeepSeek-V3's candidates on 2,048 GPUs (17.3 M → 22.6 M, measured 2026-12-02).

``k = 1`` is the ring and ``k = cp`` Ulysses (the rule table lists those once, under their
own names); the default degree, the CP ranks of one scale-up domain
(:func:`planner.comm.context_parallel.cp_inner_degree`), is one of the ``k`` where it is
proper. Rows of the other algorithms keep inner 1 (no inner all-to-all).
"""

from __future__ import annotations

import numpy as np


def proper_divisors(n: int) -> list[int]:
    """Divisors of ``n`` strictly between 1 and ``n``."""
    return [k for k in range(2, n) if n % k == 0]


def with_cp_inner(
    degrees: tuple, algorithm: np.ndarray, hierarchical: np.ndarray, default: np.ndarray,
    pins: list[int] | None = None,
) -> tuple[tuple, np.ndarray, np.ndarray]:  # fmt: skip
    """(degree rows, algorithm, inner degree) with each hierarchical row repeated once per
    inner degree (:func:`proper_divisors` of its cp, those in ``pins`` where given); a
    hierarchical row with none keeps ``default`` (the rule table then rejects it as
    degenerate) — or, under pins, is dropped —; the other rows keep ``default`` (1). Work
    once per distinct cp."""
    cp = np.asarray(degrees[1])
    choices = {}
    for value in np.unique(cp[hierarchical]).tolist():
        found = proper_divisors(int(value))
        if pins is not None:
            found = [k for k in found if k in pins]
        choices[value] = found
    counts = np.ones(len(cp), dtype=np.int64)
    for value, found in choices.items():  # a pin no divisor meets drops the row
        counts[hierarchical & (cp == value)] = len(found) if pins is not None else max(
            len(found), 1)  # fmt: skip
    row = np.repeat(np.arange(len(cp)), counts)
    inner = np.asarray(default, dtype=np.int64)[row].copy()
    # each repeated row's position among its copies picks its inner degree
    position = np.arange(len(row)) - np.repeat(np.cumsum(counts) - counts, counts)
    for value, found in choices.items():
        if not found:
            continue
        at = hierarchical[row] & (cp[row] == value)
        inner[at] = np.asarray(found, dtype=np.int64)[position[at]]
    return tuple(column[row] for column in degrees), np.asarray(algorithm)[row], inner
