"""The CLI's error contract, case by case: one line on stderr naming the flag, exit 2, and a
JSON error object on stdout with --json; usage, -h and --version; outputs checked before the
work and written whole; Ctrl-C and SIGTERM end with 130/143 and leave no process behind."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cli
from tests.cli_runner import run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bad_files(tmp_path):
    (tmp_path / "bad.json").write_text('{"model_type": "llama", ')
    (tmp_path / "bad.toml").write_text("id = [\n")
    (tmp_path / "empty.toml").write_text("")
    (tmp_path / "garbage.json").write_bytes(bytes(range(256)))
    return tmp_path


#: The bad inputs of issue 17's survey: (arguments, the flag the error names, a fragment).
SURVEY = [
    (["bytes-per-param", "--optimizer", "nosuch"], "--optimizer", "adamw, sgd-momentum"),
    (["memory", "--model", "{tmp}/bad.json"], "--model", "malformed JSON"),
    (["memory", "--model", "{tmp}/garbage.json"], "--model", "garbage.json"),
    (["memory", "--accelerator", "{tmp}/empty.toml"], "--accelerator", "missing"),
    (["estimate", "--model", "nope"], "--model", "unknown model 'nope'"),
    (["memory", "--model", "nope"], "--model", "unknown model 'nope'"),
    (["comm", "--model", "nope"], "--model", "unknown model 'nope'"),
    (["topology", "--cluster", "nope"], "--cluster", "unknown cluster 'nope'"),
    (["schedule", "--schedule", "nope"], "--schedule", "1f1b, interleaved-1f1b"),
    (["collective", "--op", "all-reduce", "--bytes", "abc", "--ranks", "8"], "--bytes", "'abc'"),
    (["catalog", "show", "nope"], "catalog entry", "unknown catalog entry 'nope'"),
    (["catalog", "list", "gpus"], "KIND", "models, accelerators"),
    (["plan", "--nosuch-flag"], "--nosuch-flag", "unknown option '--nosuch-flag'"),
    (["plan", "--top", "abc"], "--top", "--top takes a whole number ≥ 1; got 'abc'"),
    (["plan", "--top"], "--top", "--top needs a value (a whole number ≥ 1)"),
    (["collective"], "--op", "needs --op (all-reduce"),
    (["plan", "extra"], "argument", "unexpected argument 'extra'"),
    (["nosuchcommand"], "command", "unknown command 'nosuchcommand'"),
    (["plan", "--html", "/nonexistent/dir/p.html"], "--html", "does not exist"),
    (["plan", "--csv", "/nonexistent/dir/p.csv"], "--csv", "does not exist"),
    (["schedule", "--png", "/nonexistent/dir/s.png"], "--png", "does not exist"),
    (["topology", "--html", "/nonexistent/dir/t.html"], "--html", "does not exist"),
    (["memory", "--recipe", "lora", "--lora-dropout", "1.5"], "--lora-dropout", "[0, 1)"),
    (["estimate", "--global-batch-tokens", "1000"], "--global-batch-tokens", "nearest: 8,192"),
    (["plan", "--objective", "speed"], "--objective", "step_time, memory, mfu"),
    (["plan", "--mem-headroom", "1.5"], "--mem-headroom", "a number in [0, 1)"),
    (["estimate", "--tp", "3"], "--tp", "tp 3 does not divide num_attention_heads 128"),
    (["memory", "--pp", "127"], "--pp", "pp·vpp"),
    (["memory", "--recompute", "bogus"], "--recompute", "or Megatron-Core modules"),
    (["memory", "--accelerator", "{tmp}/bad.toml"], "--accelerator", "malformed TOML"),
    (["schedule", "--pp", "0"], "--pp", "--pp takes a whole number ≥ 1; got '0'"),
    (["memory", "--lora-rank", "8"], "--lora-rank", "needs an adapter recipe"),
]


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize(
    ("argv", "field", "fragment"),
    SURVEY,
    ids=lambda v: " ".join(v)[:40] if isinstance(v, list) else None,
)
def test_survey_case_is_one_line_exit_2(capsys, bad_files, argv, field, fragment, as_json):
    argv = [part.replace("{tmp}", str(bad_files)) for part in argv]
    code, out, err = run(capsys, *argv, *(["--json"] if as_json else []))
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert fragment in err
    assert "Traceback" not in err and "Value error" not in err and "Input should" not in err
    if as_json:
        error = json.loads(out)["error"]
        assert error["message"] == err[len("error: ") :].strip()
        assert error["field"] == field


def test_unknown_option_after_json_is_named_not_the_flag_before_it(capsys):
    """The JSON error names the unknown option, not the flag the arguments put before it."""
    code, out, _ = run(capsys, "plan", "--json", "--nosuch-flag", "5")
    assert code == 2
    assert json.loads(out)["error"]["field"] == "--nosuch-flag"


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--zero-stage", "4"],
        ["estimate", "--zero-stage", "4"],
        ["memory", "--zero-stage", "4"],
        ["comm", "--zero-stage", "4"],
        ["bytes-per-param", "--zero-stage", "4"],
    ],
)
def test_one_mistake_has_one_wording_in_every_command(capsys, argv):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert err == "error: --zero-stage takes 0, 1, 2 or 3; got '4'\n"


def test_no_layout_fits_leads_with_memory_and_a_remedy(capsys):
    argv = ["plan", "--cluster", "dgx-h100", "--gpus", "8", "--model", "llama3-405b"]
    code, out, err = run(capsys, *argv)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("error: no layout fits in memory: the smallest needs ")
    assert "GiB per GPU" in err and "try more GPUs" in err and "MiB" not in err
    assert "does not fit in 75.7 GiB per GPU" in out  # the reasons, one a line
    code, out, err = run(capsys, *argv, "--json")
    error = json.loads(out)["error"]
    assert error["field"] == "--gpus"
    assert any("smallest layout" in reason for reason in error["reasons"])


@pytest.mark.parametrize("argv", [[], ["catalog"]])
def test_bare_command_prints_usage(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 0 and out.startswith("Usage: llmplan") and not err


def test_short_help_and_version(capsys):
    from importlib import metadata

    code, out, _ = run(capsys, "plan", "-h")
    assert code == 0 and "--global-batch-tokens" in out
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert out.strip() == f"llmplan {metadata.version('llmplan')}"


def test_global_batch_tokens_take_units(capsys):
    code, out, err = run(capsys, "estimate", "--global-batch-tokens", "16Mi", "--json")
    assert code == 0, err
    assert json.loads(out)["num_microbatches"] == 2**24 // 8192 // 128


@pytest.mark.parametrize(
    ("text", "expected"),
    [("16Mi", 2**24), ("16M", 16_000_000), ("8K", 8_000), ("1.5e7", 15_000_000),
     ("16,777,216", 2**24), ("2Ki", 2048)],
)  # fmt: skip
def test_count_units(text, expected):
    from planner.spec.units import parse_count

    assert parse_count(text) == expected


def test_output_path_checked_before_the_search(capsys, monkeypatch):
    from planner import api

    def must_not_run(*args, **kwargs):
        raise AssertionError("the search ran before the output path was checked")

    monkeypatch.setattr(api, "plan", must_not_run)
    code, _, err = run(capsys, "plan", "--html", "/nonexistent/dir/p.html")
    assert code == 2 and "--html" in err


def test_outputs_are_written_whole(tmp_path):
    from commands.outputs import atomic_path

    target = tmp_path / "p.html"
    target.write_text("old")
    with pytest.raises(KeyboardInterrupt), atomic_path(target) as temporary:
        Path(temporary).write_text("<html>half")
        raise KeyboardInterrupt
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == [target]  # no temporary left behind
    with atomic_path(target) as temporary:
        Path(temporary).write_text("<html>whole</html>")
    assert target.read_text() == "<html>whole</html>"
    assert list(tmp_path.iterdir()) == [target]


def test_csv_and_html_written_by_plan(capsys, tmp_path):
    csv, html = tmp_path / "rows.csv", tmp_path / "plan.html"
    code, _, err = run(capsys, "plan", "--model", "llama3-8b", "--cluster", "dgx-h100",
                       "--gpus", "8", "--csv", str(csv), "--html", str(html))  # fmt: skip
    assert code == 0, err
    assert csv.read_text().startswith("tp,") and "</html>" in html.read_text()[-200:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.html", "rows.csv"]


def _descendants(pid: int) -> list[int]:
    from commands.interrupt import descendants

    return descendants(pid)


def _interrupt(argv, sig, wait_for_children: bool, start_timeout_s: float = 60.0):
    """Start ``llmplan argv``, wait until it works (or has children), send ``sig``."""
    process = subprocess.Popen(
        [sys.executable, "cli.py", *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + start_timeout_s
    children = []
    time.sleep(1.5)  # imports done, the work under way
    while wait_for_children and time.monotonic() < deadline:
        children = _descendants(process.pid)
        if len(children) >= 2:
            time.sleep(1.0)
            children = _descendants(process.pid)
            break
        time.sleep(0.1)
    if process.poll() is not None:
        pytest.skip(f"finished before the signal: {process.communicate()[1][-300:]}")
    sent = time.monotonic()
    process.send_signal(sig)
    _, err = process.communicate(timeout=30)
    return process.returncode, err, time.monotonic() - sent, children


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_plan_exits_at_once_without_traceback(sig, code):
    argv = ["plan", "--model", "deepseek-v3", "--cluster", "llama3-h100-24k", "--gpus", "16384"]
    returncode, err, seconds, _ = _interrupt(argv, sig, wait_for_children=False)
    assert returncode == code, err
    assert err.count("\n") == 1 and err.startswith("error: interrupted"), err
    assert seconds < 3


@pytest.mark.slow
@pytest.mark.torch
def test_interrupted_validate_leaves_no_process_and_keeps_results(tmp_path):
    pytest.importorskip("torch")
    calibrated = tmp_path / "local.toml"
    results = tmp_path / "results.jsonl"
    code = cli.main(["calibrate", "--out", str(calibrated), "--ranks", "2"])
    assert code == 0
    argv = ["validate", "--cluster", str(calibrated), "--layouts", "dp-zero0,dp-zero1,dp-zero2,dp-zero3",
            "--results", str(results)]  # fmt: skip
    returncode, err, seconds, children = _interrupt(argv, signal.SIGINT, wait_for_children=True)
    assert returncode == 130, err
    assert "Traceback" not in err and err.count("\n") == 1
    assert seconds < 5
    assert children, "validate started no rank processes to interrupt"
    time.sleep(0.5)
    alive = [pid for pid in children if os.path.exists(f"/proc/{pid}")]
    assert not alive, f"orphaned processes: {alive}"
