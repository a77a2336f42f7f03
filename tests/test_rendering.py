"""What the terminal shows: tables at 80 columns keep every number whole, the headline and
citations wrap at word boundaries, and the schedule timeline shows the simulator's order."""

import json
import re

import pytest

import cli

DEEPSEEK_QUERY = (
    "--model", "deepseek-v3", "--cluster", "dgx-h800", "--gpus", "2048",
    "--seq-len", "4096", "--global-batch-size", "15360",
)  # fmt: skip


def render(capsys, monkeypatch, width, *argv):
    """The CLI's stdout as a pipe of ``width`` columns shows it (rich reads COLUMNS)."""
    monkeypatch.setenv("COLUMNS", str(width))
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def assert_fits(out: str, width: int) -> None:
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= width
    assert "…" not in out, next(line for line in lines if "…" in line)


@pytest.mark.parametrize(
    "argv",
    [
        (),
        ("--schedule", "interleaved-1f1b"),
        # DeepSeek-V3: five degrees per row (pinned to keep the test fast; same widths).
        (*DEEPSEEK_QUERY, "--tp", "1", "--cp", "1,2", "--pp", "8,16"),
    ],
    ids=["llama3-default", "llama3-interleaved", "deepseek-v3"],
)
def test_plan_table_fits_80_columns_with_every_value_whole(capsys, monkeypatch, argv):
    out = render(capsys, monkeypatch, 80, "plan", *argv)
    assert_fits(out, 80)
    header = next(line for line in out.splitlines() if line.startswith("#"))
    for column in ("step s", "MFU%", "GiB", "bub%"):
        assert column in header
    rows = [line.split() for line in out.splitlines() if re.match(r"\d+ ", line)]
    assert [int(row[0]) for row in rows] == list(range(1, len(rows) + 1))


def test_plan_table_values_match_json(capsys, monkeypatch):
    out = render(capsys, monkeypatch, 80, "plan", "--top", "3")
    result = json.loads(render(capsys, monkeypatch, 80, "plan", "--top", "3", "--json"))
    rows = [line.split() for line in out.splitlines() if re.match(r"\d+ ", line)]
    for row, entry in zip(rows, result["results"], strict=True):
        assert f"{entry['step_time_s']:.3f}" in row
        assert f"{100 * entry['mfu']:.1f}" in row


def test_estimate_headline_is_one_line_on_a_wide_terminal(capsys, monkeypatch):
    out = render(capsys, monkeypatch, 200, "estimate")
    headline = next(line for line in out.splitlines() if line.startswith("step "))
    assert "MFU" in headline and "tokens/s per GPU" in headline


def test_estimate_fits_80_columns(capsys, monkeypatch):
    assert_fits(render(capsys, monkeypatch, 80, "estimate"), 80)


def test_estimate_explain_prints_whole_citations(capsys, monkeypatch):
    from hwspecs.catalog import load_accelerator

    out = render(capsys, monkeypatch, 80, "estimate", "--explain")
    source = load_accelerator("h100-sxm").source_of("matmul_efficiency.bf16")
    # Wrapped at spaces only: joining the lines gives the whole citation back.
    assert " ".join(source.split()) in " ".join(out.split())
