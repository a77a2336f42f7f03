"""Terminal chart, summary line and plotly figure of a simulated schedule."""

from __future__ import annotations

import shutil

import pytest
from rich.console import Console

from hwspecs.errors import PlanError
from planner.pipeline.report import schedule_report
from plots.schedule import schedule_figure, write_figure
from plots.schedule_chart import schedule_chart, summary_line
from tests.cli_runner import run_llmplan


def render(text) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(text)
    return console.export_text()


def test_chart_has_one_row_per_rank_with_microbatch_numbers():
    report = schedule_report("1f1b", 4, 8)
    lines = render(schedule_chart(report)).splitlines()
    assert [line.split()[:2] for line in lines[:4]] == [["rank", str(r)] for r in range(4)]
    assert lines[3].split()[2:5] == ["0", "0", "0"]  # last rank: F0 then a 2-unit BW0
    assert "F forward" in lines[4]


def test_chart_fits_the_width_it_is_given():
    report = schedule_report("zbv", 8, 32)
    assert (
        max(len(line) for line in render(schedule_chart(report, max_width=100)).splitlines()) <= 100
    )


def test_summary_line_names_step_bubble_peaks_and_copies():
    line = summary_line(schedule_report("dualpipe", 4, 8))
    assert "dualpipe" in line and "step" in line and "bubble" in line
    assert "[5 5 5 5]" in line and "2× parameters" in line


def test_figure_has_a_trace_per_action_kind_and_the_bubble_in_its_title():
    report = schedule_report("zb-h1", 4, 8)
    fig = schedule_figure([report])
    assert sorted(trace.legendgroup for trace in fig.data) == ["B", "F", "W"]
    assert f"{report.bubble_fraction:.1%}" in fig.layout.title.text
    forward = next(trace for trace in fig.data if trace.legendgroup == "F")
    assert len(forward.x) == 4 * 8
    assert "micro-batch" in forward.hovertemplate


def test_compare_stacks_one_panel_per_schedule(tmp_path):
    reports = [schedule_report(name, 4, 8) for name in ("1f1b", "zb-h1", "zbv", "dualpipev")]
    fig = schedule_figure(reports)
    assert {trace.yaxis for trace in fig.data} == {"y", "y2", "y3", "y4"}
    assert len(fig.layout.annotations) == 4
    html = tmp_path / "compare.html"
    write_figure(fig, html_path=html)
    assert html.read_text().count("plotly") > 0


def _browser_available() -> bool:
    return any(shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome"))


@pytest.mark.skipif(not _browser_available(), reason="no Chromium: .ci/run installs Debian's")
def test_png_is_written_with_a_browser(tmp_path):
    """``schedule --png`` in its own process, as a user runs it (the browser's threads stay
    out of the test run's process; a hung browser fails at the limit)."""
    pytest.importorskip("kaleido")
    path = tmp_path / "x.png"
    done = run_llmplan("schedule", "--schedule", "1f1b", "--pp", "2", "--microbatches", "2",
                       "--png", str(path))  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_png_without_a_browser_says_how_to_enable_it(tmp_path, monkeypatch):
    """With kaleido unable to find a browser, the error is one line naming how to enable PNG."""
    import plotly.graph_objects as go

    def no_browser(*args, **kwargs):
        raise RuntimeError("Kaleido requires Google Chrome to be installed.")

    monkeypatch.setattr(go.Figure, "write_image", no_browser)
    fig = schedule_figure([schedule_report("1f1b", 2, 2)])
    with pytest.raises(PlanError, match="chromium") as error:
        write_figure(fig, png_path=tmp_path / "x.png")
    assert "\n" not in str(error.value)


def test_figure_needs_a_report():
    with pytest.raises(PlanError):
        schedule_figure([])


def test_figure_marks_chunks_and_dualpipe_directions_with_distinct_colours():
    zbv = schedule_figure([schedule_report("zbv", 4, 8)])
    colours = {trace.legendgroup: trace.marker.color for trace in zbv.data}
    assert len(set(colours.values())) == len(colours)  # F, B, W each its own hue
    hatched = [trace for trace in zbv.data if trace.marker.pattern.shape]
    assert hatched and all("chunk 1" in trace.name for trace in hatched)
    dualpipe = schedule_figure([schedule_report("dualpipe", 4, 8)])
    names = {trace.name for trace in dualpipe.data}
    assert "F: forward, from the first rank (→)" in names
    assert "F: forward, from the last rank (←)" in names


def test_png_is_wide_enough_for_every_label():
    from plots.schedule import PNG_PIXELS_PER_ACTION

    report = schedule_report("dualpipev", 4, 8)
    fig = schedule_figure([report])
    busiest = max(sum(1 for item in report.timeline if item.rank == r) for r in range(4))
    assert fig.layout.meta["png_width"] >= PNG_PIXELS_PER_ACTION * busiest
