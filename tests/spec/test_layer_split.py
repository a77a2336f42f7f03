"""The work-balanced layer split against brute force, against ``auto``, and on DeepSeek-V3
(whose LM head and MTP module sit on the last stage)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwspecs.errors import PlanError
from planner.pipeline.schedules.registry import BIDIRECTIONAL_SCHEDULES
from planner.spec.layout import end_stage_work, layers_per_virtual_stage, virtual_stage_ranks
from planner.spec.model import load_model
from planner.spec.work_balance import rank_work, work_balanced_layers

#: (schedule, vpp): one chunk, interleaved, V-shape, bidirectional.
PLACEMENTS = [("1f1b", 1), ("interleaved-1f1b", 2), ("zbv", 2), ("dualpipe", 1)]
#: (schedule, vpp) of the extra layers' placement test: every way stages sit on ranks.
EXTRA_PLACEMENTS = [("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 3),
                    ("interleaved-1f1b", 8), ("zbv", 2), ("dualpipev", 2), ("dualpipe", 1)]  # fmt: skip


def busiest_rank(layers, ends, schedule, pp, vpp) -> float:
    """The most work a pipeline rank does per micro-batch, written out rank by rank."""
    work = np.asarray(layers, dtype=float)
    work[0] += ends[0]
    work[-1] += ends[1]
    per_rank = np.zeros(pp)
    for stage, rank in enumerate(virtual_stage_ranks(schedule, pp, vpp)):
        per_rank[rank] += work[stage]
    if schedule in BIDIRECTIONAL_SCHEDULES:
        per_rank = [(per_rank[r] + per_rank[pp - 1 - r]) / 2 for r in range(pp)]
    return max(per_rank)


def every_split(num_layers: int, stages: int):
    """Every split with at least one layer on each middle stage (the ends may hold none)."""
    for cuts in itertools.combinations_with_replacement(range(num_layers + 1), stages - 1):
        layers = np.diff([0, *cuts, num_layers])
        if (layers[1:-1] >= 1).all():
            yield layers


@pytest.mark.parametrize("num_layers", range(3, 15))
@pytest.mark.parametrize("pp", [2, 3, 4])
@pytest.mark.parametrize("last", [0.0, 0.6, 1.7, 3.2, 6.0])
def test_one_chunk_split_is_the_best_of_every_split(num_layers, pp, last):
    """One stage per rank: no split of the layers has a less busy rank (brute force)."""
    ends = (0.0, last)
    try:
        split = work_balanced_layers(num_layers, pp, 1, ends, "1f1b")
    except PlanError:  # only where auto cannot split them either
        with pytest.raises(PlanError):
            layers_per_virtual_stage(num_layers, pp, 1, "auto")
        return
    assert split.sum() == num_layers and (split[1:-1] >= 1).all()
    best = min(busiest_rank(s, ends, "1f1b", pp, 1) for s in every_split(num_layers, pp))
    assert busiest_rank(split, ends, "1f1b", pp, 1) == pytest.approx(best)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 130),
    st.sampled_from([1, 2, 4, 8, 16]),
    st.sampled_from(PLACEMENTS),
    st.floats(0, 1),
    st.floats(0, 8),
)
def test_never_busier_than_auto_and_light_ends_keep_auto(num_layers, pp, placement, first, last):
    schedule, vpp = placement
    try:
        auto = layers_per_virtual_stage(num_layers, pp, vpp, "auto")
    except PlanError:
        with pytest.raises(PlanError):
            work_balanced_layers(num_layers, pp, vpp, (first, last), schedule)
        return
    split = work_balanced_layers(num_layers, pp, vpp, (first, last), schedule)
    assert split.sum() == num_layers and len(split) == pp * vpp and (split >= 0).all()
    ends = (first, last)
    assert (
        busiest_rank(split, ends, schedule, pp, vpp)
        <= busiest_rank(auto, ends, schedule, pp, vpp) + 1e-9
    )
    if schedule == "1f1b":  # auto already has the least busy stage without ends
        np.testing.assert_array_equal(work_balanced_layers(num_layers, pp, 1, (0, 0), "1f1b"), auto)


def test_deepseek_v3_head_is_one_and_a_half_layers_of_its_37b_active_parameters():
    """DeepSeek-V3 §1: 37B activated parameters per token over 61 layers, the embedding
    and the head (129,280 × 7,168 each): the head is about 1.6 layers' matmuls."""
    model = load_model("deepseek-v3").model_copy(update={"num_mtp_modules": 0})
    head = 129_280 * 7_168
    published = head / ((37e9 - 2 * head) / 61)
    assert end_stage_work(model)[1] == pytest.approx(published, rel=0.05)


def test_deepseek_v3_dualpipe_split_unloads_the_rank_with_both_ends():
    """PP 16 DualPipe: rank 0 holds the first stage and the last (head and MTP module).
    ``auto`` gives both ends 3 layers, so rank 0 does about 5.2 layers of work per micro-
    batch against the middle ranks' 4; the work-balanced split brings the busiest rank
    within half a layer of the mean ((61 + the ends) / 16)."""
    model = load_model("deepseek-v3")
    ends = end_stage_work(model)
    auto = layers_per_virtual_stage(61, 16, 1, "auto")
    split = layers_per_virtual_stage(61, 16, 1, "work-balanced", ends, "dualpipe")
    assert busiest_rank(auto, ends, "dualpipe", 16, 1) > 5
    mean = (61 + sum(ends)) / 16
    assert busiest_rank(split, ends, "dualpipe", 16, 1) < mean + 0.5


