"""The search's fast paths give what the plain ones give, exactly.

:func:`simulated_step_time` runs a lean event loop (``event_loop.last_end``): its step time
must equal :func:`simulate`'s (no hops, no F&B overlap) to the bit, for every schedule,
durations with ties and zeros included. The generators build each rank's actions at once
from columns laid out in blocks of rounds; each must give the order a plain transcription
of the schedule's loop gives (kept here as the reference), action for action.
"""

from __future__ import annotations

import itertools
import signal
from collections import deque

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hwspecs.errors import PlanError
from planner.pipeline.schedules import SCHEDULES, Action, generate_schedule
from planner.pipeline.schedules.dualpipe import _rank_ops as dualpipe_rank_ops
from planner.pipeline.schedules.interleaved import schedule_table
from planner.pipeline.simulate import simulate, simulated_step_time

# --- the step time ------------------------------------------------------------------------

#: Durations with exact ties (0.5, 1, 2 add up alike) and zeros among arbitrary ones.
DURATION = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.floats(0.0, 50.0))


@st.composite
def layouts(draw):
    """A legal (schedule, pp, m, vpp, options) of every registered schedule, pp up to 8."""
    name = draw(st.sampled_from(sorted(SCHEDULES)))
    spec = SCHEDULES[name]
    pp = draw(st.integers(1, 8))
    vpp = spec.fixed_vpp or draw(st.integers(spec.min_vpp, 4))
    m = draw(st.integers(1, 3 * pp + 4))
    options = {}
    if name == "interleaved-1f1b" and draw(st.booleans()):
        options["microbatch_group_size"] = draw(st.integers(pp, max(pp, m)))
    return name, pp, m, vpp, options


def generated(name, pp, m, vpp, options):
    try:
        return generate_schedule(name, pp, m, vpp, **options)
    except PlanError:
        assume(False)


def assert_same_step_time(schedule, f, b, w):
    expected = simulate(schedule, f, b, w).step_time
    assert simulated_step_time(schedule, f, b, w) == expected


@settings(max_examples=300, deadline=None)
@given(layouts(), st.data())
def test_step_time_equals_the_full_simulation_for_per_stage_durations(layout, data):
    schedule = generated(*layout)
    stages = max(a.stage_index for ops in schedule for a in ops) + 1
    f, b, w = (data.draw(st.lists(DURATION, min_size=stages, max_size=stages)) for _ in "fbw")
    assert_same_step_time(schedule, f, b, w)


@settings(max_examples=100, deadline=None)
@given(layouts(), DURATION, DURATION, DURATION)
def test_step_time_equals_the_full_simulation_for_one_duration_per_kind(layout, f, b, w):
    assert_same_step_time(generated(*layout), f, b, w)


@pytest.mark.parametrize(
    ("name", "pp", "m", "vpp"),
    [
        ("gpipe", 4, 6, 1),
        ("1f1b", 6, 3, 1),
        ("interleaved-1f1b", 4, 8, 3),
        ("zb-h1", 5, 12, 1),
        ("zb-h2", 5, 4, 1),
        ("zbv", 6, 7, 2),
        ("zbv", 8, 20, 2),
        ("dualpipe", 6, 14, 1),
        ("dualpipev", 5, 12, 2),
    ],
)
def test_step_time_equals_the_full_simulation_on_every_schedule(name, pp, m, vpp):
    """Lopsided stages (a slow last stage, a free weight pass) and all-zero ones."""
    stages = pp * vpp
    slow_last = [1.0] * (stages - 1) + [2.5]
    assert_same_step_time(generate_schedule(name, pp, m, vpp), slow_last, 0.7, [0.0] * stages)
    assert_same_step_time(generate_schedule(name, pp, m, vpp), 0.0, 0.0, 0.0)


def test_a_pairs_forward_row_may_end_last():
    """With a free backward, an F&B pair's forward row (its slot cut in the F's share,
    ``slot·F/(F+B)``) rounds to one ulp past the slot's end; here that row ends the step."""
    schedule = generate_schedule("dualpipev", 1, 2)
    f = [1.4973233688324525] * 2
    simulation = simulate(schedule, f, 0.0, 0.0)
    timeline = simulation.timeline
    split = timeline.fb_pair & (timeline.kind == 0)
    assert timeline.end[split].max() > timeline.end[~split].max()  # the premise
    assert simulated_step_time(schedule, f, 0.0, 0.0) == simulation.step_time


