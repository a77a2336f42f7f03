"""Schedule generators: every action once, on the right rank, in an order that can run."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwspecs.errors import PlanError
from planner.pipeline.schedules import SCHEDULES, Action, generate_schedule, get_schedule
from planner.pipeline.schedules.dualpipe import direction_of
from planner.pipeline.schedules.interleaved import schedule_table
from planner.pipeline.simulate import simulate

#: (name, pp, num_microbatches, vpp) covering each schedule's shapes, small and odd ones.
CASES = [
    ("gpipe", 1, 1, 1),
    ("gpipe", 4, 6, 1),
    ("1f1b", 4, 8, 1),
    ("1f1b", 5, 3, 1),
    ("interleaved-1f1b", 4, 8, 2),
    ("interleaved-1f1b", 3, 6, 3),
    ("interleaved-1f1b", 2, 2, 4),
    ("zb-h1", 4, 8, 1),
    ("zb-h1", 6, 2, 1),
    ("zb-h2", 4, 8, 1),
    ("zb-h2", 5, 3, 1),
    ("zbv", 4, 8, 2),
    ("zbv", 3, 2, 2),
    ("zbv", 1, 3, 2),
    ("dualpipe", 4, 8, 1),
    ("dualpipe", 6, 14, 1),
    ("dualpipe", 2, 4, 1),
    ("dualpipev", 4, 8, 2),
    ("dualpipev", 3, 7, 2),
    ("dualpipev", 1, 2, 2),
]


def stage_rank(name: str, pp: int, stage: int, microbatch: int, num_microbatches: int) -> int:
    """Where torch (and the DualPipe reference) put a stage."""
    if name in ("zbv", "dualpipev"):
        return stage if stage < pp else 2 * pp - 1 - stage
    if name == "dualpipe":
        return stage if direction_of(microbatch, num_microbatches) == 0 else pp - 1 - stage
    return stage % pp


def check_dependencies(schedule: list[list[Action]]) -> None:
    """Every action starts after its inputs end (unit durations, one hop of 0.5)."""
    simulation = simulate(schedule, 1.0, 1.0, 1.0, comm=0.5)
    rows = simulation.timeline.rows()
    done = {(kind, mb, stage): end for _, stage, mb, kind, _, end in rows}
    last = simulation.num_stages - 1
    for _, stage, mb, kind, start, _ in rows:
        if kind == "F" and stage > 0:
            assert start >= done[("F", mb, stage - 1)]
        if kind in ("B", "BW"):
            assert start >= done[("F", mb, stage)]
            if stage < last:
                grad = done.get(("B", mb, stage + 1), done.get(("BW", mb, stage + 1)))
                assert start >= grad
        if kind == "W":
            assert start >= done[("B", mb, stage)]


@pytest.mark.parametrize(("name", "pp", "m", "vpp"), CASES)
def test_every_microbatch_stage_and_pass_appears_exactly_once(name, pp, m, vpp):
    schedule = generate_schedule(name, pp, m, vpp)
    assert len(schedule) == pp
    counts = Counter((a.microbatch, a.stage_index, a.kind) for ops in schedule for a in ops)
    assert max(counts.values()) == 1
    stages = pp * vpp
    for mb in range(m):
        for stage in range(stages):
            kinds = {kind for kind in ("F", "B", "W", "BW") if (mb, stage, kind) in counts}
            assert kinds in ({"F", "BW"}, {"F", "B", "W"}), (mb, stage, kinds)
    assert sum(counts.values()) == sum(len(ops) for ops in schedule)


@pytest.mark.parametrize(("name", "pp", "m", "vpp"), CASES)
def test_stages_sit_on_torchs_ranks(name, pp, m, vpp):
    schedule = generate_schedule(name, pp, m, vpp)
    for rank, ops in enumerate(schedule):
        for action in ops:
            assert stage_rank(name, pp, action.stage_index, action.microbatch, m) == rank


@pytest.mark.parametrize(("name", "pp", "m", "vpp"), CASES)
def test_each_rank_runs_its_actions_after_their_inputs(name, pp, m, vpp):
    check_dependencies(generate_schedule(name, pp, m, vpp))


def test_unsplit_schedules_use_full_backward_and_split_ones_weight_passes():
    for name, spec in SCHEDULES.items():
        kinds = {a.kind for ops in generate_schedule(name, 4, 8) for a in ops}
        assert ("W" in kinds) == spec.splits_backward, name


def test_dualpipe_marks_overlapped_pairs_forward_first():
    for name in ("dualpipe", "dualpipev"):
        for ops in generate_schedule(name, 4, 12):
            flags = [a.fb_pair for a in ops]
            assert any(flags)
            i = 0
            while i < len(ops):
                if ops[i].fb_pair:
                    assert ops[i].kind == "F" and ops[i + 1].fb_pair and ops[i + 1].kind == "BW"
                    i += 2
                else:
                    i += 1


def test_dualpipe_sends_half_the_microbatches_each_way():
    schedule = generate_schedule("dualpipe", 4, 8)
    assert {a.microbatch for a in schedule[0] if a.kind == "F" and a.stage_index == 0} == {
        0,
        1,
        2,
        3,
    }
    assert {a.microbatch for a in schedule[3] if a.kind == "F" and a.stage_index == 0} == {
        4,
        5,
        6,
        7,
    }


def test_interleaved_table_groups_n_microbatches_per_chunk():
    # Megatron-LM's own example: PP2 N3 M5 VP2.
    assert schedule_table(5, 2, 3) == [
        (0, 0),
        (1, 0),
        (2, 0),
        (0, 1),
        (1, 1),
        (2, 1),
        (3, 0),
        (4, 0),
        (3, 1),
        (4, 1),
    ]


def test_interleaved_accepts_llama3_group_size():
    schedule = generate_schedule("interleaved-1f1b", 4, 10, 2, microbatch_group_size=5)
    check_dependencies(schedule)


def test_vpp_defaults_per_schedule():
    assert {name: spec.resolve_vpp(None) for name, spec in SCHEDULES.items()} == {
        "gpipe": 1,
        "1f1b": 1,
        "interleaved-1f1b": 2,
        "zb-h1": 1,
        "zb-h2": 1,
        "zbv": 2,
        "dualpipe": 1,
        "dualpipev": 2,
    }
    assert get_schedule("interleaved-1f1b").allows_vpp(5)
    assert not get_schedule("zbv").allows_vpp(3)


@pytest.mark.parametrize(
    ("call", "rule"),
    [
        (lambda: generate_schedule("2f2b", 4, 8), "did you mean"),
        (lambda: generate_schedule("1f1b", 0, 8), "pp ≥ 1"),
        (lambda: generate_schedule("1f1b", 4, 0), "num_microbatches ≥ 1"),
        (lambda: generate_schedule("1f1b", 4, 8, 2), "vpp = 1"),
        (lambda: generate_schedule("zbv", 4, 8, 1), "vpp = 2"),
        (lambda: generate_schedule("interleaved-1f1b", 4, 8, 1), "vpp ≥ 2"),
        (lambda: generate_schedule("interleaved-1f1b", 4, 10, 2), "multiple of pp"),
        (
            lambda: generate_schedule("interleaved-1f1b", 4, 8, 2, microbatch_group_size=3),
            "pp ≤ microbatch_group_size",
        ),
        (
            lambda: generate_schedule("interleaved-1f1b", 4, 10, 2, microbatch_group_size=8),
            "mod microbatch_group_size",
        ),
        (lambda: generate_schedule("1f1b", 4, 8, microbatch_group_size=4), "does not take option"),
        (lambda: generate_schedule("dualpipe", 3, 12), "even pp"),
        (lambda: generate_schedule("dualpipe", 4, 9), "even num_microbatches ≥ 2·pp"),
        (lambda: generate_schedule("dualpipe", 4, 6), "even num_microbatches ≥ 2·pp"),
        (lambda: generate_schedule("dualpipev", 4, 7), "num_microbatches ≥ 2·pp"),
    ],
)
def test_each_rule_fails_with_a_one_line_error_naming_it(call, rule):
    with pytest.raises(PlanError) as error:
        call()
    assert rule in str(error.value)
    assert "\n" not in str(error.value)


@st.composite
def schedule_cases(draw):
    name = draw(st.sampled_from(sorted(SCHEDULES)))
    spec = SCHEDULES[name]
    pp = draw(st.integers(1, 6))
    vpp = spec.fixed_vpp or draw(st.integers(2, 3))
    if name == "dualpipe":
        pp = 2 * draw(st.integers(1, 3))
        m = 2 * draw(st.integers(pp, pp + 4))
    elif name == "dualpipev":
        m = draw(st.integers(2 * pp, 2 * pp + 6))
    elif name == "interleaved-1f1b":
        m = pp * draw(st.integers(1, 3))
    else:
        m = draw(st.integers(1, 12))
    stages = pp * vpp
    times = st.floats(0.0, 3.0, allow_nan=False)
    f = draw(st.lists(st.floats(0.05, 3.0), min_size=stages, max_size=stages))
    b = draw(st.lists(times, min_size=stages, max_size=stages))
    w = draw(st.lists(times, min_size=stages, max_size=stages))
    comm = draw(st.floats(0.0, 1.0))
    overlap = draw(st.floats(0.0, 1.0))
    return name, pp, m, vpp, f, b, w, comm, overlap


@settings(max_examples=60, deadline=None)
@given(schedule_cases())
def test_bubble_is_never_negative_and_ranks_never_overlap(case):
    name, pp, m, vpp, f, b, w, comm, overlap = case
    schedule = generate_schedule(name, pp, m, vpp)
    simulation = simulate(schedule, f, b, w, comm, overlap)
    assert simulation.bubble_time >= 0
    assert 0 <= simulation.bubble_fraction <= 1
    assert simulation.step_time >= max(simulation.busy_time) - 1e-9
    assert simulation.pipelined_step_time <= simulation.step_time + 1e-9
    timeline = simulation.timeline
    for rank in range(pp):
        mask = timeline.rank == rank
        starts, ends = timeline.start[mask], timeline.end[mask]
        assert (starts[1:] >= ends[:-1] - 1e-9).all()
