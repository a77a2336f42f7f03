"""Interleaved 1F1B (Narayanan et al., SC'21 §2.2), in Megatron-LM's order, with Llama 3's N.

Each rank holds ``v`` chunks; chunk ``c`` on rank ``r`` is stage ``c·p + r``. Forwards walk a
table of (micro-batch, chunk) pairs in groups of ``N`` contiguous micro-batches: the group's
micro-batches through chunk 0, then through chunk 1, …; backwards walk the same table with
the chunks reversed (Megatron-LM ``get_schedule_table``). Rank ``r`` warms up with
``2(p−r−1) + (v−1)·N`` forwards, then alternates one forward and one backward.

``N`` defaults to ``p`` (Megatron's classic schedule, which needs ``m`` a multiple of ``p``).
Llama 3 (arXiv 2407.21783 §3.3.2) makes ``N`` tunable; as in Megatron-LM's
``microbatch_group_size_per_vp_stage`` it must lie in ``[p, m]`` and the last group must be
empty or hold at least ``p`` micro-batches. Bubble ``(p−1)(F+B+W)/v``.
"""

from __future__ import annotations

from itertools import repeat
from operator import add
from typing import TypeVar

from planner.pipeline.schedules.actions import (
    FORWARD,
    FULL_BACKWARD,
    Schedule,
    check_sizes,
    from_columns,
    interleave,
    require,
)

NAME = "interleaved-1f1b"
_T = TypeVar("_T")


def schedule_table(num_microbatches: int, vpp: int, group_size: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) in forward order: groups of ``group_size`` micro-batches per chunk."""
    table: list[tuple[int, int]] = []
    for first in range(0, num_microbatches, group_size):
        group = range(first, min(first + group_size, num_microbatches))
        table.extend((mb, chunk) for chunk in range(vpp) for mb in group)
    return table


def check_group_size(pp: int, num_microbatches: int, group_size: int | None) -> int:
    """Resolve Llama 3's ``N`` (contiguous micro-batches per chunk) and check its rules."""
    if group_size is None:
        require(
            num_microbatches % pp == 0,
            f"{NAME} needs num_microbatches to be a multiple of pp (got {num_microbatches} "
            f"and pp={pp}), or a microbatch_group_size N with pp ≤ N ≤ num_microbatches",
        )
        return pp
    require(
        pp <= group_size <= num_microbatches,
        f"{NAME} needs pp ≤ microbatch_group_size ≤ num_microbatches, got N={group_size} "
        f"with pp={pp} and num_microbatches={num_microbatches}",
    )
    remainder = num_microbatches % group_size
    require(
        remainder == 0 or remainder >= pp,
        f"{NAME} needs num_microbatches mod microbatch_group_size to be 0 or ≥ pp, got "
        f"{num_microbatches} mod {group_size} = {remainder} with pp={pp}",
    )
    return group_size


def interleaved_1f1b(
    pp: int, num_microbatches: int, vpp: int = 2, microbatch_group_size: int | None = None
) -> Schedule:
    """Per-rank actions of interleaved 1F1B with ``vpp`` chunks per rank."""
    check_sizes(NAME, pp, num_microbatches)
    require(vpp >= 2, f"{NAME} needs vpp ≥ 2 chunks per rank, got vpp={vpp} (use 1f1b)")
    group_size = check_group_size(pp, num_microbatches, microbatch_group_size)
    table = schedule_table(num_microbatches, vpp, group_size)
    total = len(table)
    microbatches = [mb for mb, _ in table]
    forward_stages = [chunk * pp for _, chunk in table]  # rank 0's; rank r adds r
    backward_stages = [(vpp - 1 - chunk) * pp for _, chunk in table]
    kinds = [FORWARD] * total, [FULL_BACKWARD] * total
    schedule: Schedule = []
    for rank in range(pp):
        stages = [list(map(add, base, repeat(rank))) for base in (forward_stages, backward_stages)]
        warmup = min(2 * (pp - rank - 1) + (vpp - 1) * group_size, total)
        schedule.append(
            from_columns(
                _in_1f1b_order(*kinds, warmup),
                _in_1f1b_order(microbatches, microbatches, warmup),
                _in_1f1b_order(*stages, warmup),
            )
        )
    return schedule


def _in_1f1b_order(forwards: list[_T], backwards: list[_T], warmup: int) -> list[_T]:
    """A column of a rank's actions from its forwards' and backwards' (in table order):
    ``warmup`` forwards, then one forward and one backward per step, then the backwards left."""
    steady = len(forwards) - warmup
    return (
        forwards[:warmup] + interleave(forwards[warmup:], backwards[:steady]) + backwards[steady:]
    )
