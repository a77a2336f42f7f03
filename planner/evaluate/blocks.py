"""Blocks of rows evaluated on a few threads, their results handed back in block order.

The search evaluates its rows in blocks (:data:`planner.evaluate.TIMED_BLOCK_ROWS`), each
block's numbers independent of the others' and almost all of the work numpy loops, which
release the interpreter lock: two blocks run on two cores at once. :func:`in_block_order`
runs a pure function over the blocks on :func:`worker_threads` threads and yields the
results in block order, so whatever the caller assembles from them (the columns, their
dtypes, the progress it reports) is what a loop over the blocks in order would give.
:func:`beside` runs one piece of numpy work on a thread of its own while the caller works
in Python (the evaluation's per-shape tables beside the rows' combination indices).

What the block functions keep between calls — ``cost.compute._GEMM_TIMES``, the
``structure.memo.per_model`` caches ``structure.params._BUSIEST`` and
``structure.stages._PIPELINES``, ``comm.topology._PLACEMENTS`` and ``_GROUP_FIELDS``, each
placement's ``derived`` CP groups and inner degree, ``comm.context_parallel._CP_GROUPS``,
``comm.cost_tables._GROUP_COSTS``, and the catalog loaders' ``functools.cache`` — is filled by
building a value whole and then storing it in one assignment (a dict's get, set and clear
are each atomic), and read into a local before use, never read back after a store that a
``clear`` from another thread could undo: two threads can at worst compute the same value
twice, and an entry is never seen half-built. A new cache the blocks fill must do the same.
``tests/search/test_threads.py`` checks that threaded and sequential searches give the same
outputs from cold caches.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from hwspecs.errors import PlanError

#: The environment variable that sets the number of threads (1: one block after another).
THREADS_VARIABLE = "LLMPLAN_THREADS"
#: Most threads by default: each holds one block's temporaries (about 10^8 bytes).
MAX_DEFAULT_THREADS = 4

Block = TypeVar("Block")
Result = TypeVar("Result")


def worker_threads() -> int:
    """Threads the blocks run on: :data:`THREADS_VARIABLE` when set, else the CPUs this
    process may run on (its affinity where the system reports it), at most
    :data:`MAX_DEFAULT_THREADS`."""
    given = os.environ.get(THREADS_VARIABLE, "").strip()
    if given:
        if not given.isdigit() or int(given) < 1:
            raise PlanError(
                f"{THREADS_VARIABLE} must be a whole number of threads, 1 or more "
                f"(1: one block after another); got {given!r}",
                field=THREADS_VARIABLE,
                allowed="an integer >= 1",
                got=given,
            )
        return int(given)
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this system (macOS, Windows)
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_DEFAULT_THREADS))


def row_blocks(num_rows: int, block_rows: int) -> list[slice]:
    """Consecutive slices of at most ``block_rows`` rows covering ``num_rows`` rows; one
    empty slice when there are none (an empty evaluation still has its outputs)."""
    if num_rows == 0:
        return [slice(0, 0)]
    return [slice(start, min(start + block_rows, num_rows))
            for start in range(0, num_rows, block_rows)]  # fmt: skip


def in_blocks(
    work: Callable[[slice], Result], num_rows: int, block_rows: int, threads: int | None = None
) -> Iterator[tuple[slice, Result]]:
    """(block, ``work(block)``) for consecutive blocks of ``block_rows`` rows (the last may
    be shorter) of ``num_rows`` rows, in row order, ``threads`` blocks worked on at once
    (default :func:`worker_threads`; :func:`in_block_order`)."""
    threads = worker_threads() if threads is None else threads
    blocks = row_blocks(num_rows, block_rows)
    return zip(blocks, in_block_order(work, blocks, threads), strict=True)


def in_block_order(
    work: Callable[[Block], Result], blocks: Sequence[Block], threads: int
) -> Iterator[Result]:
    """``work(block)`` of each of ``blocks`` (slices of rows, or any independent pieces of
    work), yielded in their order, ``threads`` at once. With one thread, or one block, no
    pool: each block is worked out in the calling thread as it is asked for. With more, the
    first block is worked out in the calling thread, then the others on ``threads`` threads,
    a block starting when the one ``threads`` before it has been taken, so at most
    ``threads`` blocks' results and temporaries are alive at once, however slowly they are
    taken.
    ``work`` must not depend on the order the blocks are worked out in."""
    if threads <= 1 or len(blocks) <= 1:
        yield from map(work, blocks)
        return
    # The first block alone: it fills most of what the blocks cache (placements, cost
    # tables, pipelines), which threads starting together would each work out.
    yield work(blocks[0])
    pool = ThreadPoolExecutor(threads, thread_name_prefix="llmplan-block")
    try:
        pending = deque()
        for block in blocks[1:]:
            if len(pending) == threads:  # one block's result taken before the next starts
                yield pending.popleft().result()
            pending.append(pool.submit(work, block))
        while pending:
            yield pending.popleft().result()
    finally:  # taken to the end, stopped early or failed: no thread outlives the call
        pool.shutdown(wait=True, cancel_futures=True)


def beside(work: Callable[[], Result], threads: int | None = None) -> Callable[[], Result]:
    """``work()`` started on a thread of its own while the caller goes on, where there is
    more than one thread (``threads``, default :func:`worker_threads`); the function
    returned waits for it and gives its result (or raises its error). With one thread the
    work runs in the calling thread when that function is called. For numpy work (which
    releases the interpreter lock) beside Python work; ``work`` must read nothing the
    caller changes meanwhile."""
    threads = worker_threads() if threads is None else threads
    if threads <= 1:
        return work
    pool = ThreadPoolExecutor(1, thread_name_prefix="llmplan-beside")
    try:
        future = pool.submit(work)
    finally:
        pool.shutdown(wait=False)  # the thread ends with the work
    return future.result
