"""How the search reports its progress: a callback, never a print.

The search runs in labelled phases (:data:`PHASES`); within a phase it calls
``progress(phase, done, total)`` with counts of that phase's own unit (rows of layouts,
or layouts simulated), once when the phase starts (``done`` 0) and after each chunk of work
(the memory screen and the timing: each block of :data:`planner.evaluate.TIMED_BLOCK_ROWS`
rows, in row order whatever the threads, :mod:`planner.evaluate.blocks`), always from the
thread that called the search; a ``total`` of
0 means not known yet (the enumeration, before it has counted the rows). A front end
turns that into a bar whose rate, and so whose estimate of the time left, is the phase's.
"""

from __future__ import annotations

from collections.abc import Callable

#: ``progress(phase, done, total)``: one of :data:`PHASES`, units done and in the phase.
Progress = Callable[[str, int, int], None]

#: The search's phases in the order it runs them, with the unit each one counts.
PHASES = {
    "enumerating layouts": "rows",
    "memory screen": "rows",
    "timing": "rows",
    "ranking": "rows",
    "simulating the top rows": "layouts",
}


def report(progress: Progress | None, phase: str, done: int, total: int) -> None:
    """Call ``progress`` (if any) for ``phase``; ``phase`` must be one of :data:`PHASES`."""
    if progress is not None:
        progress(phase, int(done), int(total))
