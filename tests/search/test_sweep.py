"""`llmplan sweep`: the plan's winner at each GPU count or sequence length."""

import json

import pytest

from tests.cli_runner import run

SMALL = ("--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch-tokens", "1048576")


def test_gpu_sweep_json_has_one_winner_per_point(capsys, tmp_path):
    page = tmp_path / "sweep.html"
    code, out, _ = run(capsys, "sweep", *SMALL, "--gpus", "16,32,64", "--seq-len", "4096",
                       "--train-tokens", "1T", "--json", "--html", str(page))  # fmt: skip
    assert code == 0
    result = json.loads(out)
    assert result["quantity"] == "gpus"
    points = result["points"]
    assert [p["num_gpus"] for p in points] == [16, 32, 64]
    for point in points:
        layout = point["layout"]
        assert layout["tp"] * layout["cp"] * layout["pp"] * layout["dp"] == point["num_gpus"]
        assert 0 < point["time_to_train"]["goodput"] <= 1
    # More GPUs: more interruptions per hour for the job (the same rate per GPU-hour).
    mtbf = [p["time_to_train"]["mean_time_between_interruptions_s"] for p in points]
    assert mtbf == sorted(mtbf, reverse=True)
    assert "<html" in page.read_text()[:200]


def test_seq_len_sweep_keeps_the_gpu_count(capsys):
    code, out, _ = run(capsys, "sweep", *SMALL, "--gpus", "32", "--seq-len", "2048,4096",
                       "--json")  # fmt: skip
    assert code == 0
    points = json.loads(out)["points"]
    assert [(p["num_gpus"], p["seq_len"]) for p in points] == [(32, 2048), (32, 4096)]
    assert all(p["time_to_train"] is None for p in points)


@pytest.mark.parametrize(
    "argv", [("sweep", *SMALL, "--gpus", "32"), ("sweep", *SMALL, "--gpus", "8,16",
                                                "--seq-len", "1024,2048")]
)  # fmt: skip
def test_sweep_needs_exactly_one_list(capsys, argv):
    code, _, err = run(capsys, *argv)
    assert code == 2 and "sweep one quantity" in err and err.count("\n") == 1


def test_a_point_where_nothing_fits_is_reported_and_the_sweep_goes_on():
    """Llama 3 70B does not fit on 8 H100s in any layout; on 64 it does."""
    from planner import api

    fields = {"model": "llama3-70b", "seq_len": 8192, "global_batch_tokens": 2**20}
    result = api.sweep(fields, "dgx-h100", "gpus", [8, 64])
    small, large = result.points
    assert small.feasible == 0 and small.layout is None and small.step_time_s is None
    assert large.feasible > 0 and large.step_time_s > 0