def test_ranks_parked_on_one_input_all_resume():
    """Ranks 0 and 1 both wait for rank 2's forward (a backward placed off its forward's
    rank): both run once it ends."""
    schedule = [
        [Action("F", 0, 1), Action("BW", 0, 1)],
        [Action("BW", 0, 0)],
        [Action("F", 0, 0)],
    ]
    f, b, w = [1.0, 2.0], [0.5, 0.25], [0.125, 0.0625]
    assert simulated_step_time(schedule, f, b, w) == simulate(schedule, f, b, w).step_time == 3.9375


@pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="needs SIGALRM to stop a loop")
def test_an_action_listed_twice_wakes_no_rank_twice():
    """Rank 1 runs F(0, 0) twice: the second must not wake rank 0 again, which by then
    waits for F(1, 0) (woken twice, it would park on that input behind itself and the
    loop would never end). An alarm turns such a loop into a failure."""
    schedule = [
        [Action("F", 0, 1), Action("BW", 0, 1), Action("F", 1, 1)],
        [
            Action("F", 0, 0),
            Action("BW", 0, 0),
            Action("F", 0, 0),
            Action("F", 2, 1),
            Action("F", 1, 0),
        ],
        [Action("F", 2, 0)],
    ]

    def stop(signum, frame):
        raise TimeoutError("the event loop did not end")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(2)
    try:
        fast = simulated_step_time(schedule, [1.0, 2.0], 0.5, 0.25)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert fast == simulate(schedule, [1.0, 2.0], 0.5, 0.25).step_time


def test_no_actions_take_no_time():
    assert simulated_step_time([[], []]) == simulate([[], []]).step_time == 0.0


def test_a_deadlock_raises_as_the_full_simulation_does():
    # Rank 1 waits for rank 0's gradient, rank 0 for rank 1's forward.
    schedule = [
        [Action("F", 0, 0), Action("BW", 0, 0)],
        [Action("BW", 0, 1), Action("F", 0, 1)],
    ]
    with pytest.raises(PlanError) as full:
        simulate(schedule)
    with pytest.raises(PlanError) as fast:
        simulated_step_time(schedule)
    assert str(fast.value) == str(full.value)


# --- the generators -------------------------------------------------------------------------


def zbv_reference(pp: int, m: int) -> list[list[Action]]:
    """ZB-V as torch's ScheduleZBVZeroBubble writes it: one loop per phase."""
    slots = max(m, 2 * pp - 1)
    schedule = []
    for rank in range(pp):
        ops, stages, f, b = [], (rank, 2 * pp - 1 - rank), [0, 0], [0, 0]

        def add(kind, chunk, mb, ops=ops, stages=stages):
            if mb < m:
                ops.append(Action(kind, mb, stages[chunk]))

        def forward(chunk, f=f):
            add("F", chunk, f[chunk])
            f[chunk] += 1

        def backward(chunk, weight=True, b=b):
            add("B", chunk, b[chunk])
            if weight:
                add("W", chunk, b[chunk])
            b[chunk] += 1

        for _ in range(2 * (pp - rank) - 1):
            forward(0)
        for _ in range(rank):
            forward(1)
            forward(0)
        for _ in range(pp - rank):
            forward(1)
            backward(1)
        while f[1] < f[0] or f[0] < slots:
            if f[0] < slots:
                forward(0)
            backward(0)
            forward(1)
            backward(1)
        w = list(b)
        for _ in range(rank):
            backward(0, weight=False)
            backward(1, weight=False)
        for _ in range(pp - rank):
            backward(0, weight=False)
            add("W", 0, w[0])
            w[0] += 1
        for chunk in (1, 0):
            for mb in range(w[chunk], b[chunk]):
                add("W", chunk, mb)
        schedule.append(ops)
    return schedule


def zero_bubble_reference(name: str, pp: int, m: int) -> list[list[Action]]:
    """ZB-H1 and ZB-H2 step by step: each B queues its W, run once ``lag`` more B's ran."""
    h1 = name == "zb-h1"
    slots = m if h1 else max(m, 2 * pp - 1)
    schedule = []
    for rank in range(pp):
        warmup = min(pp - rank - 1, m) if h1 else 2 * (pp - rank) - 1
        lag = rank if h1 else 2 * rank
        ops, pending, done = [Action("F", mb, rank) for mb in range(warmup)], deque(), [0]

        def backward(ops=ops, pending=pending, done=done, lag=lag, rank=rank):
            ops.append(Action("B", done[0], rank))
            pending.append(done[0])
            done[0] += 1
            if len(pending) > lag:
                ops.append(Action("W", pending.popleft(), rank))

        for mb in range(warmup, slots):
            if h1:
                ops.append(Action("F", mb, rank))
                backward()
            else:
                backward()
                ops.append(Action("F", mb, rank))
        while done[0] < slots:
            backward()
        ops += [Action("W", mb, rank) for mb in pending]
        schedule.append([a for a in ops if a.microbatch < m])
    return schedule


