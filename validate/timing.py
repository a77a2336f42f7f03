"""Throughput timing of one rank's repeated calls (the calibration's compute figures)."""

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
