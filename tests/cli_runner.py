"""The command line as the tests call it: in-process (exit code and captured output), or in
a process of its own as a user runs it (:func:`run_llmplan`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cli

ROOT = Path(__file__).resolve().parents[1]
#: Seconds a command run in its own process may take before the test fails.
PROCESS_LIMIT_S = 300


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """``llmplan *argv``: (exit code, stdout, stderr)."""
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv: str):
    """``llmplan *argv --json``, which must succeed: the parsed output."""
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def run_llmplan(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    """``llmplan *argv`` in a process of its own, as a user runs it (``cli.py`` from the
    repository root, its output through pipes), failing the test after
    :data:`PROCESS_LIMIT_S`. Whatever the command starts (kaleido's browser and the threads
    reading its log) ends with that process, not the test run's."""
    return subprocess.run([sys.executable, "cli.py", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=PROCESS_LIMIT_S, **kwargs)  # fmt: skip
