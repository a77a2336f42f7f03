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

from typing import NamedTuple

from hwspecs.errors import PlanError

FORWARD = "F"
#: Input gradient only (zero-bubble "B"; torch's BACKWARD_INPUT, printed ``I``).
BACKWARD_INPUT = "B"
#: Weight gradient only (zero-bubble "W").
BACKWARD_WEIGHT = "W"
#: Input and weight gradient in one pass (torch's FULL_BACKWARD).
FULL_BACKWARD = "BW"

ACTION_KINDS: tuple[str, ...] = (FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FULL_BACKWARD)


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


def new_action(kind: str, microbatch: int, stage_index: int, fb_pair: bool = False) -> Action:
    """``Action(kind, microbatch, stage_index, fb_pair)`` built by ``tuple.__new__``: a
    namedtuple's own ``__new__`` is a Python function (about 0.6 µs a call against 0.25),
    and the long schedules the search simulates have 10^5 actions."""
    return _new_tuple(Action, (kind, microbatch, stage_index, fb_pair))


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