def test_plan_explains_the_split_and_what_it_gains_over_auto():
    """``plan --explain``'s split line: the counts in stage order (runs written n×k) and
    the busiest rank's work under auto's split and the chosen one, as brute force counts
    them rank by rank."""
    from planner.explain import layer_split_lines

    model = load_model("deepseek-v3")
    layout = {"pp": 16, "vpp": 1, "schedule": "dualpipe", "pipeline_layer_split": "work-balanced"}
    (line,) = layer_split_lines(model, {"layout": layout})
    ends = end_stage_work(model)
    split = layers_per_virtual_stage(61, 16, 1, "work-balanced", ends, "dualpipe")
    auto = layers_per_virtual_stage(61, 16, 1, "auto")
    assert line.startswith(f"layers per virtual stage: {split[0]}, ")
    assert "auto's 3, 4×13, 3×2" in line
    assert f"{busiest_rank(auto, ends, 'dualpipe', 16, 1):.2f} layers' work" in line
    assert f"against {busiest_rank(split, ends, 'dualpipe', 16, 1):.2f}" in line
    llama = load_model("llama3-405b")  # light ends: auto's split, nothing to compare
    layout = {"pp": 16, "vpp": 1, "schedule": "1f1b", "pipeline_layer_split": "work-balanced"}
    assert layer_split_lines(llama, {"layout": layout}) == [
        "layers per virtual stage: 7, 8×14, 7 (work-balanced)"
    ]


@pytest.mark.parametrize("pp", [4, 8, 16])
@pytest.mark.parametrize("per_stage", [2, 3, 4])
@pytest.mark.parametrize(("schedule", "vpp"), [("dualpipe", 1), ("zbv", 2)])
def test_paired_stages_get_one_extra_layer_per_rank(pp, per_stage, schedule, vpp):
    """Where a rank holds two stages (DualPipe's directions, the V), L = S·k + ranks' worth
    of extra layers splits with one extra per rank: the busiest rank does 2k + 1 layers
    (DualPipe: their mean, k + ½), where the balanced run of extras in the middle stacks
    two on the central ranks."""
    extras = pp // 2 if schedule == "dualpipe" else pp  # DualPipe: one per pair of ranks
    layers = pp * vpp * per_stage + extras
    split = work_balanced_layers(layers, pp, vpp, (0.0, 0.0), schedule)
    assert split.sum() == layers
    expected = per_stage + 0.5 if schedule == "dualpipe" else 2 * per_stage + 1
    assert busiest_rank(split, (0, 0), schedule, pp, vpp) == pytest.approx(expected)
    auto = layers_per_virtual_stage(layers, pp, vpp, "auto")
    assert busiest_rank(auto, (0, 0), schedule, pp, vpp) > expected


def extras_one_at_a_time(layers, extra, ends, pp: int, vpp: int, schedule: str):
    """The extra layers placed one step at a time, as the split first placed them: each step,
    every candidate's rank work worked out afresh (:func:`rank_work`) and its least busy
    untaken middle stage taken (the central one first among equals, then the lower index)."""
    layers = layers.copy()
    stages = layers.shape[1]
    rank_of_stage = virtual_stage_ranks(schedule, pp, vpp)
    centre = np.abs(np.arange(stages) - (stages - 1) / 2)
    taken = np.zeros(layers.shape, dtype=bool)
    taken[:, [0, -1]] = True
    for step in range(int(extra.max(initial=0))):
        stage_work = rank_work(layers, ends, pp, vpp, schedule)[:, rank_of_stage] + centre * 1e-6
        stage_work[taken] = np.inf
        pick = np.argmin(stage_work, axis=1)
        rows = np.flatnonzero(extra > step)
        layers[rows, pick[rows]] += 1
        taken[rows, pick[rows]] = True
    return layers


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from([2, 3, 4, 5, 6, 8, 16]),
    st.sampled_from(EXTRA_PLACEMENTS),
    st.sampled_from([0.0, 0.5, 1.0]) | st.floats(0, 2),
    st.sampled_from([0.0, 1.0, 2.0, 3.0]) | st.floats(0, 8),
    st.data(),
)
def test_extras_placed_at_once_are_those_placed_one_at_a_time(pp, placement, first, last, data):
    """The sorted-keys placement of the extra layers equals placing them one step at a
    time, on every placement of the stages: one chunk, interleaved, V-shape and DualPipe's
    two directions (odd PP: a rank that is its own mirror), from any middle stages (the
    split's are all alike); integer ends make the ties (equal work on two ranks) that go to
    the lower stage index."""
    from planner.spec.work_balance import _extras_on_least_busy_ranks

    schedule, vpp = placement
    stages = pp * vpp
    if stages < 3:
        return
    candidates = data.draw(st.integers(1, 12))
    ints = st.lists(st.integers(0, 9), min_size=candidates, max_size=candidates)
    layers = np.zeros((candidates, stages), dtype=np.int64)
    layers[:, 0], layers[:, -1] = data.draw(ints), data.draw(ints)
    middle = st.lists(st.integers(0, 3), min_size=stages - 2, max_size=stages - 2)
    layers[:, 1:-1] = [data.draw(middle) for _ in range(candidates)]  # the split's: all alike
    extra = np.array(
        data.draw(st.lists(st.integers(0, stages - 3), min_size=candidates, max_size=candidates))
    )
    args = (layers, extra, (first, last), pp, vpp, schedule)
    np.testing.assert_array_equal(_extras_on_least_busy_ranks(*args), extras_one_at_a_time(*args))
