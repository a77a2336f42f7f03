"""Our schedules against torch.distributed.pipelining's own action lists.

torch builds its lists without a process group through
``torch.distributed.pipelining._schedule_visualizer.get_schedule_ops`` (mocked stages).
Its kinds map to ours as F → F, I (BACKWARD_INPUT) → B, W → W, B (FULL_BACKWARD) → BW,
and an OVERLAP_F_B action → our F&B pair (``fb_pair`` on both members, F first).
"""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("torch")

from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
from torch.distributed.pipelining.schedules import _ComputationType

from planner.pipeline.schedules import Action, generate_schedule
from planner.pipeline.simulate import simulate

pytestmark = pytest.mark.torch

KINDS = {
    _ComputationType.FORWARD: "F",
    _ComputationType.BACKWARD_INPUT: "B",
    _ComputationType.BACKWARD_WEIGHT: "W",
    _ComputationType.FULL_BACKWARD: "BW",
}


def torch_schedule(
    name: str, pp: int, num_microbatches: int, vpp: int | None = None
) -> list[list[Action]]:
    """torch's per-rank compute actions in execution order (its None spacers dropped)."""
    schedule = []
    for ops in get_schedule_ops(name, pp, num_microbatches, vpp):
        rank_ops = []
        for action in ops:
            if action is None:
                continue
            if action.computation_type == _ComputationType.OVERLAP_F_B:
                for sub in action.sub_actions:
                    rank_ops.append(
                        Action(
                            KINDS[sub.computation_type], sub.microbatch_index, sub.stage_index, True
                        )
                    )
            elif action.computation_type in KINDS:
                rank_ops.append(
                    Action(
                        KINDS[action.computation_type], action.microbatch_index, action.stage_index
                    )
                )
        schedule.append(rank_ops)
    return schedule


@pytest.mark.parametrize(
    ("pp", "num_microbatches", "vpp", "group_size"),
    [
        *(
            (pp, rounds * pp, vpp, None)
            for pp, vpp, rounds in itertools.product((2, 3, 4), (2, 3), (1, 2, 3))
        ),
        # torch's flexible rounds: N = m // max(1, m // pp) when that divides m.
        (4, 10, 2, 5),
        (3, 4, 2, 4),
        (2, 6, 4, 2),
    ],
)
def test_interleaved_1f1b_runs_torchs_order_on_every_rank(pp, num_microbatches, vpp, group_size):
    ours = generate_schedule(
        "interleaved-1f1b", pp, num_microbatches, vpp, microbatch_group_size=group_size
    )
    assert ours == torch_schedule("Interleaved1F1B", pp, num_microbatches, vpp)


def test_gpipe_runs_torchs_order():
    for pp, m in ((2, 3), (4, 8)):
        assert generate_schedule("gpipe", pp, m) == torch_schedule("GPipe", pp, m)


def test_1f1b_runs_torchs_order_except_its_last_rank_table():
    """torch's Schedule1F1B table numbers the last rank's forwards F1…Fm instead of
    F0…F(m−1), an off-by-one in the table (its runtime executes F0 first); the other ranks
    match our order exactly."""
    for pp, m in ((3, 6), (4, 8)):
        theirs = torch_schedule("1F1B", pp, m)
        assert generate_schedule("1f1b", pp, m)[:-1] == theirs[:-1]


@pytest.mark.parametrize(
    ("torch_name", "ours_name"), [("ZBVZeroBubble", "zbv"), ("DualPipeV", "dualpipev")]
)
@pytest.mark.parametrize(("pp", "num_microbatches"), [(2, 4), (3, 6), (4, 8), (4, 13)])
def test_torchs_v_schedules_are_no_faster_than_ours(torch_name, ours_name, pp, num_microbatches):
    """torch's ZB-V and DualPipeV lists, timed by our simulator, take at least our step
    time (today they are the same orders, so equal) for balanced and lopsided passes."""
    theirs = torch_schedule(torch_name, pp, num_microbatches, 2)
    ours = generate_schedule(ours_name, pp, num_microbatches, 2)
    assert sorted(a for ops in theirs for a in ops) == sorted(a for ops in ours for a in ops)
    for f, b, w, overlap in ((0.5, 0.5, 0.5, 0.0), (0.5, 0.7, 0.3, 1.0), (0.4, 1.0, 0.2, 0.5)):
        mine = simulate(ours, f, b, w, 0.05, overlap).step_time
        assert simulate(theirs, f, b, w, 0.05, overlap).step_time >= mine - 1e-9
