"""Pipeline schedules as data: one ordered action list per pipeline rank.

``generate_schedule(name, pp, num_microbatches, vpp)`` builds any schedule in
:data:`SCHEDULES`; :mod:`planner.pipeline.simulate` times the lists and
:mod:`planner.pipeline.closed_form` gives the O(1) forms the search uses.
"""

from planner.pipeline.schedules.actions import (
    ACTION_KINDS,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    FULL_BACKWARD,
    Action,
    Schedule,
)
from planner.pipeline.schedules.registry import (
    SCHEDULES,
    ScheduleSpec,
    generate_schedule,
    get_schedule,
)

__all__ = [
    "ACTION_KINDS",
    "BACKWARD_INPUT",
    "BACKWARD_WEIGHT",
    "FORWARD",
    "FULL_BACKWARD",
    "SCHEDULES",
    "Action",
    "Schedule",
    "ScheduleSpec",
    "generate_schedule",
    "get_schedule",
]
