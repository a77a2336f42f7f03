"""llmplan's command line: a thin typer app over :mod:`planner.api`.

Each command parses its flags (declared once in :mod:`commands.flags`), calls one API
function and renders the result as a rich table or, with ``--json``, as the result's JSON.

The error contract (:mod:`commands.errors`): a problem with the input, a usage error
included, is one line ``error: ...`` on stderr naming the flag and what it allows, exit
code 2, and with ``--json`` also ``{"error": {"message", "field", "allowed", "got"}}`` on
stdout. Ctrl-C or SIGTERM ends the command within a second with one line, exit code 130 or
143, and no child process left (:mod:`commands.interrupt`). Heavy imports (pandas, plotly,
the planner) happen inside the commands so that ``llmplan --help`` starts fast.
"""

from __future__ import annotations

import copy
import gc
import os
import signal
import sys
import warnings

import typer


def _stopped_while_starting(signum, frame) -> None:
    """Ctrl-C or SIGTERM while the commands import: one line, no traceback (main() installs
    the full handler, :mod:`commands.interrupt`, once they are in)."""
    sys.stderr.write(f"error: interrupted by {signal.Signals(signum).name}; stopped\n")
    sys.stderr.flush()
    os._exit(128 + signum)


#: glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
#: Blocks freed below this stay with the process and are reused (1 GiB; glibc's own
#: threshold grows to 32 MiB at most): the search frees and allocates arrays of 10-100 MiB
#: by the hundred, and each fresh mapping is paid again in page faults.
_KEPT_BYTES = 2**30


#: The collector's thresholds for one command (as mypy sets them for one run,
#: ``mypy/build.py``): the search allocates Python objects by the 10^5 (its shape and
#: structure tables, the event simulator), few of them in cycles, and at CPython's default
#: (700, 10, 10) collected 210 times a default plan and 270 times a DeepSeek-V3 one; a
#: command's process ends when it is done. Measured 2026-12-04 on the 2-core machine, whole
#: process against the same tree without it, 8 pairs: the default plan 1.05 -> 1.00 s
#: (0.95x); DeepSeek-V3's no change beyond the machine's spread (1.02x, 0.90-1.14).
_GC_THRESHOLDS = (200_000, 30, 30)


def _malloc_for_the_search() -> None:
    """Where the C library is glibc (Linux): one malloc arena for the process, and freed
    memory kept for reuse, not handed back to the system (each unless the environment sets
    the glibc variable, ``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_THRESHOLD_`` or
    ``MALLOC_TRIM_THRESHOLD_``).

    One arena: glibc gives each thread that allocates an arena of its own, which keeps what
    that thread freed, so the search's block threads (:mod:`planner.evaluate.blocks`) would
    each keep a block's freed temporaries (DeepSeek-V3 plan peak 1.61 GB on one thread,
    1.78-1.81 GB on two, 1.69 GB on two with one arena). Kept memory: arrays up to
    :data:`_KEPT_BYTES` come from the heap, and the heap is not trimmed below 2 GiB, so an
    array allocated after another is freed reuses its pages rather than faulting in new ones
    (DeepSeek-V3's plan: system time 0.51 -> 0.37 s, wall 5% less, peak memory the same)."""
    if not sys.platform.startswith("linux"):
        return
    import contextlib
    import ctypes

    settings = (
        ("MALLOC_ARENA_MAX", _M_ARENA_MAX, 1),
        ("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, _KEPT_BYTES),
        ("MALLOC_TRIM_THRESHOLD_", _M_TRIM_THRESHOLD, 2 * _KEPT_BYTES - 1),
    )
    with contextlib.suppress(OSError, AttributeError):  # not glibc: its own allocator
        mallopt = ctypes.CDLL("libc.so.6").mallopt
        for variable, parameter, value in settings:
            if variable not in os.environ:
                mallopt(parameter, value)


def set_up_process() -> None:
    """A command's process as the search runs best in it, before any thread allocates:
    glibc's malloc as :func:`_malloc_for_the_search` sets it, the imports' objects frozen
    (they live as long as the process: no collection scans them) and the collector's
    :data:`_GC_THRESHOLDS`. ``benchmarks/search_speed.py`` sets up its own process so."""
    _malloc_for_the_search()
    gc.freeze()
    gc.set_threshold(*_GC_THRESHOLDS)


if __name__ == "__main__":
    for _signal in (signal.SIGINT, signal.SIGTERM):
        signal.signal(_signal, _stopped_while_starting)

from commands.common import app  # noqa: E402

# Importing the command modules registers their commands on the app, in this order.
# isort: off
from commands import plan, memory, schedule, network, validation, catalog, runs, sweep  # noqa: E402, F401
# isort: on


def _wants_json(argv: list[str]) -> bool:
    """``--json`` among the options (before a ``--`` that ends them)."""
    options = argv[: argv.index("--")] if "--" in argv else argv
    return "--json" in options


def _subcommand(command, argv: list[str]):
    """The (sub)command ``argv`` names, for mapping an error's field to its flag."""
    for word in argv:
        found = getattr(command, "commands", {}).get(word)
        if found is None:
            if not word.startswith("-") and getattr(command, "commands", None):
                return command
            continue
        command = found
    return command


def _warning_line(shown):
    """A user's-file warning (hwspecs.errors.UnsourcedFigures) as one ``warning:`` line on
    stderr; other warnings as Python shows them."""
    from hwspecs.errors import UnsourcedFigures

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, UnsourcedFigures):
            sys.stderr.write(f"warning: {message}\n")
        else:
            shown(message, category, filename, lineno, file, line)

    return show


