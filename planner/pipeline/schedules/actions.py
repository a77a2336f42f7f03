"""The vocabulary every schedule is written in: one :class:`Action` per unit of work.

A schedule is ``list[list[Action]]``: one ordered list per pipeline rank, in the order that
rank executes them. Nothing here knows about time; :mod:`planner.pipeline.simulate` times the lists.

Kinds follow the zero-bubble paper (Qi et al., ICLR 2024, §2): ``F`` forward, ``B`` the
input-gradient half of the backward, ``W`` the weight-gradient half, and ``BW`` the whole
backward when a schedule does not split it (torch calls these F, I, W and B).

Stage numbering is torch.distributed.pipelining's: the micro-batch's position along the
pipeline it flows through. Interleaved chunk ``c`` on rank ``r`` is stage ``c·pp + r``; the
V-shape schedules (ZB-V, DualPipeV) put stages ``r`` and ``2·pp − 1 − r`` on rank ``r``.
DualPipe runs two pipelines in opposite directions; see :mod:`planner.pipeline.schedules.dualpipe`
for how a micro-batch's direction is encoded.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import NamedTuple, TypeVar

from hwspecs.errors import PlanError

FORWARD = "F"
#: Input gradient only (zero-bubble "B"; torch's BACKWARD_INPUT, printed ``I``).
BACKWARD_INPUT = "B"
#: Weight gradient only (zero-bubble "W").
BACKWARD_WEIGHT = "W"
#: Input and weight gradient in one pass (torch's FULL_BACKWARD).
FULL_BACKWARD = "BW"

ACTION_KINDS: tuple[str, ...] = (FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FULL_BACKWARD)
#: The passes of a schedule that splits the backward, in their order for one micro-batch.
SPLIT_KINDS: tuple[str, str, str] = (FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)


class Action(NamedTuple):
    """One unit of work on one rank.

    ``fb_pair`` marks DualPipe's overlapped forward-and-backward pairs: it is ``True`` on
    both members, which sit next to each other in the rank's list with the ``F`` first;
    the simulator runs the two as one overlapped slot.
    """

    kind: str
    microbatch: int
    stage_index: int
    fb_pair: bool = False

    def __str__(self) -> str:
        return f"{self.stage_index}{self.kind}{self.microbatch}" + ("*" if self.fb_pair else "")


Schedule = list[list[Action]]

_new_tuple = tuple.__new__
_T = TypeVar("_T")


def as_actions(fields: Iterable[tuple[str, int, int, bool]]) -> list[Action]:
    """``Action(*f)`` for each ``f`` of ``fields``, by ``tuple.__new__`` mapped over them: a
    namedtuple's own ``__new__`` is a Python function (about 0.3 µs a call against 0.1
    here), and the long schedules the search simulates have 10^5 actions."""
    return list(map(_new_tuple, repeat(Action), fields))


def from_columns(kinds: list[str], microbatches: list[int], stages: list[int]) -> list[Action]:
    """The actions whose fields are the columns' entries, in order (none an F&B pair). A
    rank's actions built from its columns at once lie in memory in the order the event
    loop reads them."""
    return as_actions(zip(kinds, microbatches, stages, repeat(False, len(kinds)), strict=True))


def interleave(*runs: list[_T]) -> list[_T]:
    """Equal-length runs taken in turn: ``runs[0][0], runs[1][0], …, runs[0][1], …``."""
    merged = runs[0] * len(runs)  # the right length; every slot is overwritten below
    for offset, run in enumerate(runs):
        merged[offset :: len(runs)] = run
    return merged


def in_rounds(
    blocks: Iterable[tuple[Sequence[tuple[str, int]], int, Sequence[int]]],
) -> list[Action]:
    """The actions of blocks of rounds, one block after another (the form the 1F1B-like
    schedules are written in). A block ``(pattern, count, firsts)`` runs ``count`` rounds
    of one action per ``(kind, stage)`` of ``pattern``, in its order; the action in column
    ``j`` runs micro-batch ``firsts[j]`` in the first round, one more in each next."""
    kinds: list[str] = []
    microbatches: list[int] = []
    stages: list[int] = []
    for pattern, count, firsts in blocks:
        kinds += [kind for kind, _ in pattern] * count
        stages += [stage for _, stage in pattern] * count
        column = [0] * (len(pattern) * count)
        for offset, first in enumerate(firsts):
            column[offset :: len(pattern)] = range(first, first + count)
        microbatches += column
    return from_columns(kinds, microbatches, stages)


def require(condition: bool, message: str) -> None:
    """Raise :class:`PlanError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise PlanError(message)


def check_sizes(name: str, pp: int, num_microbatches: int) -> None:
    """The rules every schedule shares: at least one rank and one micro-batch."""
    require(pp >= 1, f"{name} needs pp ≥ 1, got pp={pp}")
    require(num_microbatches >= 1, f"{name} needs num_microbatches ≥ 1, got {num_microbatches}")


def check_vpp(name: str, vpp: int, allowed: int) -> None:
    """Schedules with a fixed number of chunks per rank reject any other vpp."""
    require(
        vpp == allowed,
        f"{name} holds exactly {allowed} chunk{'s' if allowed > 1 else ''} per rank "
        f"(vpp={allowed}), got vpp={vpp}",
    )
