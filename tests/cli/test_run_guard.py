"""The test run's own guard (tests/conftest.py): a run whose tests left a thread blocked ends
with a failure naming it and its stack instead of waiting for it; threads that end within the
grace change nothing."""

import subprocess
import sys

from tests.cli_runner import ROOT
from tests.conftest import LEFT_THREADS_EXIT_CODE, THREAD_GRACE_S

LEAVES_A_BLOCKED_THREAD = """
import threading

def test_leaves_a_thread_waiting_for_ever():
    never = threading.Event()
    threading.Thread(target=never.wait, name="left-waiting").start()
"""

LEAVES_A_THREAD_THAT_ENDS = """
import threading
import time

def test_leaves_a_thread_that_ends_soon():
    threading.Thread(target=time.sleep, args=(0.5,), name="ends-soon").start()
"""


def _pytest(tmp_path, source: str) -> subprocess.CompletedProcess:
    """pytest on one test file with the project's conftest as its only plugin."""
    (tmp_path / "test_case.py").write_text(source)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-c", str(tmp_path / "pytest.ini"), str(tmp_path / "test_case.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=120 + THREAD_GRACE_S,
    )  # fmt: skip


def test_a_blocked_thread_ends_the_run_with_its_name_and_stack(tmp_path):
    done = _pytest(tmp_path, LEAVES_A_BLOCKED_THREAD)
    assert "1 passed" in done.stdout  # the summary first: the tests' own result is printed
    assert done.returncode == LEFT_THREADS_EXIT_CODE, done.stderr
    assert "1 thread(s) still running" in done.stderr
    assert "thread 'left-waiting'" in done.stderr and "in wait" in done.stderr


def test_threads_that_end_within_the_grace_leave_the_result_alone(tmp_path):
    done = _pytest(tmp_path, LEAVES_A_THREAD_THAT_ENDS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "still running" not in done.stderr
