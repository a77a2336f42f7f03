"""What every test run shares: a run ends when its tests end.

The interpreter joins every non-daemon thread before it exits, so a thread a test left
blocked (a library's reader on a pipe some leftover process still holds open) would keep
the run, and CI, waiting after its summary with nothing said. After the last test the run
gives such threads :data:`THREAD_GRACE_S` seconds, then names each with its stack and ends
with :data:`LEFT_THREADS_EXIT_CODE`: a failure that says what was left, not a hang."""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

import pytest

#: Seconds the run waits, after its last test, for the threads its tests left to end.
THREAD_GRACE_S = 10.0
#: The run's exit code when a thread is still running after the grace (pytest uses 0-5).
LEFT_THREADS_EXIT_CODE = 6


def left_threads() -> list[threading.Thread]:
    """The running non-daemon threads other than the main one: those the interpreter
    would wait for at exit."""
    return [thread for thread in threading.enumerate()
            if thread is not threading.main_thread() and not thread.daemon
            and thread.is_alive()]  # fmt: skip


def left_threads_report(threads: list[threading.Thread]) -> str:
    """Each thread's name and where it is (its stack), for the run's last lines."""
    frames = sys._current_frames()
    lines = [f"{len(threads)} thread(s) still running {THREAD_GRACE_S:g} s after the last test:"]
    for thread in threads:
        lines.append(f"thread {thread.name!r} (target {getattr(thread, '_target', None)!r}):")
        frame = frames.get(thread.ident)
        lines.extend(
            line.rstrip() for line in (traceback.format_stack(frame) if frame else ["  (no frame)"])
        )
    return "\n".join(lines) + "\n"


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """After the summary: wait out the grace, then report and end if threads are left."""
    deadline = time.monotonic() + THREAD_GRACE_S
    for thread in left_threads():
        thread.join(max(0.0, deadline - time.monotonic()))
    threads = left_threads()
    if threads:
        sys.stdout.flush()
        sys.stderr.write(left_threads_report(threads))
        sys.stderr.flush()
        os._exit(LEFT_THREADS_EXIT_CODE)
