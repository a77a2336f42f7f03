"""The search's grid rows that no layout rule rejects, as the tests of the columns model
start from them (:func:`planner.candidates.screening_grid` and its first rejections)."""

import numpy as np

from planner.candidates import first_rejections, grid_columns, screening_grid


def screened_grid(job, cluster, gpus: int, space) -> tuple[dict, np.ndarray, tuple]:
    """(grid columns, their cells, the grid's shape) of the rows no rule rejects."""
    grid = screening_grid(job, cluster, gpus, space)
    reasons, first = first_rejections(job, cluster, grid, space)
    alive = np.flatnonzero(first == len(reasons))
    return grid_columns(job, grid, alive), grid.cells[alive], grid.shape
