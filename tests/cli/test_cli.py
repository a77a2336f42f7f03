"""The CLI: JSON shapes, and one-line errors with exit code 2."""

import pytest

from tests.cli_runner import run, run_json


def test_bytes_per_param_default_is_16(capsys):
    result = run_json(capsys, "bytes-per-param")
    assert result["bytes_per_param"] == 16
    assert set(result["breakdown"]) == {
        "weights",
        "gradients",
        "master_weights",
        "optimizer_states",
    }


def test_bytes_per_param_fp32_grads_is_18(capsys):
    assert run_json(capsys, "bytes-per-param", "--grad-dtype", "fp32")["bytes_per_param"] == 18


def test_bytes_per_param_zero1_dp64(capsys):
    result = run_json(capsys, "bytes-per-param", "--zero-stage", "1", "--dp", "64")
    assert result["bytes_per_param"] == pytest.approx(4 + 12 / 64)


def test_bytes_per_param_with_model_gives_total(capsys):
    result = run_json(capsys, "bytes-per-param", "--model", "llama3-8b")
    assert result["total_bytes"] == pytest.approx(16 * result["num_params"])


def test_catalog_list_json(capsys):
    result = run_json(capsys, "catalog", "list")
    assert "llama3-405b" in result["models"]
    assert "h100-sxm" in result["accelerators"]
    assert "llama3-h100-24k" in result["clusters"]


def test_catalog_show_model_has_param_counts(capsys):
    result = run_json(capsys, "catalog", "show", "mixtral-8x7b")
    assert result["num_params"] == pytest.approx(46.7e9, rel=0.003)
    assert result["num_active_params"] == pytest.approx(12.9e9, rel=0.003)


def test_catalog_show_accelerator_has_sources(capsys):
    result = run_json(capsys, "catalog", "show", "h100-sxm")
    assert result["bf16_tflops"] == 989.4
    assert "bf16_tflops" in result["sources"]


def test_plan_does_not_crash(capsys):
    code, out, _ = run(capsys, "plan")
    assert code == 0 and out


def assert_one_line_error(code, out, err, *fragments):
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["catalog", "show", "llama3-40b"], ["llama3-40b", "did you mean"]),
        (["memory", "--model", "llama3-450b"], ["unknown model", "llama3-405b"]),
        (["memory", "--tp", "3"], ["tp 3", "num_attention_heads 128"]),
        (["memory", "--pp", "127"], ["num_layers 126", "pp·vpp"]),
        (["memory", "--tp", "0"], ["--tp"]),
        (["memory", "--seq-len", "-5"], ["--seq-len"]),
        (["memory", "--schedule", "1f1x"], ["--schedule takes", "did you mean '1f1b'"]),
        (["memory", "--accelerator", "h100"], ["unknown accelerator", "h100-sxm"]),
        (["bytes-per-param", "--optimizer", "adam"], ["--optimizer", "adamw"]),
        (["bytes-per-param", "--zero-stage", "4"], ["--zero-stage"]),
        (["memory", "--model", "/nonexistent/config.json"], ["file not found"]),
        (["catalog", "list", "gpus"], ["unknown catalog kind", "models"]),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, argv, fragments):
    assert_one_line_error(*run(capsys, *argv), *fragments)


