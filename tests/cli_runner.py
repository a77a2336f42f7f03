"""The command line run in-process, as the tests call it: exit code and captured output."""

from __future__ import annotations

import json

import cli


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
