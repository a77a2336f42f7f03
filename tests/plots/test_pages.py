"""HTML pages: the Pareto front is the planner's (checked against brute force), pages stay
small with plotly inlined, and they render offline in a real browser (headless Chromium)."""

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cli
from planner.results import page_sample, pareto_front_mask
from tests.cli_runner import run_llmplan

PAGE_LIMIT_BYTES = 5 * 2**20
BROWSER = next(
    (
        shutil.which(name)
        for name in ("chromium", "chromium-browser", "google-chrome")
        if shutil.which(name)
    ),
    None,
)
needs_browser = pytest.mark.skipif(BROWSER is None, reason="no Chromium: .ci/run installs Debian's")


def _brute_force_front(times, memory):
    keep = []
    for i in range(len(times)):
        dominated = any(
            times[j] <= times[i]
            and memory[j] <= memory[i]
            and (times[j] < times[i] or memory[j] < memory[i])
            for j in range(len(times))
        )
        duplicate = any(times[j] == times[i] and memory[j] == memory[i] for j in range(i))
        keep.append(not dominated and not duplicate)
    return np.array(keep, dtype=bool)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(1, 12)), min_size=1, max_size=40))
def test_pareto_front_is_exactly_the_undominated_rows(points):
    times = np.array([p[0] for p in points], dtype=float)
    memory = np.array([p[1] for p in points], dtype=float)
    assert (pareto_front_mask(times, memory) == _brute_force_front(times, memory)).all()


def test_page_sample_is_bounded_and_holds_the_front():
    rng = np.random.default_rng(1)
    times, memory = rng.lognormal(1, 0.5, 200_000), rng.uniform(1e9, 8e10, 200_000)
    sample = page_sample(times, memory, grid_cells=40)
    assert len(sample.cloud) <= 40 * 40
    assert set(sample.front) == set(np.flatnonzero(pareto_front_mask(times, memory)))
    assert not set(sample.front) & set(sample.cloud)
    assert times[sample.front].tolist() == sorted(times[sample.front])
    # The cloud spans the whole range: its extremes reach the outermost grid cells.
    drawn = sample.front + sample.cloud
    assert memory[drawn].max() > memory.max() - (memory.max() - memory.min()) / 40


#: Console lines Chromium's own software GL writes when a page draws WebGL (plotly's
#: Scattergl) without a GPU: the browser's notes, not the page's errors.
BROWSER_NOTES = ("Automatic fallback to software WebGL", "GL Driver Message")


