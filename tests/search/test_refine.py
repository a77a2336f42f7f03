"""The search's top rows re-timed by the event simulator (planner.refine)."""

from __future__ import annotations

import numpy as np
import pytest

from hwspecs.catalog import load_accelerator, load_cluster
from planner import api
from planner.estimate import layout_columns
from planner.evaluate import evaluate_columns
from planner.refine import simulated_pipeline_time, stage_durations
from planner.search import SearchSpace, search
from planner.spec.layout import Layout

CLUSTER = load_cluster("dgx-h100")
H100 = load_accelerator("h100-sxm")
JOB = api.build_job("llama3-8b", 4096, global_batch_size=64)


def _row(layout):
    m = layout.resolved_num_microbatches(JOB.global_batch_size)
    row = evaluate_columns(JOB, CLUSTER, H100, layout_columns(layout, m))
    return {key: value[0] for key, value in row.items()}, m


@pytest.mark.parametrize(
    ("schedule", "vpp"), [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1)]
)
def test_lighter_stages_never_lengthen_the_pipeline(schedule, vpp):
    """Every stage takes at most the busiest rank's time, so the simulated pipeline is no
    longer than the closed form on the busiest rank (exact for uniform stages)."""
    layout = Layout(pp=4, dp=2, vpp=vpp, schedule=schedule)
    row, m = _row(layout)
    simulated = simulated_pipeline_time(JOB, layout, H100, row, m)
    assert simulated <= row["pipeline_time_s"] * (1 + 1e-9)
    assert simulated > 0.9 * row["pipeline_time_s"]  # the ends differ, the middle does not


def test_stage_durations_sum_to_the_ranks():
    layout = Layout(pp=4, dp=2, vpp=2, schedule="interleaved-1f1b")
    f, b, w, per_rank = stage_durations(JOB, layout, H100)
    stage_rank = np.arange(len(f)) % layout.pp
    totals = np.bincount(stage_rank, weights=f + b + w, minlength=layout.pp)
    assert np.allclose(totals, per_rank)


def test_the_top_rows_are_ranked_by_their_simulated_step():
    space = SearchSpace(tp=[1], cp=[1], micro_batch_size=[1], zero_stage=[1], recompute=["none"])
    found = search(JOB, CLUSTER, H100, 8, space, refine_top=4)
    table = found.table
    head = table["step_time_simulated_s"].to_numpy()[:4]
    assert np.all(np.isfinite(head)) and np.all(np.diff(head) >= 0)
    assert table["step_time_simulated_s"].iloc[4:].isna().all()
    unrefined = search(JOB, CLUSTER, H100, 8, space, refine_top=0).table
    assert set(map(tuple, unrefined.head(4)[["pp", "schedule"]].to_numpy())) == set(
        map(tuple, table.head(4)[["pp", "schedule"]].to_numpy())
    )