def _command_for(argv: list[str]):
    """The app's click command, holding only the (sub)command that ``argv`` opens with when
    it names one, else all of them (help, a mistyped name, options first).

    Click builds a command's options when its group is built: all fourteen cost 17 ms of a
    default plan's 0.8 s, the plan command alone about 4 (click's documented remedy is a
    group that loads the invoked subcommand lazily). What the one command parses, prints
    and reports is the same as in the whole app."""
    name = argv[0] if argv else None
    commands = [
        info
        for info in app.registered_commands
        if (info.name or typer.main.get_command_name(info.callback.__name__)) == name
    ]
    groups = [info for info in app.registered_groups if info.name == name]
    if not commands and not groups:
        return typer.main.get_command(app)
    only = copy.copy(app)
    only.registered_commands, only.registered_groups = commands, groups
    return typer.main.get_command(only)


#: Seconds a command's process waits, its output written, for threads still running (a
#: library's: kaleido's readers of its browser's log run until the browser's last helper
#: process has gone) before it ends without them.
END_THREADS_S = 10.0


def _end_process(code: int) -> int:
    """End a command's process with ``code`` without the interpreter's teardown: the output
    flushed, the threads joined and the exit handlers run as the interpreter runs them at
    exit, then ``os._exit``, which skips freeing every object and module one by one (about
    15 ms of a default plan; mypy ends its runs so, ``mypy.util.hard_exit``). Where the
    output cannot be flushed (a closed pipe), the interpreter's own exit reports it: the
    code is returned. Threads still running :data:`END_THREADS_S` after the command are
    named in one line and the process ends without them (:func:`_end_without_threads`)."""
    import atexit
    import threading

    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return code
    ending = threading.Lock()  # held by whichever of this thread and the watchdog ends it
    watchdog = threading.Timer(END_THREADS_S, _end_without_threads, args=(code, ending))
    watchdog.daemon = True  # not among the threads the join below waits for
    watchdog.start()
    threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx runs first
    if not ending.acquire(blocking=False):  # the watchdog fired as the join returned
        threading.Event().wait()  # it runs the exit handlers and ends the process
    watchdog.cancel()
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return code
    os._exit(code)


def _end_without_threads(code: int, ending) -> None:
    """The end of a process whose threads did not end within :data:`END_THREADS_S`: one
    line naming them, the exit handlers, then ``os._exit(code)`` (the command's own code:
    its output is complete). Nothing where the main thread holds ``ending`` (its join
    returned first: it ends the process itself)."""
    import atexit
    import threading

    if not ending.acquire(blocking=False):
        return
    left = [thread.name for thread in threading.enumerate()
            if not thread.daemon and thread is not threading.main_thread()]  # fmt: skip
    sys.stderr.write(f"llmplan: {len(left)} thread(s) still running {END_THREADS_S:g} s after "
                     f"the command ({', '.join(left)}); ended without them\n")  # fmt: skip
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code (0, 2 for user errors, 128 + signal if stopped).
    Without ``argv`` (a process of its own: tests pass argv in-process) it reads
    ``sys.argv`` and ends the process (:func:`_end_process`)."""
    code = _run(argv)
    return _end_process(code) if argv is None else code


def _run(argv: list[str] | None) -> int:
    """:func:`main`'s command, run."""
    from commands import errors, interrupt
    from hwspecs.errors import PlanError

    from_command_line = argv is None
    if from_command_line:  # before any thread allocates: the program's choice, not the library's
        set_up_process()
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = _wants_json(argv)
    command = _command_for(argv)
    interrupt.install()
    shown = warnings.showwarning
    warnings.showwarning = _warning_line(shown)
    try:
        result = command.main(args=argv, prog_name="llmplan", standalone_mode=False)
    except PlanError as error:
        return errors.report(error, as_json, _subcommand(command, argv), argv)
    except interrupt.Interrupted as stop:
        interrupt.kill_descendants()
        sys.stderr.write(f"error: interrupted by {stop.name}; stopped\n")
        if from_command_line:  # no exit handlers: multiprocessing's would relaunch and print
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(stop.exit_code)
        return stop.exit_code
    except typer.Exit as done:
        return done.exit_code
    except Exception as error:
        if type(error).__name__ == "NoArgsIsHelpError":  # bare `llmplan`, `llmplan catalog`
            sys.stdout.write(error.ctx.get_help() + "\n")
            return 0
        if hasattr(error, "format_message") and hasattr(error, "exit_code"):
            named = _subcommand(command, argv)
            translated = errors.usage_error(error, named)
            return errors.report(translated, as_json, getattr(error, "ctx", None) or named, argv)
        if os.environ.get("LLMPLAN_TRACEBACK"):
            raise
        # Not a user error: one line, never a traceback (LLMPLAN_TRACEBACK=1 shows it).
        detail = " ".join(str(error).split())[:300]
        sys.stderr.write(
            f"error: internal error ({type(error).__name__}: {detail}); please report it "
            "with the command line (LLMPLAN_TRACEBACK=1 shows where)\n"
        )
        return 1
    finally:
        interrupt.restore()
        warnings.showwarning = shown
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