def _render_offline(path, tmp_path) -> tuple[str, list[str]]:
    """The page's DOM after scripts ran in headless Chromium with every network fetch
    refused, and what the page wrote to the console (errors, uncaught exceptions)."""
    done = subprocess.run(
        [
            BROWSER, "--headless", "--no-sandbox", "--disable-gpu",
            "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
            f"--user-data-dir={tmp_path / 'chromium'}", "--virtual-time-budget=8000",
            "--enable-logging=stderr", "--v=0", "--dump-dom", f"file://{path}",
        ],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    console = [
        line.split("] ", 1)[-1]
        for line in done.stderr.splitlines()
        if ":CONSOLE" in line and not any(note in line for note in BROWSER_NOTES)
    ]
    return done.stdout, console


def _plan_page(capsys, tmp_path, *extra):
    path = tmp_path / "plan.html"
    argv = ["plan", "--tp", "2", "--pp", "16,32", "--cp", "8", "--html", str(path), *extra,
            "--json"]  # fmt: skip
    assert cli.main(argv) == 0
    return path, json.loads(capsys.readouterr().out)


def _legend(dom: str) -> list[str]:
    return re.findall(r'class="legendtext"[^>]*>([^<]*)<', dom)


def test_plan_page_is_small_and_marks_winner_front_and_memory_limit(capsys, tmp_path):
    path, result = _plan_page(capsys, tmp_path)
    text = path.read_text().replace("\\u002f", "/")  # plotly escapes "/" in its JSON
    assert path.stat().st_size <= PAGE_LIMIT_BYTES
    assert re.search(r"<script[^>]+src=", text) is None  # plotly.js inlined, nothing fetched
    for name in ("winner (simulated)", "Pareto front", "memory limit"):
        assert name in text
    winner = result["results"][0]
    assert f"{winner['usable_bytes'] / 2**30:.1f} GiB" in text
    assert "%{customdata[0]}" in text and "tokens/s/GPU" in text  # named, rounded hover
    for field in ("m %{customdata[2]}", "(tp/cp/pp/dp/ep/etp)", "bubble %{customdata[11]"):
        assert field in text


def test_plan_page_marks_a_published_and_a_named_layout(capsys, tmp_path):
    """A runs file with the query's model at its GPU count and sequence length: its layout
    is marked on the best feasible row with those degrees; --mark names another."""
    from hwspecs.catalog import load_runs

    published = tmp_path / "published.json"
    row = load_runs("train")[0].model_dump(mode="json")
    row |= {"id": "mine-405b-16k"}
    row["hardware"]["num_gpus"] = 16384
    row["model"] |= {"layers": 126, "hidden": 16384, "heads": 128, "vocab": 128256}
    row["training"] |= {"seq_len": 8192, "tp": 2, "cp": 8, "pp": 16, "dp": 64, "ep": None}
    published.write_text(json.dumps([row]))
    path, _ = _plan_page(
        capsys, tmp_path, "--runs", str(published), "--mark", "tp=2,cp=8,pp=32,dp=32"
    )
    text = path.read_text()
    assert "published: mine-405b-16k (best of" in text
    assert "named: tp 2 cp 8 pp 32 dp 32 (best of" in text


@pytest.mark.parametrize(
    "argv",
    [("estimate",), ("topology", "--cluster", "dgx-h100", "--tp", "8"), ("plan", "--tp", "8",
     "--pp", "16", "--cp", "1,2")],
    ids=["estimate", "topology", "plan"],
)  # fmt: skip
def test_png_pages_are_written(tmp_path, argv):
    """Each command writes its PNG in its own process, as a user runs it, and ends: kaleido's
    browser (and the threads that read its log) stay out of the test run's process, and a
    browser that hangs fails the test at the limit rather than holding the run open."""
    pytest.importorskip("kaleido")
    if BROWSER is None:
        pytest.skip("no Chromium for kaleido")
    path = tmp_path / "page.png"
    done = run_llmplan(*argv, "--png", str(path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {path}" in done.stdout


def test_png_flag_needs_a_png_path(capsys):
    assert cli.main(["estimate", "--png", "page.html"]) == 2
    assert "--png takes a file path ending in .png" in capsys.readouterr().err


def test_estimate_page_draws_the_layouts_own_timeline_in_ms(capsys, tmp_path):
    """The timeline is the layout's: each stage's own F and BW in ms, as the simulator ran
    them; the busiest rank's busy time is the estimate's F + B + W per micro-batch × m."""
    from planner import api

    path = tmp_path / "estimate.html"
    assert cli.main(["estimate", "--html", str(path)]) == 0
    assert f"wrote {path}" in capsys.readouterr().out
    job = api.build_job("llama3-405b", 8192, global_batch_tokens=2**24)
    layout = api.build_layout(tp=8, pp=16, dp=128)
    estimate = api.estimate(job, layout, "llama3-h100-24k")
    timeline = api.layout_timeline(job, layout, "llama3-h100-24k", estimate)
    assert timeline.pp == 16 and timeline.microbatches == estimate.num_microbatches
    stage = estimate.stage_times_s
    busiest = 1e3 * sum(stage[k] for k in ("forward", "input_grad", "weight_grad", "recompute"))
    busy = [
        sum(item.end - item.start for item in timeline.timeline if item.rank == rank)
        for rank in range(timeline.pp)
    ]
    assert max(busy) == pytest.approx(busiest * estimate.num_microbatches, rel=1e-6)
    assert min(busy) < max(busy)  # the first and last stages differ (embedding, head)
    text = path.read_text()
    assert path.stat().st_size <= PAGE_LIMIT_BYTES and "time (ms)" in text


@needs_browser
@pytest.mark.parametrize("page", ["plan", "topology", "schedule", "estimate"])
def test_pages_render_offline_in_chromium(capsys, tmp_path, page):
    expected = {  # legend entries the page must draw
        "plan": ["Pareto front", "winner (simulated)", "named: tp 2 cp 8 pp 32"],
        "topology": [],
        "schedule": ["F: forward", "B: input grad", "W: weight grad"],
        "estimate": ["F: forward", "BW: full backward", "memory: acts", "memory: weights"],
    }[page]
    if page == "plan":
        path, _ = _plan_page(capsys, tmp_path, "--mark", "tp=2,cp=8,pp=32")
    else:
        path = tmp_path / f"{page}.html"
        argv = {
            "topology": ["topology", "--cluster", "dgx-h100", "--tp", "8", "--html", str(path)],
            "schedule": ["schedule", "--schedule", "dualpipev", "--pp", "4", "--html", str(path)],
            "estimate": ["estimate", "--html", str(path)],
        }[page]
        assert cli.main(argv) == 0
        capsys.readouterr()
    assert path.stat().st_size <= PAGE_LIMIT_BYTES
    dom, console = _render_offline(path, tmp_path)
    assert console == []  # no error, no uncaught exception, no failed fetch
    assert 'class="main-svg"' in dom  # plotly drew the figure
    assert len(re.findall(r'class="trace ', dom)) >= 1
    legend = _legend(dom)
    for name in expected:
        assert any(entry.startswith(name) for entry in legend), (name, legend)
    if page == "topology":
        assert "tp = 8: ranks 0, 1, 2" in dom and "pp = 16" in dom
