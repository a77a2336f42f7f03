"""The search's grid rows that no layout rule rejects, as the tests of the columns model
start from them (:func:`planner.candidates.screening_grid` and its first rejections), and the
cluster, accelerator and jobs those tests share."""

import numpy as np

from hwspecs.catalog import load_accelerator, load_cluster
from planner.candidates import first_rejections, grid_columns, screening_grid
from planner.spec.job import Job
from planner.spec.model import load_model

DGX = load_cluster("dgx-h100")
H100 = load_accelerator("h100-sxm")
JOB = Job(model=load_model("llama3-8b"), seq_len=4096, global_batch_tokens=4096 * 256)
MOE_JOB = Job(model=load_model("mixtral-8x7b"), seq_len=4096, global_batch_tokens=4096 * 256)


def screened_grid(job, cluster, gpus: int, space) -> tuple[dict, np.ndarray, tuple]:
    """(grid columns, their cells, the grid's shape) of the rows no rule rejects."""
    grid = screening_grid(job, cluster, gpus, space)
    reasons, first = first_rejections(job, cluster, grid, space)
    alive = np.flatnonzero(first == len(reasons))
    return grid_columns(job, grid, alive), grid.cells[alive], grid.shape
