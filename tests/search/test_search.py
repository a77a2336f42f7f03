"""The layout search and `llmplan plan` / `llmplan estimate`."""

import json
import re

import numpy as np
import pytest

from hwspecs.catalog import load_accelerator, load_cluster
from planner.estimate import estimate
from planner.search import SearchSpace, search
from planner.spec.job import Job
from planner.spec.layout import Layout
from planner.spec.model import load_model
from tests.cli_runner import run

DGX = load_cluster("dgx-h100")
H100 = load_accelerator("h100-sxm")
JOB = Job(model=load_model("llama3-8b"), seq_len=4096, global_batch_tokens=4096 * 256)


def small_plan(capsys, *extra):
    code, out, err = run(
        capsys,
        "plan",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "64",
        "--seq-len",
        "4096",
        "--global-batch-size",
        "256",
        *extra,
    )
    return code, out, err


def test_search_counts_add_up_and_results_are_sorted():
    found = search(JOB, DGX, H100, 64)
    assert found.candidates_evaluated == found.feasible + sum(found.rejected.values())
    times = found.table["step_time_s"].to_numpy()
    assert np.all(np.diff(times) >= 0)
    assert (
        found.table["tp"] * found.table["cp"] * found.table["pp"] * found.table["dp"] == 64
    ).all()
    assert found.table["tp"].max() <= 8  # TP stays inside the 8-GPU NVLink domain


def test_search_row_equals_the_single_layout_estimate():
    found = search(JOB, DGX, H100, 64)
    row = found.table.iloc[0]
    layout = Layout(
        **{
            k: (row[k].item() if hasattr(row[k], "item") else row[k])
            for k in (
                "tp",
                "cp",
                "pp",
                "dp",
                "ep",
                "vpp",
                "micro_batch_size",
                "schedule",
                "zero_stage",
                "recompute",
                "sequence_parallel",
            )
        },
        num_microbatches=int(row["num_microbatches"]),
    )
    assert estimate(JOB, layout, DGX).step_time_s == pytest.approx(row["step_time_s"])


def test_pins_restrict_the_space():
    found = search(
        JOB, DGX, H100, 64, SearchSpace(tp=[2], pp=[4], schedule=["1f1b"], recompute=["none"])
    )
    assert set(found.table["tp"]) == {2} and set(found.table["pp"]) == {4}
    assert set(found.table["schedule"]) == {"1f1b"}


def test_cross_node_tp_is_rejected_with_its_reason():
    found = search(JOB, DGX, H100, 64, SearchSpace(tp=[16]))
    assert found.feasible == 0
    assert any("scale-up" in reason for reason in found.rejected)


def test_objectives_rank_differently():
    fast = search(JOB, DGX, H100, 64, objective="step_time").table.iloc[0]
    small = search(JOB, DGX, H100, 64, objective="memory").table.iloc[0]
    assert small["memory_per_gpu_bytes"] <= fast["memory_per_gpu_bytes"]
    assert fast["step_time_s"] <= small["step_time_s"]


def test_plan_json_shape(capsys):
    code, out, err = small_plan(capsys, "--json", "--top", "3")
    assert code == 0, err
    result = json.loads(out)
    assert {"query", "candidates_evaluated", "feasible", "rejected", "results"} <= set(result)
    first = result["results"][0]
    assert first["rank"] == 1
    assert set(first["layout"]) >= {
        "tp",
        "cp",
        "pp",
        "dp",
        "ep",
        "vpp",
        "micro_batch_size",
        "num_microbatches",
        "schedule",
        "zero_stage",
        "recompute",
        "sequence_parallel",
    }
    for key in (
        "step_time_s",
        "time_breakdown_s",
        "tokens_per_s_per_gpu",
        "model_tflops_per_gpu",
        "hardware_tflops_per_gpu",
        "mfu",
        "hfu",
        "memory_per_gpu_bytes",
        "memory_breakdown_bytes",
        "fits",
    ):
        assert key in first


def test_plan_explain_csv_html_and_emit(capsys, tmp_path):
    csv, html = tmp_path / "all.csv", tmp_path / "plan.html"
    code, out, err = small_plan(
        capsys, "--explain", "--csv", str(csv), "--html", str(html), "--emit", "megatron"
    )
    assert code == 0, err
    # --emit without --emit-out: the settings alone on stdout, the table on stderr.
    assert "--tensor-model-parallel-size" in out and "rejected" not in out
    out = err
    # The nearest miss says by how much it missed (the two GiB figures can round alike).
    text = " ".join(out.split())
    over = re.search(r"needs [\d.]+ GiB per GPU, [\d.]+ GiB available, ([\d,.]+) MiB over", text)
    assert over and float(over[1].replace(",", "")) > 0
    assert csv.read_text().count("\n") > 10
    assert "Pareto front" in html.read_text()
    code, out, _ = small_plan(capsys, "--emit", "torchtitan")
    assert "--parallelism.pipeline_parallel_degree" in out


def test_infeasible_plan_explains_and_exits_2_with_json_error(capsys):
    code, out, _ = run(
        capsys,
        "plan",
        "--model",
        "llama3-405b",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "8",
        "--seq-len",
        "8192",
        "--global-batch-size",
        "64",
        "--json",
    )
    assert code == 2
    error = json.loads(out)["error"]["message"]
    assert "no layout fits" in error and "GiB per GPU" in error


def test_estimate_json_and_explain(capsys):
    code, out, err = run(
        capsys,
        "estimate",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100",
        "--tp",
        "8",
        "--pp",
        "2",
        "--dp",
        "4",
        "--seq-len",
        "4096",
        "--global-batch-size",
        "64",
        "--json",
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["mfu"] > 0 and result["fits"]
    code, out, err = run(
        capsys,
        "estimate",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100",
        "--tp",
        "8",
        "--pp",
        "2",
        "--dp",
        "4",
        "--seq-len",
        "4096",
        "--global-batch-size",
        "64",
        "--explain",
    )
    assert code == 0 and "matmul efficiency" in out and "MFU =" in out
