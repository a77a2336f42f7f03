"""A search that keeps only what it ranks by (``every_output=False``, a plan that writes no
table) finds the same rows, in the same order, with the same values as one that keeps every
output; and the plan built on it is the same."""

import pandas as pd

from hwspecs.catalog import load_accelerator, load_cluster
from planner.api import build_job, plan
from planner.evaluate import FULL_PRECISION_OUTPUTS
from planner.search import LAYOUT_COLUMNS, search


def _searches():
    """Mixtral 8x7B on two DGX H100 nodes at 16K tokens: rows that cannot be placed, rows
    that do not fit (the smallest of them is reported) and TP, CP, EP and PP rows."""
    cluster = load_cluster("dgx-h100")
    job = build_job("mixtral-8x7b", 16384, global_batch_tokens=2**21)
    accelerator = load_accelerator(cluster.accelerator)
    return tuple(
        search(job, cluster, accelerator, 16, refine_top=3, every_output=every)
        for every in (True, False)
    )


def test_the_ranked_outputs_alone_are_the_same_rows_and_values():
    every, ranked = _searches()
    assert ranked.smallest_memory is not None and ranked.rejected == every.rejected
    assert any("does not fit" in reason for reason in ranked.rejected)
    for field in ("candidates_evaluated", "feasible", "smallest_memory"):
        assert getattr(ranked, field) == getattr(every, field)
    kept = list(ranked.table.columns)
    assert set(LAYOUT_COLUMNS) | FULL_PRECISION_OUTPUTS <= set(kept)
    assert len(kept) < len(every.table.columns) / 2  # the point: most outputs are not kept
    pd.testing.assert_frame_equal(ranked.table, every.table[kept], check_exact=True)


def test_a_plan_without_its_table_is_the_same_plan():
    job = build_job("mixtral-8x7b", 16384, global_batch_tokens=2**21)
    results = [
        plan(job, "dgx-h100", 16, None, top=3, refine_top=3, every_output=every)[0]
        for every in (True, False)
    ]
    assert results[0].model_dump() == results[1].model_dump()
