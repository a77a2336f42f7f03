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


def _render_offline(path, tmp_path) -> str:
    """The page's DOM after scripts ran in headless Chromium with every network fetch refused."""
    done = subprocess.run(
        [
            BROWSER, "--headless", "--no-sandbox", "--disable-gpu",
            "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
            f"--user-data-dir={tmp_path / 'chromium'}", "--virtual-time-budget=8000",
            "--dump-dom", f"file://{path}",
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _plan_page(capsys, tmp_path):
    path = tmp_path / "plan.html"
    argv = ["plan", "--tp", "2", "--pp", "16,32", "--cp", "8", "--html", str(path), "--json"]
    assert cli.main(argv) == 0
    return path, json.loads(capsys.readouterr().out)


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


@needs_browser
@pytest.mark.parametrize("page", ["plan", "topology", "schedule"])
def test_pages_render_offline_in_chromium(capsys, tmp_path, page):
    if page == "plan":
        path, _ = _plan_page(capsys, tmp_path)
    else:
        path = tmp_path / f"{page}.html"
        argv = {
            "topology": ["topology", "--cluster", "dgx-h100", "--tp", "8", "--html", str(path)],
            "schedule": ["schedule", "--schedule", "dualpipev", "--pp", "4", "--html", str(path)],
        }[page]
        assert cli.main(argv) == 0
        capsys.readouterr()
    dom = _render_offline(path, tmp_path)
    assert 'class="main-svg"' in dom  # plotly drew the figure
    assert len(re.findall(r'class="trace ', dom)) >= 1
