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


#: Every command's table, at its widest: the worst case of each (four-digit GiB, a long
#: catalog name, DeepSeek-V3's five degrees are covered by the plan test above).
COMMAND_TABLES = {
    "memory": ("memory",),
    "memory-one-gpu": ("memory", "--tp", "1", "--pp", "1", "--dp", "1", "--explain"),
    "memory-qlora": ("memory", "--model", "llama3-70b", "--recipe", "qlora", "--tp", "1",
                     "--pp", "1", "--dp", "8", "--seq-len", "4096"),
    "bytes-per-param": ("bytes-per-param", "--recipe", "qlora", "--model", "llama3-8b"),
    "comm": ("comm",),
    "comm-moe": ("comm", "--model", "deepseek-v3", "--cluster", "dgx-h800", "--gpus", "2048",
                 "--tp", "1", "--pp", "16", "--dp", "128", "--ep", "64", "--seq-len", "4096",
                 "--global-batch-size", "15360"),
    "topology": ("topology",),
    "collective": ("collective", "--op", "all-reduce", "--bytes", "1GiB", "--ranks", "4096"),
    "schedule-compare": ("schedule", "--compare", "1f1b,interleaved-1f1b,zb-h1,zb-h2,zbv,"
                         "dualpipe,dualpipev", "--pp", "8", "--num-microbatches", "16"),
    "sweep": ("sweep", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8,16",
              "--seq-len", "4096"),
    "catalog-list": ("catalog", "list"),
    "catalog-cluster": ("catalog", "show", "dgx-h100"),
    "catalog-model": ("catalog", "show", "deepseek-v3"),
    "catalog-link": ("catalog", "show", "nvlink4"),
    "catalog-accelerator": ("catalog", "show", "h100-sxm"),
    "runs": ("runs", "check", "--limit", "3"),
}  # fmt: skip


def assert_numbers_whole(out: str, width: int) -> None:
    """Lines fit ``width`` and no number is cut (a digit, point or % right before …)."""
    for line in out.splitlines():
        assert len(line) <= width, line
        assert re.search(r"[\d.,%]…", line) is None, line


@pytest.mark.parametrize("argv", COMMAND_TABLES.values(), ids=COMMAND_TABLES.keys())
def test_every_command_table_fits_80_columns_with_every_number_whole(capsys, monkeypatch, argv):
    out = render(capsys, monkeypatch, 80, *argv)
    assert_numbers_whole(out, 80)
    wide = render(capsys, monkeypatch, 200, *argv)  # the same numbers at any width
    numbers = re.compile(r"-?\d[\d,]*\.\d+")
    assert sorted(numbers.findall(out)) == sorted(numbers.findall(wide))


@pytest.mark.parametrize(
    "argv",
    [
        (),
        ("--schedule", "interleaved-1f1b"),
        # DeepSeek-V3: five degrees per row (pinned to keep the test fast; same widths).
        (*DEEPSEEK_QUERY, "--tp", "1", "--cp", "1,2", "--pp", "8,16"),
        # Six: the routed experts' TP degree differs from tp (the widest degrees).
        (*DEEPSEEK_QUERY, "--tp", "4", "--etp", "1", "--pp", "2", "--schedule", "dualpipev"),
    ],
    ids=["llama3-default", "llama3-interleaved", "deepseek-v3", "deepseek-v3-etp"],
)
def test_plan_table_fits_80_columns_with_every_value_whole(capsys, monkeypatch, argv):
    out = render(capsys, monkeypatch, 80, "plan", *argv)
    assert_fits(out, 80)
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("#"))
    for column in ("step s", "MFU%", "GiB", "bub%"):
        assert column in header
    rows = [line.split() for line in lines if re.match(r"\d+ ", line)]
    assert [int(row[0]) for row in rows] == list(range(1, len(rows) + 1))
    rule = next(i for i, line in enumerate(lines) if line.startswith("─"))
    assert lines[rule + 1 : rule + 1 + len(rows)] == [
        line for line in lines if re.match(r"\d+ ", line)
    ], "a row folded onto a second line"
    after = lines[rule + 1 + len(rows)]  # a folded cell's second line starts blank
    assert not after.startswith(" "), "a row folded onto a second line"


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


def test_estimate_explain_names_the_attention_kernel_its_stack_ran(capsys, monkeypatch):
    """The explanation reads the kernel the estimate timed: a Megatron stack's cuDNN one."""
    from hwspecs.catalog import load_accelerator

    out = render(capsys, monkeypatch, 80, "estimate", "--explain", "--stack", "megatron")
    source = load_accelerator("h100-sxm").source_of("attention_curves.cudnn")
    assert " ".join(source.split()) in " ".join(out.split())
    assert "attention kernel cudnn" in " ".join(out.split())  # the profile line says it too
    plain = render(capsys, monkeypatch, 80, "estimate")
    assert "attention kernel" not in plain  # no stack, no kernel named: the default rates


