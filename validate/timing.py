"""Timing one rank's repeated calls: throughput over a window (the calibration's compute
figures) and single calls after a barrier, with or without a compute burst before each
(its collectives)."""

from __future__ import annotations

import statistics
import time

#: Seconds each throughput sample runs for: long against the scheduler's time slices, so
#: ranks sharing a core show their share (a single short call would not).
WINDOW_S = 0.03


def throughput_seconds(fn, window_s: float = WINDOW_S, repetitions: int = 3) -> float:
    """Seconds per call of ``fn``: calls over a window of ``window_s``, median of samples."""
    fn()
    samples = []
    for _ in range(repetitions):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= window_s:
                break
        samples.append(elapsed / calls)
    return statistics.median(samples)


#: Calls timed per collective and message size.
REPETITIONS = 15
#: GEMMs of the compute burst before each timed collective: about 1 ms at one thread.
BURST_GEMMS = 20


def timed_calls(fn, sync, before=None, repetitions: int = REPETITIONS) -> list[float]:
    """Seconds of ``repetitions`` calls of ``fn``, each after ``sync()`` (a barrier over the
    ranks) and ``before()`` when given; one untimed call first."""
    fn()
    samples = []
    for _ in range(repetitions):
        sync()
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def compute_burst():
    """A fixed amount of compute (``BURST_GEMMS`` workload-sized GEMMs) to run before each
    timed collective, as a training step's collectives follow compute: every rank starts
    it together (a barrier before it) and arrives at the collective as its cores allow."""
    import torch

    generator = torch.Generator().manual_seed(0)
    a = torch.randn(128, 64, generator=generator)
    b = torch.randn(64, 192, generator=generator)

    def burst() -> None:
        for _ in range(BURST_GEMMS):
            torch.mm(a, b)

    return burst
