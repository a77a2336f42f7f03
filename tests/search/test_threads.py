"""The search's blocks of rows on several threads (planner.evaluate.blocks): the same outputs,
in the same order, as one block after another."""

import threading
import time

import numpy as np
import pandas as pd
import pytest

import planner.evaluate
from hwspecs.catalog import load_accelerator, load_cluster
from hwspecs.errors import PlanError
from planner.api import build_job
from planner.comm import context_parallel, cost_tables, topology
from planner.cost import compute
from planner.evaluate.blocks import (
    THREADS_VARIABLE,
    beside,
    in_block_order,
    in_blocks,
    row_blocks,
    worker_threads,
)
from planner.search import search
from planner.structure import params, stages
from tests.cli_runner import run

#: Every cache a block of rows fills (module-level, kept over calls).
BLOCK_CACHES = (compute._GEMM_TIMES, params._BUSIEST, stages._PIPELINES, topology._PLACEMENTS,
                topology._GROUP_FIELDS, context_parallel._CP_GROUPS, cost_tables._GROUP_COSTS)  # fmt: skip


def _search(monkeypatch, threads: str):
    """Mixtral 8x7B on two DGX H100 nodes at 16K tokens (TP, CP, EP and PP rows, groups
    within and across nodes) in blocks of 2,048 rows, with cold caches."""
    monkeypatch.setattr(planner.evaluate, "TIMED_BLOCK_ROWS", 2**11)
    monkeypatch.setenv(THREADS_VARIABLE, threads)
    for cache in BLOCK_CACHES:
        cache.clear()
    cluster = load_cluster("dgx-h100")
    job = build_job("mixtral-8x7b", 16384, global_batch_tokens=2**21)
    calls = []
    found = search(
        job, cluster, load_accelerator(cluster.accelerator), 16, refine_top=2,
        progress=lambda *call: calls.append(call),
    )  # fmt: skip
    return found, calls


def test_threaded_search_gives_the_sequential_search_exactly(monkeypatch):
    threaded, threaded_calls = _search(monkeypatch, "4")
    sequential, sequential_calls = _search(monkeypatch, "1")
    assert sequential.feasible > 6 * 2**11  # many timed blocks (and more screened ones)
    pd.testing.assert_frame_equal(threaded.table, sequential.table, check_exact=True)
    assert [threaded.table[k].dtype for k in threaded.table] == [
        sequential.table[k].dtype for k in sequential.table
    ]
    for field in ("candidates_evaluated", "feasible", "rejected", "smallest_memory"):
        assert getattr(threaded, field) == getattr(sequential, field)
    assert threaded_calls == sequential_calls  # the progress: the same reports, in order
    for phase in ("memory screen", "timing"):
        done = [d for p, d, _ in threaded_calls if p == phase]
        assert len(done) > 8 and done == sorted(done)


def test_blocks_come_back_in_order_when_later_ones_finish_first():
    def work(rows: slice):
        time.sleep(0.05 if rows.start == 3 else 0.0)  # the first on the threads is the slowest
        return rows.start, threading.current_thread().name

    blocks = row_blocks(10, 3)
    assert blocks == [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 10)]
    results = list(in_block_order(work, blocks, threads=3))
    assert [start for start, _ in results] == [0, 3, 6, 9]
    here = threading.current_thread().name  # the first block alone, then the threads
    assert results[0][1] == here and all(name != here for _, name in results[1:])
    assert [rows for rows, _ in in_blocks(work, 10, 3, threads=2)] == blocks


def test_one_thread_or_one_block_runs_in_the_calling_thread():
    def work(rows: slice):
        return threading.current_thread().name

    here = threading.current_thread().name
    assert list(in_block_order(work, row_blocks(10, 3), threads=1)) == [here] * 4
    assert list(in_block_order(work, row_blocks(3, 3), threads=4)) == [here]
    assert row_blocks(0, 3) == [slice(0, 0)]  # an empty evaluation still has its one block


def test_no_more_blocks_are_alive_than_threads_however_slowly_they_are_taken():
    started = []

    def work(rows: slice):
        started.append(rows.start)
        return np.arange(rows.start, rows.stop)

    blocks = row_blocks(100, 1)
    taken = in_block_order(work, blocks, threads=2)
    first = next(taken)
    time.sleep(0.05)  # time for the threads to start whatever they were given
    assert first.tolist() == [0] and len(started) <= 2
    assert [int(block[0]) for block in taken] == list(range(1, 100))


def test_a_failing_block_raises_in_the_caller():
    def work(rows: slice):
        if rows.start == 6:
            raise ValueError("block 6")
        return rows.start

    with pytest.raises(ValueError, match="block 6"):
        list(in_block_order(work, row_blocks(30, 3), threads=2))


def test_work_beside_runs_on_its_own_thread_and_its_result_or_error_comes_back():
    here = threading.current_thread().name
    release = threading.Event()

    def work():
        assert release.wait(5)  # the caller goes on while this waits
        return threading.current_thread().name

    result = beside(work, threads=2)
    release.set()
    assert result() != here

    def failing():
        raise ValueError("beside")

    with pytest.raises(ValueError, match="beside"):
        beside(failing, threads=2)()


def test_work_beside_with_one_thread_runs_in_the_caller_when_asked():
    ran = []
    result = beside(lambda: ran.append(threading.current_thread().name) or len(ran), threads=1)
    assert ran == []  # nothing runs before it is asked for
    assert result() == 1 and ran == [threading.current_thread().name]


def test_thread_count_comes_from_the_variable_else_the_cpus_at_most_four(monkeypatch):
    monkeypatch.setenv(THREADS_VARIABLE, "3")
    assert worker_threads() == 3
    monkeypatch.delenv(THREADS_VARIABLE)
    assert 1 <= worker_threads() <= 4
    for bad in ("0", "two", "-1", "1.5"):
        monkeypatch.setenv(THREADS_VARIABLE, bad)
        with pytest.raises(PlanError, match=THREADS_VARIABLE):
            worker_threads()


def test_cli_names_a_bad_thread_count_in_one_line(monkeypatch, capsys):
    monkeypatch.setenv(THREADS_VARIABLE, "many")
    code, out, err = run(capsys, "plan", "--model", "llama3-8b", "--gpus", "8",
                         "--cluster", "dgx-h100")  # fmt: skip
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and THREADS_VARIABLE in err and "'many'" in err