def test_estimate_explain_says_where_sliding_window_layers_run_their_own_rate(capsys, monkeypatch):
    """GPT-OSS-120B at 8K: its 18 windowed layers at the kernel's rate for 128 keys, the
    curve held at its shortest measured length (cudnn-frontend's GB200 cuDNN at 512 tokens:
    408 forward, 329 backward TFLOP/s), and the MFU line counts their window."""
    pins = ("--model", "gpt-oss-120b", "--cluster", "gb200-nvl72", "--gpus", "64",
            "--seq-len", "8192", "--global-batch-size", "1280", "--tp", "1", "--pp", "1",
            "--cp", "1", "--ep", "64", "--dp", "64")  # fmt: skip
    out = " ".join(render(capsys, monkeypatch, 80, "estimate", *pins, "--explain").split())
    window = "its 18 sliding-window layers at their 128-key window: forward 408, backward 329"
    assert window in out
    assert "18 layers' in a 128-key window" in out
    dense = " ".join(render(capsys, monkeypatch, 80, "estimate", "--explain").split())
    assert "sliding-window" not in dense


# ----- the schedule timeline -----------------------------------------------------------


def _printed_rows(out: str, pp: int) -> dict[int, list[int]]:
    """Micro-batch numbers per rank, read left to right through every band."""
    rows: dict[int, list[int]] = {rank: [] for rank in range(pp)}
    for line in out.splitlines():
        match = re.match(r"rank (\d+) (.*)", line)
        if match:
            rows[int(match[1])] += [int(value) for value in match[2].split()]
    return rows


def _runs(values):
    return [value for i, value in enumerate(values) if i == 0 or values[i - 1] != value]


def _simulated_order(report, rank):
    return sorted(
        (item for item in report.timeline if item.rank == rank and item.end > item.start),
        key=lambda item: item.start,
    )


def test_interleaved_timeline_at_80_columns_is_the_simulators_order(capsys, monkeypatch):
    from planner.pipeline.report import schedule_report

    argv = ("schedule", "--schedule", "interleaved-1f1b", "--pp", "8", "--microbatches", "32")
    out = render(capsys, monkeypatch, 80, *argv)
    assert_fits(out, 80)
    assert "exact" in out and "wrapped into" in out
    report = schedule_report("interleaved-1f1b", 8, 32)
    printed = _printed_rows(out, 8)
    for rank in range(8):
        simulated = [item.microbatch for item in _simulated_order(report, rank)]
        assert _runs(printed[rank]) == _runs(simulated), rank
    # The warm-up bubble: the last rank idles while the first forwards reach it.
    last_rank = next(line for line in out.splitlines() if line.startswith("rank 7"))
    first_start = min(item.start for item in report.timeline if item.rank == 7)
    cell_text_width = 3
    assert last_rank[len("rank 7 ") :].startswith(" " * int(first_start / 0.5) * cell_text_width)


@pytest.mark.parametrize(
    ("name", "pp", "microbatches"),
    [("interleaved-1f1b", 8, 32), ("zbv", 4, 8), ("dualpipe", 16, 128), ("1f1b", 16, 256)],
)
def test_chart_cells_never_reorder_or_overwrite_actions(name, pp, microbatches):
    """Exact charts show every action in order; compressed ones a subsequence, and say so."""
    from planner.pipeline.report import schedule_report
    from plots.schedule_chart import chart_grid, scale_note

    report = schedule_report(name, pp, microbatches)
    grid = chart_grid(report, cells_per_band=24, max_bands=4)
    index_of = {id(item): index for index, item in enumerate(report.timeline)}
    for rank in range(pp):
        shown = _runs([int(index) for index in grid.cells[rank] if index >= 0])
        order = [index_of[id(item)] for item in _simulated_order(report, rank)]
        if grid.exact:
            assert shown == order
        else:
            position = {index: place for place, index in enumerate(order)}
            assert [position[index] for index in shown] == sorted(position[i] for i in shown)
    note = scale_note(grid, 2)
    if not grid.exact:
        assert "compressed" in note and f"1 cell = {grid.cell_time:g}" in note
        assert grid.cell_time > grid.base_unit
        assert f"{grid.hidden_actions:,} actions not shown" in note