def one_f_one_b_reference(name: str, pp: int, m: int) -> list[list[Action]]:
    """GPipe and 1F1B: warm-up forwards, one F and one BW per step, the BW drain."""
    schedule = []
    for rank in range(pp):
        warmup = m if name == "gpipe" else min(pp - rank - 1, m)
        ops = [Action("F", mb, rank) for mb in range(warmup)]
        for step in range(m - warmup):
            ops += [Action("F", warmup + step, rank), Action("BW", step, rank)]
        schedule.append(ops + [Action("BW", mb, rank) for mb in range(m - warmup, m)])
    return schedule


def interleaved_reference(pp: int, m: int, vpp: int, group: int) -> list[list[Action]]:
    """Megatron's table walked forwards and, chunks reversed, backwards."""
    table = schedule_table(m, vpp, group)
    schedule = []
    for rank in range(pp):
        warmup = min(2 * (pp - rank - 1) + (vpp - 1) * group, len(table))
        order = [("F", i) for i in range(warmup)]
        for step in range(len(table) - warmup):
            order += [("F", warmup + step), ("BW", step)]
        order += [("BW", i) for i in range(len(table) - warmup, len(table))]
        schedule.append(
            [
                Action(
                    kind,
                    table[i][0],
                    (table[i][1] if kind == "F" else vpp - 1 - table[i][1]) * pp + rank,
                )
                for kind, i in order
            ]
        )
    return schedule


def dualpipe_reference(name: str, pp: int, m: int) -> list[list[Action]]:
    """DualPipe(V) from the shared per-rank steps, mapped one action at a time."""
    schedule = []
    for rank in range(pp):
        ops = []
        if name == "dualpipev":
            steps = dualpipe_rank_ops(pp, rank, m)
        else:
            steps = dualpipe_rank_ops(pp // 2, min(rank, pp - 1 - rank), m // 2)
        for kind, phase, mb, pair in steps:
            if name == "dualpipev":
                ops.append(Action(kind, mb, (rank, 2 * pp - 1 - rank)[phase], pair))
            else:
                direction = phase ^ (rank >= pp // 2)
                stage = rank if direction == 0 else pp - 1 - rank
                ops.append(Action(kind, mb + direction * (m // 2), stage, pair))
        schedule.append(ops)
    return schedule


def reference(name: str, pp: int, m: int, vpp: int, group: int | None = None):
    if name == "zbv":
        return zbv_reference(pp, m)
    if name in ("zb-h1", "zb-h2"):
        return zero_bubble_reference(name, pp, m)
    if name in ("gpipe", "1f1b"):
        return one_f_one_b_reference(name, pp, m)
    if name == "interleaved-1f1b":
        return interleaved_reference(pp, m, vpp, group or pp)
    return dualpipe_reference(name, pp, m)


def legal_layouts(pp_values, extra_m=()):
    """Every schedule at each pp, m from 1 past 2p−1 (fewer, and not multiples, included)."""
    for name, spec in SCHEDULES.items():
        for pp in pp_values:
            for m in sorted({*range(1, 2 * pp + 4), *extra_m}):
                for vpp in [spec.fixed_vpp] if spec.fixed_vpp else [2, 3]:
                    if not spec.broken_microbatches(pp, m):
                        yield name, pp, m, vpp


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_generators_give_the_reference_order(name):
    count = 0
    for case in legal_layouts(range(1, 11), extra_m=(24, 31, 40)):
        if case[0] == name:
            got = generate_schedule(*case)
            assert got == reference(*case), case
            assert all(type(a) is Action for ops in got for a in ops)
            count += 1
    assert count > 0


@pytest.mark.parametrize("name", ["zbv", "zb-h1", "zb-h2", "1f1b", "dualpipev"])
@pytest.mark.parametrize(("pp", "m"), [(16, 20), (32, 64), (64, 127)])
def test_generators_give_the_reference_order_on_long_pipelines(name, pp, m):
    if name == "dualpipev":
        m = max(m, 2 * pp)
    vpp = SCHEDULES[name].fixed_vpp
    assert generate_schedule(name, pp, m, vpp) == reference(name, pp, m, vpp)


def test_interleaved_gives_the_reference_order_for_llama3_group_sizes():
    for pp, m, vpp in itertools.product(range(1, 6), range(1, 16), (2, 3)):
        for group in range(pp, m + 1):
            remainder = m % group
            if remainder == 0 or remainder >= pp:
                options = {"microbatch_group_size": group}
                got = generate_schedule("interleaved-1f1b", pp, m, vpp, **options)
                assert got == interleaved_reference(pp, m, vpp, group), (pp, m, vpp, group)
