"""What a search result shows beyond its top rows: the Pareto front and a bounded sample.

Both are columns in, indices out (numpy, no loop over rows), so a page of 10^6 feasible
layouts draws in the same size as one of 10^3: the front (no layout both faster and smaller
in memory), then one layout per cell of a grid over memory × log step time,
a fixed-seed random one in each cell, so the cloud's shape and its edges survive while its
density does not.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

#: Grid cells per axis for the sampled cloud (memory × log step time): 40 × 40 cells give at
#: most 1,600 points, about 100 kB of page data beside plotly.js's 4.8 MB.
SAMPLE_GRID_CELLS = 40


def pareto_front_mask(step_time_s: np.ndarray, memory_bytes: np.ndarray) -> np.ndarray:
    """True where no other row is at least as fast and strictly smaller, or faster and as small.

    Sorted by step time (then memory), a row is on the front when its memory is below every
    faster row's; of identical points only the first is kept.
    """
    step_time_s = np.asarray(step_time_s, dtype=float)
    memory_bytes = np.asarray(memory_bytes, dtype=float)
    order = np.lexsort((memory_bytes, step_time_s))
    memory_sorted = memory_bytes[order]
    smallest_before = np.minimum.accumulate(np.concatenate(([np.inf], memory_sorted[:-1])))
    mask = np.zeros(len(order), dtype=bool)
    mask[order[memory_sorted < smallest_before]] = True
    return mask


class PageSample(BaseModel):
    """Which feasible rows a page draws, and how they were chosen (said on the page)."""

    front: list[int]  # row positions on the Pareto front, fastest first
    cloud: list[int]  # one row per occupied grid cell (memory × log step time), not on the front
    num_feasible: int
    grid_cells: int

    @property
    def description(self) -> str:
        return (
            f"Pareto front ({len(self.front):,} layouts) and one layout per cell of a "
            f"{self.grid_cells}×{self.grid_cells} grid over memory × log step time "
            f"({len(self.cloud):,} more) of {self.num_feasible:,} feasible; every row is in --csv"
        )


def page_sample(
    step_time_s: np.ndarray,
    memory_bytes: np.ndarray,
    grid_cells: int = SAMPLE_GRID_CELLS,
    seed: int = 0,
) -> PageSample:
    """The Pareto front and one row of each grid cell, drawn with a fixed seed (reproducible)."""
    step_time_s = np.asarray(step_time_s, dtype=float)
    memory_bytes = np.asarray(memory_bytes, dtype=float)
    front_mask = pareto_front_mask(step_time_s, memory_bytes)
    front = np.flatnonzero(front_mask)
    front = front[np.argsort(step_time_s[front], kind="stable")]
    if len(step_time_s) == 0:
        return PageSample(front=[], cloud=[], num_feasible=0, grid_cells=grid_cells)
    log_time = np.log(np.maximum(step_time_s, np.finfo(float).tiny))
    cells = _cell(memory_bytes, grid_cells) * grid_cells + _cell(log_time, grid_cells)
    shuffled = np.random.default_rng(seed).permutation(len(cells))
    _, first = np.unique(cells[shuffled], return_index=True)
    chosen = shuffled[first]
    cloud = np.sort(chosen[~front_mask[chosen]])
    return PageSample(
        front=front.tolist(),
        cloud=cloud.tolist(),
        num_feasible=len(step_time_s),
        grid_cells=grid_cells,
    )


def _cell(values: np.ndarray, cells: int) -> np.ndarray:
    low, high = values.min(), values.max()
    if high <= low:
        return np.zeros(len(values), dtype=int)
    return np.minimum(((values - low) / (high - low) * cells).astype(int), cells - 1)
