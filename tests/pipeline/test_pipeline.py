"""The event simulator and the schedule report, on cases small enough to check by hand."""

from __future__ import annotations

import numpy as np
import pytest

from hwspecs.errors import PlanError
from planner.pipeline.report import schedule_report
from planner.pipeline.schedules import Action, generate_schedule
from planner.pipeline.simulate import p2p_time, simulate


def test_1f1b_pp4_m8_takes_33_units_and_holds_4_3_2_1_microbatches():
    """The issue's acceptance check: F = B = W = 1, so a full backward takes 2."""
    report = schedule_report("1f1b", 4, 8, f=1, b=1, w=1)
    assert report.step_time == 33
    assert report.peak_activations == [4, 3, 2, 1]
    assert report.bubble_time == 9
    assert report.bubble_fraction == pytest.approx(9 / 33)
    assert report.bubble_ratio == pytest.approx(3 / 8)


def test_report_dumps_the_issue_json_fields_first():
    dump = schedule_report("zbv", 2, 4).model_dump()
    assert list(dump)[:10] == [
        "schedule",
        "pp",
        "microbatches",
        "vpp",
        "step_time",
        "bubble_time",
        "bubble_fraction",
        "peak_activations",
        "parameter_copies",
        "timeline",
    ]
    assert dump["vpp"] == 2
    assert list(dump["timeline"][0]) == [
        "rank",
        "stage_index",
        "microbatch",
        "action",
        "start",
        "end",
    ]
    assert {row["action"] for row in dump["timeline"]} == {"F", "B", "W"}


def test_chunks_take_their_share_of_a_ranks_time():
    report = schedule_report("interleaved-1f1b", 2, 2, vpp=2, f=1, b=1, w=1)
    first = report.timeline[0]
    assert first.end - first.start == 0.5
    assert report.peak_activations[0] == pytest.approx(2.0)  # all 4 chunks: 2 micro-batches


def test_per_stage_durations_slow_the_pipeline_at_the_slow_stage():
    schedule = generate_schedule("1f1b", 4, 8)
    uniform = simulate(schedule, 1.0, 1.0, 1.0)
    lm_head = simulate(schedule, [1, 1, 1, 2], [1, 1, 1, 2], [1, 1, 1, 2])
    assert lm_head.busy_time == [24, 24, 24, 48]
    assert lm_head.step_time > uniform.step_time
    with pytest.raises(PlanError, match="per-stage values"):
        simulate(schedule, [1, 1, 1], 1.0, 1.0)


def test_a_hop_delays_the_next_stage_but_not_within_a_rank():
    two_ranks = [[Action("F", 0, 0), Action("BW", 0, 0)], [Action("F", 0, 1), Action("BW", 0, 1)]]
    sim = simulate(two_ranks, 1.0, 1.0, 0.0, comm=0.25)
    assert sim.step_time == 4.5  # F, hop, F, BW, hop, BW
    one_rank = [[Action("F", 0, 0), Action("F", 0, 1), Action("BW", 0, 1), Action("BW", 0, 0)]]
    assert simulate(one_rank, 1.0, 1.0, 0.0, comm=0.25).step_time == 4.0


def test_p2p_time_is_latency_plus_bytes_over_bandwidth():
    assert p2p_time(1e-5, 16e6, 50e9) == pytest.approx(1e-5 + 3.2e-4)


def test_overlap_shortens_dualpipe_pairs():
    serial = schedule_report("dualpipe", 4, 8, overlap_fb=0.0)
    hidden = schedule_report("dualpipe", 4, 8, overlap_fb=1.0)
    assert hidden.step_time < serial.step_time
    assert serial.parameter_copies == 2
    with pytest.raises(PlanError, match="overlap_fb"):
        schedule_report("dualpipe", 4, 8, overlap_fb=1.5)


def test_weight_pending_is_counted_apart_from_activations():
    report = schedule_report("zb-h1", 4, 8)
    assert report.peak_activations == [4, 3, 2, 1]  # as 1F1B
    assert report.peak_weight_pending[-1] > 0  # the last rank lags its W by p−1
    assert schedule_report("1f1b", 4, 8).peak_weight_pending == [0, 0, 0, 0]


def test_a_schedule_that_waits_on_itself_is_reported_as_a_deadlock():
    stuck = [[Action("BW", 0, 0), Action("F", 0, 0)]]
    with pytest.raises(PlanError, match="deadlocks"):
        simulate(stuck)


def test_timeline_columns_and_rows_agree():
    sim = simulate(generate_schedule("zb-h2", 3, 5))
    rows = sim.timeline.rows()
    assert len(rows) == len(sim.timeline) == 3 * 5 * 3
    assert rows[0] == (0, 0, 0, "F", 0.0, 1.0)
    assert np.all(sim.timeline.end >= sim.timeline.start)