def test_bad_cluster_file_names_the_field(capsys, tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(
        'id = "x"\nname = "x"\nvendor = "v"\nbf16_tflops = 1\nhbm_bytes = 1\n'
        'hbm_bytes_per_s = 1\ncolour = "red"\n'
    )
    code, out, err = run(capsys, "memory", "--model", "llama3-8b", "--accelerator", str(path))
    assert_one_line_error(code, out, err, "colour", "unknown key")


def test_malformed_toml(capsys, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("id = [\n")
    assert_one_line_error(*run(capsys, "memory", "--accelerator", str(path)), "malformed TOML")


def test_collective_json_shape_and_nvls_busbw(capsys):
    result = run_json(
        capsys,
        "collective",
        "--op",
        "all-reduce",
        "--bytes",
        "1GiB",
        "--ranks",
        "8",
        "--cluster",
        "dgx-h100",
    )
    assert {"time_s", "algbw_bytes_per_s", "busbw_bytes_per_s", "algorithm", "tiers"} <= set(result)
    assert result["tiers"] == ["nvlink"]
    assert (
        470e9 < result["busbw_bytes_per_s"] < 485e9
    )  # nccl-tests NVLS on 8×H100/H200: 476–480 GB/s


def test_comm_llama3_layout_tp_on_nvlink_dp_across_pods(capsys):
    result = run_json(
        capsys, "comm", "--cluster", "llama3-h100-24k", "--tp", "8", "--pp", "16", "--dp", "128"
    )
    axes = {axis["axis"]: axis for axis in result["axes"]}
    assert axes["tp"]["tier"] == "nvlink"
    assert axes["dp"]["tier"] == "cluster"
    for axis in axes.values():
        assert {
            "axis",
            "group_size",
            "tier",
            "collective",
            "bytes_per_step",
            "time_s",
            "exposed_time_s",
        } <= set(axis)


def test_topology_html(capsys, tmp_path):
    path = tmp_path / "topology.html"
    code, _, err = run(
        capsys, "topology", "--cluster", "dgx-h100", "--tp", "8", "--html", str(path)
    )
    assert code == 0, err
    assert "<html>" in path.read_text()[:200].lower()


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (
            [
                "collective",
                "--op",
                "all-reduce",
                "--bytes",
                "1GiB",
                "--ranks",
                "4096",
                "--cluster",
                "dgx-h100",
            ],
            ["4096"],
        ),
        (
            [
                "collective",
                "--op",
                "all-reduce",
                "--bytes",
                "1GiB",
                "--ranks",
                "8",
                "--algorithm",
                "nvls",
                "--cluster",
                "dgx-a100",
            ],
            ["nvls"],
        ),
        (["collective", "--op", "all-reduce", "--bytes", "lots", "--ranks", "8"], ["lots"]),
        (["topology", "--cluster", "dgx-h100", "--tp", "3", "--pp", "1"], ["3"]),
        (["comm", "--cluster", "dgx-h100", "--tp", "8", "--pp", "16", "--dp", "128"], ["16384"]),
    ],
)
def test_comm_bad_input_is_one_line_exit_2(capsys, argv, fragments):
    assert_one_line_error(*run(capsys, *argv), *fragments)


def test_schedule_1f1b_acceptance(capsys):
    """Issue acceptance: 1F1B, pp 4, m 8, F = B = W = 1 → step 33, peak activations 4 … 1."""
    result = run_json(capsys, "schedule", "--schedule", "1f1b", "--pp", "4", "--microbatches", "8")
    assert result["step_time"] == 33
    assert result["peak_activations"] == [4, 3, 2, 1]
    row = result["timeline"][0]
    assert set(row) == {"rank", "stage_index", "microbatch", "action", "start", "end"}


def test_schedule_compare_writes_one_html_page(capsys, tmp_path):
    path = tmp_path / "compare.html"
    code, out, err = run(
        capsys,
        "schedule",
        "--compare",
        "1f1b,zb-h1,zbv,dualpipev",
        "--pp",
        "4",
        "--microbatches",
        "8",
        "--html",
        str(path),
    )
    assert code == 0, err
    assert all(name in out for name in ("1f1b", "zb-h1", "zbv", "dualpipev"))
    assert path.read_text().count("<html") == 1


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (
            ["schedule", "--schedule", "interleaved-1f1b", "--pp", "4", "--microbatches", "6"],
            ["multiple of pp"],
        ),
        (["schedule", "--schedule", "dualpipe", "--pp", "3", "--microbatches", "8"], ["even"]),
        (["schedule", "--schedule", "zbv", "--vpp", "3"], ["vpp"]),
        (["schedule", "--schedule", "1f2b"], ["--schedule takes", "did you mean '1f1b'"]),
        (["schedule", "--overlap-fb", "2"], ["overlap"]),
    ],
)
def test_schedule_bad_input_is_one_line_exit_2(capsys, argv, fragments):
    assert_one_line_error(*run(capsys, *argv), *fragments)


def test_weight_pass_memory_flag_counts_torchs_retained_graph(capsys):
    args = ("memory", "--model", "llama3-8b", "--seq-len", "4096", "--tp", "1", "--pp", "4",
            "--dp", "8", "--schedule", "zb-h1")  # fmt: skip
    inputs = run_json(capsys, *args)
    graph = run_json(capsys, *args, "--weight-pass-memory", "graph")
    assert graph["memory_per_gpu_bytes"] > inputs["memory_per_gpu_bytes"]
    code, _, err = run(capsys, *args, "--weight-pass-memory", "all")
    assert code == 2 and "weight-pass-memory" in err
