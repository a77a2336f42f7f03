"""A search that reads only its first rows (``only_top``) times only the rows that can reach
them, and ranks the same first rows, with the same values, as the search that times every
row; the step-time floors it prunes by (with and without the communication no compute can
hide) are below every row's step time."""

import numpy as np
import pytest

from hwspecs.catalog import load_accelerator, load_cluster
from planner.api import build_job
from planner.api.inputs import with_profile
from planner.api.search import rank_settings
from planner.columns.codes import Labels
from planner.columns.layout import LayoutColumns
from planner.evaluate.indices import gpu_rates, row_tables
from planner.evaluate.time import exposed_comm_floor, step_time_floor
from planner.search import LAYOUT_COLUMNS, search

CASES = {  # name: (model, seq_len, global batch tokens, cluster, GPUs, profile, stack)
    "mixtral-ideal": ("mixtral-8x7b", 4096, 2**21, "dgx-h100", 32, None, None),
    "mixtral-profiled": ("mixtral-8x7b", 4096, 2**21, "dgx-h100", 32, "auto", None),
    "llama-megatron": ("llama3-70b", 8192, 2**22, "dgx-h100", 64, "auto", "megatron"),
}


def _job(name: str):
    model, seq_len, tokens, cluster_name, gpus, profile, stack = CASES[name]
    cluster = load_cluster(cluster_name)
    job = with_profile(
        build_job(model, seq_len, global_batch_tokens=tokens), cluster.accelerator, profile, stack
    )
    return job, cluster, load_accelerator(cluster.accelerator), gpus


def _same(a, b) -> bool:
    if isinstance(a, Labels) or isinstance(b, Labels):
        return list(Labels.of(a).strings()) == list(Labels.of(b).strings())
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize(("mode", "top"), [("robust", 5), ("time", 1)])
def test_the_rows_within_reach_are_the_first_rows_of_the_whole_ranking(name, mode, top):
    job, cluster, accelerator, gpus = _job(name)
    settings = rank_settings(mode, cluster.accelerator, job.efficiency_profile, job.seq_len)
    every, reached = (
        search(
            job,
            cluster,
            accelerator,
            gpus,
            refine_top=3,
            rank_settings=settings,
            every_output=False,
            only_top=only,
        )
        for only in (None, top)
    )
    for field in ("candidates_evaluated", "feasible", "rejected", "smallest_memory"):
        assert getattr(reached, field) == getattr(every, field)
    count = len(reached.column("rank"))
    assert top <= count < len(every.column("rank")) / 2  # the point: most rows are not timed
    assert set(reached.columns) == set(every.columns)
    for key, value in reached.columns.items():
        assert _same(value, every.column(key)[:count]), key


@pytest.mark.parametrize("name", list(CASES))
def test_the_step_time_floor_is_below_every_step_time(name):
    job, cluster, accelerator, gpus = _job(name)
    found = search(job, cluster, accelerator, gpus, refine_top=0)
    c = LayoutColumns.of({key: found.column(key) for key in LAYOUT_COLUMNS})
    rates, bf16_rates, tuned = gpu_rates(job, accelerator)
    shapes, structs = row_tables(job, c, rates, bf16_rates, tuned)
    floor = step_time_floor(job, accelerator, c, shapes, structs, rates)
    step = found.column("step_time_s")
    assert np.all(floor <= step * (1 + 1e-9))
    assert np.median(floor / step) > 0.2  # a floor that prunes: not far below the steps
    with_comm = floor + exposed_comm_floor(job, cluster, c, None)
    assert np.all(with_comm <= step * (1 + 1e-9))
    assert np.mean(with_comm > floor) > 0.5  # most rows expose some communication
