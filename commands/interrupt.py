"""Ctrl-C and SIGTERM: end within a second, leave no child process behind.

:func:`install` makes both signals raise :class:`Interrupted` (a ``BaseException``, so no
``except Exception`` swallows it and every ``finally`` still runs); the CLI then calls
:func:`kill_descendants` and exits with 128 + the signal number (130 for SIGINT, 143 for
SIGTERM), as shells report a process ended by that signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time


class Interrupted(BaseException):
    """The user (SIGINT) or the system (SIGTERM) asked the command to stop."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def _raise(signum, frame):
    # Restore the defaults first: a second Ctrl-C while cleaning up ends the process at once.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise Interrupted(signum)


def install() -> None:
    """SIGINT and SIGTERM raise :class:`Interrupted` in the main thread."""
    signal.signal(signal.SIGINT, _raise)
    signal.signal(signal.SIGTERM, _raise)


def restore() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def descendants(pid: int | None = None) -> list[int]:
    """Every process below ``pid`` (default: this one), children first, from ``/proc``."""
    root = os.getpid() if pid is None else pid
    parents: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:  # not Linux: multiprocessing's own children are all we can see
        import multiprocessing

        return [child.pid for child in multiprocessing.active_children() if child.pid]
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        # the command name is in parentheses and may hold spaces: the ppid follows its ')'
        fields = stat[stat.rfind(")") + 2 :].split()
        parents.setdefault(int(fields[1]), []).append(int(entry))
    found, queue = [], [root]
    while queue:
        for child in parents.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def kill_descendants(grace_s: float = 0.5) -> None:
    """Freeze every descendant (SIGSTOP), then SIGKILL them all and reap them within
    ``grace_s``. Frozen first, none of them reacts to the others' end: multiprocessing's
    resource tracker, for one, would relaunch itself and print a traceback when the workers
    it tracks vanish."""
    pids = descendants()
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if _alive(pid)]
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass  # not our direct child: ask the kernel whether it still exists
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
