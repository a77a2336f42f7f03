"""The search's grid rows that no layout rule rejects, as the tests of the columns model
start from them (:func:`planner.candidates.screening_grid` and its rejection masks)."""

import numpy as np

from planner.candidates import rejection_masks, screening_grid


def screened_grid(job, cluster, gpus: int, space) -> tuple[dict, np.ndarray, tuple]:
    """(grid columns, their cells, the grid's shape) of the rows no rule rejects."""
    grid, cells, shape = screening_grid(job, cluster, gpus, space)
    alive = np.ones(len(cells), dtype=bool)
    for _, mask in rejection_masks(job, cluster, grid, space):
        alive &= ~np.asarray(mask, dtype=bool)
    return {key: value[alive] for key, value in grid.items()}, cells[alive], shape
