"""The command's process as ``llmplan`` runs it: the group built for the invoked command
only (:func:`cli._command_for`) is the whole app's command, and the process ended without
the interpreter's teardown (:func:`cli._end_process`) still delivers its output, files,
exit code and exit handlers."""

import json
import subprocess
import sys
from pathlib import Path

import typer

import cli
from tests.cli_runner import run_llmplan

ROOT = Path(__file__).resolve().parents[2]


def _described(command) -> list:
    """What a user meets of a click command: its options, their defaults and help, its
    help, and its subcommands' alike."""
    params = [(p.name, p.opts, p.secondary_opts, repr(p.default), getattr(p, "help", None),
               p.required, p.nargs, p.multiple) for p in command.params]  # fmt: skip
    subcommands = getattr(command, "commands", {})
    return [command.name, command.help, params,
            {name: _described(sub) for name, sub in subcommands.items()}]  # fmt: skip


def test_the_invoked_command_alone_is_the_command_of_the_whole_app():
    whole = typer.main.get_command(cli.app)
    assert len(whole.commands) >= 14
    for name, command in whole.commands.items():
        alone = cli._command_for([name, "--help"])
        assert list(alone.commands) == [name]
        assert _described(alone.commands[name]) == _described(command)
        assert _described(alone)[2] == _described(whole)[2]  # the app's own options


def test_help_a_mistyped_name_and_leading_options_get_the_whole_app():
    whole = set(typer.main.get_command(cli.app).commands)
    for argv in ([], ["--help"], ["--version"], ["plna"], ["--json", "plan"]):
        assert set(cli._command_for(argv).commands) == whole, argv


def test_a_process_ended_early_delivers_its_output_files_and_code(tmp_path):
    csv = tmp_path / "rows.csv"
    done = run_llmplan("plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                    "--json", "--csv", str(csv))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["results"]  # the whole document, through a pipe
    assert csv.read_text().startswith("tp,") and csv.read_text().endswith("\n")
    bad = run_llmplan("plan", "--gpus", "seven", "--json")
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"]["field"] == "--gpus"


def _catalog_list_with(*setup: str) -> subprocess.CompletedProcess:
    """``llmplan catalog list`` run as ``cli.main()`` ends a process, after ``setup`` (lines
    of Python) and an exit handler that prints "exit handler ran" to stderr."""
    program = "\n".join([
        "import atexit, sys, threading", *setup,
        "atexit.register(lambda: print('exit handler ran', file=sys.stderr))",
        "import cli", "cli.END_THREADS_S = 0.5", "sys.argv = ['llmplan', 'catalog', 'list']",
        "sys.exit(cli.main())",
    ])  # fmt: skip
    return subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def test_a_process_ended_early_runs_its_exit_handlers():
    done = _catalog_list_with()
    assert done.returncode == 0, done.stderr
    assert "llama3-405b" in done.stdout
    assert done.stderr.strip().endswith("exit handler ran")
    assert "still running" not in done.stderr


def test_a_process_whose_threads_do_not_end_still_ends_with_its_code():
    """A thread left running (kaleido's browser-log reader waiting on a leftover helper)
    does not hold the command open: after ``cli.END_THREADS_S`` the process names it in
    one line, runs its exit handlers and ends with the command's own code."""
    done = _catalog_list_with(
        "threading.Thread(target=threading.Event().wait, name='left-waiting').start()"
    )
    assert done.returncode == 0, done.stderr
    assert "llama3-405b" in done.stdout
    assert "1 thread(s) still running 0.5 s after the command (left-waiting)" in done.stderr
    assert done.stderr.strip().endswith("exit handler ran")
