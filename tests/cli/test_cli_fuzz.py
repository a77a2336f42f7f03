"""A fuzzed command line: random flags and values for every command, random spec files.

Whatever the arguments, the CLI keeps its contract: exit code 0 or 2, never a traceback,
stderr one ``error: ...`` line on exit 2, and a JSON object on stdout whenever ``--json``
is given. The default run is short (CI); the slow-marked one tries many more examples.
"""

import contextlib
import io
import itertools
import json
import os
import tempfile
from pathlib import Path

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cli
from commands.common import app

COMMANDS = typer.main.get_command(app)

#: Arguments that keep a successful run cheap (a small model on 8 GPUs); fuzzed flags follow
#: and may override them. calibrate and validate run torch for minutes when they succeed, so
#: their runs always carry one bad value (they are fuzzed up to the point of failing).
BASE = {
    "plan": ["--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8"],
    "estimate": ["--model", "llama3-8b", "--cluster", "dgx-h100", "--tp", "8", "--pp", "1",
                 "--dp", "1"],
    "memory": ["--model", "llama3-8b"],
    "comm": ["--model", "llama3-8b", "--cluster", "dgx-h100", "--tp", "8", "--pp", "1",
             "--dp", "1"],
    "topology": ["--cluster", "dgx-h100"],
    "collective": ["--op", "all-reduce", "--bytes", "1GiB", "--ranks", "8"],
    "schedule": [],
    "bytes-per-param": [],
    "catalog list": [],
    "catalog show": ["llama3-8b"],
    "calibrate": [],
    "validate": [],
}  # fmt: skip

#: Appended last (click keeps the last value of a flag), so no fuzzed flag can undo them.
LAST = {"calibrate": ["--ranks", "0"], "validate": ["--timeout-s", "-1"]}

#: Values a flag may get: valid ones of every kind, and every kind of wrong one.
WORDS = [
    "0", "1", "2", "3", "4", "8", "16", "-1", "-0", "0.5", "1.5", "1e400", "nan", "inf",
    "16Mi", "16M", "8K", "1.5e7", "1GiB", "512MB", "2,4", "4,8,x", "1,,2", "", " ", "abc",
    "--json", "-", "llama3-8b", "mixtral-8x7b", "deepseek-v3", "dgx-h100", "h100-sxm",
    "1f1b", "zb-h2", "zbv", "interleaved-1f1b", "dualpipev", "gpipe", "none", "full",
    "selective", "adamw", "muon", "bf16", "fp8-mixed", "lora", "qlora", "tp,cp,pp,dp",
    "dp,tp", "step_time", "memory", "all-to-all", "ring", "nvls", "torchtitan",
    "/nonexistent/dir/out.html", "/dev/null", ".", "9" * 40,
]  # fmt: skip

#: Spec files: malformed, wrong types, out of range, unknown keys, empty, binary.
FILES = [
    ("json", '{"model_type": "llama", '),
    ("json", "[1, 2, 3]"),
    ("json", '{"model_type": "llama", "hidden_size": "big", "num_hidden_layers": 2}'),
    ("json", '{"model_type": "llama", "hidden_size": -4096, "num_hidden_layers": 2, '
             '"num_attention_heads": 32, "intermediate_size": 1, "vocab_size": 1}'),
    ("json", '{"model_type": "nosuch"}'),
    ("toml", "id = [\n"),
    ("toml", ""),
    ("toml", 'id = "x"\nname = "x"\nvendor = "v"\nbf16_tflops = 1\nhbm_bytes = 1\n'
             'hbm_bytes_per_s = 1\ncolour = "red"\n'),
    ("toml", 'id = "x"\nname = "x"\nvendor = "v"\nbf16_tflops = -1e300\nhbm_bytes = "lots"\n'),
    ("toml", 'name = "m"\nnum_layers = 1e400\n'),
    ("bin", bytes(range(256)).decode("latin-1")),
]  # fmt: skip


def _options(name: str) -> list[str]:
    command = COMMANDS
    for word in name.split():
        command = command.commands[word]
    return sorted(
        opt
        for param in command.params
        if getattr(param, "param_type_name", "") == "option"
        for opt in (*param.opts, *param.secondary_opts)
        if opt not in ("--help", "-h")
    )


OPTIONS = {name: _options(name) for name in BASE}
_counter = itertools.count()
_directory = Path(tempfile.mkdtemp(prefix="llmplan-fuzz-"))


@st.composite
def spec_file(draw) -> str:
    suffix, text = draw(st.sampled_from(FILES))
    suffix = draw(st.sampled_from([suffix, "json", "toml"]))
    path = _directory / f"spec{next(_counter)}.{suffix}"  # fresh name: loaders cache by path
    path.write_bytes(text.encode("latin-1"))
    return str(path)


VALUES = st.one_of(
    st.sampled_from(WORDS),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=6),
    spec_file(),
)


@st.composite
def command_lines(draw) -> list[str]:
    name = draw(st.sampled_from(sorted(BASE)))
    argv = [*name.split(), *BASE[name]]
    for _ in range(draw(st.integers(0, 4))):
        flag = draw(st.one_of(st.sampled_from(OPTIONS[name]), st.sampled_from(["--nosuch", "-x"])))
        argv.append(flag)
        if draw(st.integers(0, 5)):  # mostly with a value; sometimes a flag alone
            argv.append(draw(VALUES))
    argv.extend(LAST.get(name, []))
    if draw(st.booleans()):
        argv.append("--json")
    return argv


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(_directory)  # output flags given random names write there, not in the checkout
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(argv)
    finally:
        os.chdir(here)
    return code, out.getvalue(), err.getvalue()


def _holds_the_contract(argv: list[str]) -> None:
    code, out, err = _run(argv)
    assert code in (0, 2), (argv, err)
    assert "Traceback" not in err, (argv, err)
    if code == 2:
        assert err.startswith("error: ") and err.count("\n") == 1, (argv, err)
    if "--json" in argv:
        data = json.loads(out)  # a JSON object on stdout, result or error
        assert code == 0 or set(data["error"]) >= {"message", "field"}, (argv, out)


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(command_lines())
def test_fuzzed_command_line_keeps_the_contract(argv):
    _holds_the_contract(argv)


@pytest.mark.slow
@settings(
    max_examples=5000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(command_lines())
def test_fuzzed_command_line_keeps_the_contract_long(argv):
    _holds_the_contract(argv)