def test_compressed_chart_keeps_the_warm_up_bubble_visible():
    from planner.pipeline.report import schedule_report
    from plots.schedule_chart import chart_grid

    report = schedule_report("1f1b", 16, 256)
    grid = chart_grid(report, cells_per_band=24, max_bands=6)
    assert not grid.exact
    first_start = min(item.start for item in report.timeline if item.rank == 15)
    idle_cells = int(first_start // grid.cell_time)
    assert idle_cells >= 1 and (grid.cells[15, :idle_cells] == -1).all()


# ----- the catalog -----------------------------------------------------------------------


def test_readme_cluster_template_loads_and_plans(tmp_path, capsys, monkeypatch):
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    template = readme.split("### Your own cluster", 1)[1].split("```toml\n", 1)[1].split("```")[0]
    path = tmp_path / "mine.toml"
    path.write_text(template)
    out = render(capsys, monkeypatch, 100, "plan", "--cluster", str(path), "--model", "llama3-8b")
    assert "64 GPUs of my-h100-cluster" in " ".join(out.split())


def test_misspelt_cluster_key_is_named_with_a_suggestion(tmp_path, capsys):
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    template = readme.split("### Your own cluster", 1)[1].split("```toml\n", 1)[1].split("```")[0]
    path = tmp_path / "typo.toml"
    path.write_text(template.replace("gpus_per_node = 8", "gpus_per_nod = 8"))
    code = cli.main(["plan", "--cluster", str(path), "--model", "llama3-8b"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "'gpus_per_nod': unknown key (did you mean 'gpus_per_node'?)" in err
    assert "more)" not in err


def _template() -> str:
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    return readme.split("### Your own cluster", 1)[1].split("```toml\n", 1)[1].split("```")[0]


def test_own_cluster_without_sources_plans_with_a_warning_naming_them(tmp_path, capsys):
    path = tmp_path / "unsourced.toml"
    path.write_text(_template().split("[sources]")[0])
    code = cli.main(["plan", "--cluster", str(path), "--model", "llama3-8b", "--top", "1",
                     "--json"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)["query"]["cluster"] == "my-h100-cluster"
    (line,) = [line for line in err.splitlines() if line.startswith("warning:")]
    for field in ("num_gpus", "gpus_per_node", "scale_up_domain_size", "tiers.1.group_size"):
        assert field in line


def test_catalog_files_must_still_cite_every_number():
    from hwspecs.catalog import DATA_DIR, parse_spec, read_toml
    from hwspecs.errors import PlanError
    from hwspecs.schema import Cluster

    data = read_toml(DATA_DIR / "clusters" / "dgx-h100.toml")
    del data["sources"]["num_gpus"]
    with pytest.raises(PlanError, match="numbers without a source in \\[sources\\]: num_gpus"):
        parse_spec(data, Cluster, "dgx-h100")


def test_every_unknown_key_is_named_with_a_suggestion_nested_ones_too(tmp_path, capsys):
    path = tmp_path / "typos.toml"
    text = _template().replace("group_size = 64", "group_sise = 64")
    path.write_text(text.replace("gpus_per_node = 8", "gpus_per_nod = 8"))
    assert cli.main(["plan", "--cluster", str(path), "--model", "llama3-8b"]) == 2
    err = capsys.readouterr().err
    assert "'gpus_per_nod': unknown key (did you mean 'gpus_per_node'?)" in err
    assert "'tiers.1.group_sise': unknown key (did you mean 'group_size'?)" in err
    path.write_text(_template().replace('link = "nvlink4"', 'link = "nvlink4"\nspeed = 1'))
    assert cli.main(["plan", "--cluster", str(path), "--model", "llama3-8b"]) == 2
    err = capsys.readouterr().err
    assert "'tiers.0.speed': unknown key (allowed: name, link, group_size, oversubscription)" in err


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("h100-sxm", ["79.65 GiB (85.5 GB)", "3.35 TB/s", "989.4 TFLOP/s", "mamf-finder"]),
        ("nvlink4", ["450.0 GB/s", "3.4 µs", "busbw_efficiency.ring", "nccl-tests"]),
        ("llama3-405b", ["405,853,388,800 (405.85 B)", "(shape)", "Table 3"]),
        ("cluster:mi300x", ["cluster mi300x", "tiers[0].name"]),
        ("mi300x", ["gpu mi300x", "192.00 GiB"]),
    ],
)
def test_catalog_show_formats_values_with_units_and_sources(capsys, monkeypatch, name, expected):
    out = render(capsys, monkeypatch, 120, "catalog", "show", name)
    text = " ".join(out.split())
    for piece in expected:
        assert piece in text
    assert "None" not in out and "{'" not in out  # no Python reprs


def test_catalog_show_says_a_shared_name_has_another_kind(capsys):
    assert cli.main(["catalog", "show", "mi300x"]) == 0
    assert "catalog show cluster:mi300x" in capsys.readouterr().err
    assert cli.main(["catalog", "show", "mi300x", "--kind", "cluster", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "cluster"


def test_estimate_warns_when_tp_crosses_the_scale_up_domain(capsys):
    assert cli.main(["estimate", "--tp", "16", "--dp", "64"]) == 0
    err = capsys.readouterr().err
    assert "warning: tp 16 crosses the 8-GPU scale-up domain" in err
    assert cli.main(["estimate", "--tp", "16", "--dp", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"][0].startswith("tp 16 crosses")
    assert cli.main(["estimate"]) == 0
    assert "warning" not in capsys.readouterr().err
