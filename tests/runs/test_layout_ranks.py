"""Published layouts in a full search of their own jobs (planner/runs/layout_ranks.py)."""

import pytest

from hwspecs.catalog import load_runs
from planner.api.search import rank_settings
from planner.runs.layout_ranks import (
    layout_job_key,
    one_row_per_job,
    published_layout_rank,
    summarize_ranks,
)

ROWS = {row.id: row for row in load_runs("train")}
SMALL = "nemo2407-h100-llama2-70b-pretrain-64g"  # TP4 PP4 DP4 on 64 H100s


def settings_of(accelerator, profile, seq_len):
    return rank_settings("robust", accelerator, profile, seq_len)


@pytest.fixture(scope="module")
def found():
    return published_layout_rank(ROWS[SMALL], settings_of)


def test_the_published_degrees_are_found_and_measured_against_the_fastest(found):
    assert found.published == {"tp": 4, "cp": 1, "pp": 4, "dp": 4, "ep": None}
    assert found.rank is not None and found.slower >= 0
    # A row holding them ties with the fastest exactly when the fastest of them is in the band.
    assert found.equivalent_to_best == (found.slower <= found.band + 1e-12)
    w = found.winner
    assert w["tp"] * w["cp"] * w["pp"] * w["dp"] == ROWS[SMALL].hardware.num_gpus == 64


def test_an_unpublished_degree_matches_any_value(found):
    row = ROWS[SMALL]
    loose = row.model_copy(update={"training": row.training.model_copy(update={"pp": None,
                                                                              "dp": None})})  # fmt: skip
    wider = published_layout_rank(loose, settings_of)
    assert wider.rank <= found.rank and wider.slower <= found.slower


def test_one_row_per_job_keeps_the_first_release_of_each_job():
    rows = [row for row in ROWS.values() if "qwen3-235b" in row.id and "gb300" in row.id]
    kept = one_row_per_job(rows)
    assert len({layout_job_key(row) for row in rows}) == len(kept) < len(rows)
    assert all(
        row is next(r for r in rows if layout_job_key(r) == layout_job_key(row)) for row in kept
    )


def test_the_summary_counts_first_places_ties_and_the_median_gap(found):
    summary = summarize_ranks("one", [found, found.model_copy(update={"rank": 1, "slower": 0.0,
                                                                      "equivalent_to_best": True})])  # fmt: skip
    assert summary.n == 2 and summary.first == (found.rank == 1) + 1
    assert summary.equivalent == found.equivalent_to_best + 1
    assert summary.median_slower == pytest.approx(found.slower / 2)
