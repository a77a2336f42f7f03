"""Expert tensor parallelism (``etp``, Megatron-Core's MoE parallel folding).

etp = tp (or unset) is the model as it was; etp = 1 < tp keeps the routed experts whole and
folds the tp/etp TP ranks into the EP group: per-rank FLOPs stay, expert weights per rank
grow tp/etp-fold, the expert-data-parallel group grows with them, the EP group moves onto
neighbouring (NVLink) ranks and an MoE layer without shared experts drops its MLP's TP
collectives.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cli
from hwspecs.catalog import load_accelerator, load_cluster
from hwspecs.errors import PlanError
from planner import api
from planner.comm.mesh import group_size
from planner.comm.report import axis_traffic
from planner.comm.topology import place_groups
from planner.cost.compute import GpuRates, layer_op_times
from planner.cost.optimizers import optimizer_step_cost
from planner.estimate import layout_columns
from planner.evaluate import evaluate_columns
from planner.explain import explain_estimate
from planner.memory_report import memory_report
from planner.search import SearchSpace, search
from planner.spec.layout import Layout
from planner.spec.model import load_model
from planner.spec.rules import check_layout

H100 = load_accelerator("h100-sxm")
DGX = load_cluster("dgx-h100")
MOE_MODELS = ("mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3")


def _same_estimate(job, layout: Layout, cluster: str, gpus=None) -> None:
    """The estimate with etp unset equals the one with etp = tp, field by field."""
    unset = api.estimate(job, layout, cluster, gpus).model_dump()
    explicit = api.estimate(job, layout.model_copy(update={"etp": layout.tp}), cluster, gpus)
    explicit = explicit.model_dump()
    assert explicit["layout"].pop("etp") == layout.tp and unset["layout"].pop("etp") is None
    assert explicit == unset


def test_deepseek_v3_published_layout_is_the_same_with_etp_unset_or_tp():
    job = api.build_job("deepseek-v3", 4096, global_batch_size=15360)
    layout = api.build_layout(tp=1, pp=16, ep=64, dp=128, schedule="dualpipe", zero_stage=1)
    _same_estimate(job, layout, "dgx-h800", 2048)


def test_mixtral_tp2_ep4_is_the_same_with_etp_unset_or_tp():
    job = api.build_job("mixtral-8x7b", 4096, global_batch_size=256)
    _same_estimate(job, api.build_layout(tp=2, pp=1, dp=32, ep=4), "dgx-h100")


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(MOE_MODELS),
    tp=st.sampled_from([2, 4, 8]),
    ep_per_tp=st.sampled_from([1, 2, 4]),
    sp=st.booleans(),
)
def test_flops_a_rank_runs_do_not_depend_on_etp(name, tp, ep_per_tp, sp):
    """Folded (etp = 1): rows × etp/tp at width f/etp, the same FLOPs as split experts."""
    model = load_model(name)
    ep = min(tp * ep_per_tp, model.num_routed_experts)
    rates = GpuRates.of(H100, "bf16")

    def ops(etp):
        found = layer_op_times(model, 4096, 1, tp, 1, ep, sp, True, True, rates, etp=etp)
        return {op.name: op.forward_flops for op in found}

    split, whole = ops(None), ops(1)
    assert split.keys() == whole.keys()
    for op_name, flops in split.items():
        assert whole[op_name] == pytest.approx(flops, rel=1e-12), op_name


def _mixtral_layout(etp: int, zero: int = 1) -> tuple:
    job = api.build_job("mixtral-8x7b", 4096, global_batch_size=64)
    return job, Layout(tp=2, pp=1, dp=8, ep=4, etp=etp, zero_stage=zero)


def test_whole_experts_double_the_expert_weights_per_rank_at_tp2():
    bytes_per_rank = {}
    for etp in (1, 2):
        job, layout = _mixtral_layout(etp, zero=0)
        report = memory_report(job, layout, H100)
        stage = report.per_stage[0]
        bytes_per_rank[etp] = stage.num_expert_params
        dense = stage.num_params - stage.num_expert_params
        bytes_per_rank[etp, "dense"] = dense
    assert bytes_per_rank[1] == pytest.approx(2 * bytes_per_rank[2], abs=1)
    assert bytes_per_rank[1, "dense"] == bytes_per_rank[2, "dense"]  # attention, router: tp


@pytest.mark.parametrize("etp", [1, 2])
def test_expert_data_parallel_group_is_tp_dp_cp_over_etp_ep(etp):
    _, layout = _mixtral_layout(etp)
    expected = layout.tp * layout.dp * layout.cp // (etp * layout.ep)
    assert layout.expert_zero_group_size == expected
    placement = place_groups(DGX, layout)
    assert placement.groups["edp"].group_size == expected
    assert group_size("edp", placement.sizes) == expected


@pytest.mark.parametrize("etp", [1, 2])
def test_zero1_steps_the_experts_over_the_expert_data_parallel_group(etp):
    """Under ZeRO-1 a rank steps 1/(dp·cp) of its dense parameters and 1/edp of its routed
    experts, edp = tp·dp·cp/(etp·ep)."""
    job, layout = _mixtral_layout(etp)
    result = api.estimate(job, layout, "dgx-h100")
    stage = result.per_stage_memory[0]
    dense = stage.num_params - stage.num_expert_params
    rank_params = dense / 8 + stage.num_expert_params / layout.expert_zero_group_size
    per_param = optimizer_step_cost(job.precision, 1.0).bytes_moved
    hbm = GpuRates.of(H100, job.precision.gemm_dtype).hbm_bytes_per_s
    expected = rank_params * per_param / hbm
    assert result.time_breakdown_s["optimizer"] == pytest.approx(expected, rel=1e-6)


def test_columns_memory_equals_the_memory_report_with_whole_experts():
    job, layout = _mixtral_layout(1)
    m = layout.resolved_num_microbatches(job.global_batch_size)
    row = evaluate_columns(job, DGX, H100, layout_columns(layout, m))
    assert row["memory_per_gpu_bytes"][0] == pytest.approx(
        memory_report(job, layout, H100).total_bytes, rel=1e-12
    )


def test_folded_ep_group_is_eight_neighbours_on_one_node():
    """tp 2, etp 1, ep 8, dp 8 on DGX H100: each EP group is 8 consecutive ranks (4 TP
    groups) inside one NVLink node; with etp 2 it is strided over two nodes."""
    folded = place_groups(DGX, {"tp": 2, "etp": 1, "ep": 8, "dp": 8})
    group = folded.groups["ep"]
    assert group.example_ranks == tuple(range(8))
    assert len({rank // 2 for rank in group.example_ranks}) == 4  # TP groups it spans
    assert [level.tier for level in group.levels] == ["nvlink"]
    split = place_groups(DGX, {"tp": 2, "ep": 8, "dp": 8}).groups["ep"]
    assert split.example_ranks == tuple(range(0, 16, 2))
    assert split.levels[-1].tier != "nvlink"


def test_folded_all_to_all_sends_the_same_bytes_over_a_faster_group():
    job = api.build_job("mixtral-8x7b", 4096, global_batch_size=64)
    reports = {
        etp: {a.axis: a for a in axis_traffic(job, Layout(tp=2, dp=8, ep=8, etp=etp), DGX).axes}
        for etp in (1, 2)
    }
    assert reports[1]["ep"].bytes_per_step == pytest.approx(reports[2]["ep"].bytes_per_step)
    assert reports[1]["ep"].time_s < reports[2]["ep"].time_s
    assert reports[1]["ep"].tier == "nvlink"


def _tp_all_gathers(name: str, etp: int) -> float:
    job = api.build_job(name, 4096, global_batch_size=64)
    layout = Layout(tp=2, dp=8, ep=8, etp=etp)
    tp = next(a for a in axis_traffic(job, layout, DGX).axes if a.axis == "tp")
    return next(t.count_per_step for t in tp.terms if t.collective == "all-gather")


def test_moe_layers_without_shared_experts_keep_only_attentions_tp_collectives():
    model = load_model("mixtral-8x7b")
    m = 64 // 8  # micro-batches of one sequence
    ends = 2  # the embedding and the LM head on the one pipeline rank
    assert _tp_all_gathers("mixtral-8x7b", 2) == m * (4 * model.num_layers + ends)
    assert _tp_all_gathers("mixtral-8x7b", 1) == m * (2 * model.num_layers + ends)


def test_moe_layers_with_shared_experts_keep_their_tp_collectives():
    assert _tp_all_gathers("deepseek-v3", 1) == _tp_all_gathers("deepseek-v3", 2)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tp": 4, "dp": 16, "ep": 4, "etp": 2}, "etp must be 1 or tp (=4); got 2"),
        ({"tp": 4, "dp": 16, "ep": 2, "etp": 1}, "ep 2 is not a multiple of tp/etp = 4"),
        ({"tp": 2, "dp": 3, "ep": 4, "etp": 1}, "ep/(tp/etp) = 2 does not divide dp·cp = 3"),
    ],
)
def test_illegal_etp_is_rejected_naming_the_numbers(fields, message):
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_layout(Layout(**fields), load_model("mixtral-8x7b"))


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--tp", "4", "--dp", "16", "--ep", "4", "--etp", "2"], "etp must be 1 or tp (=4)"),
        (["--tp", "4", "--dp", "16", "--ep", "2", "--etp", "1"], "not a multiple of tp/etp"),
    ],
)
def test_cli_etp_errors_are_one_line_exit_2(capsys, flags, fragment):
    argv = ["estimate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--pp", "1"]
    code = cli.main([*argv, *flags, "--seq-len", "4096", "--global-batch-size", "256"])
    _, err = capsys.readouterr()
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert fragment in err


#: A small corner of the brief's query (Mixtral on 64 H100s, tp 2), pinned to stay fast.
SMALL_SPACE = SearchSpace(
    tp=[2],
    pp=[1, 2],
    schedule=["1f1b"],
    micro_batch_size=[1],
    zero_stage=[1],
    recompute=["none"],
    sequence_parallel=[True],
)


def test_search_lists_whole_and_split_experts_and_each_row_is_its_estimate():
    job = api.build_job("mixtral-8x7b", 4096, global_batch_size=256)
    found = search(job, DGX, H100, 64, SMALL_SPACE)
    table = found.table
    assert set(table["etp"]) == {1, 2}
    rng = np.random.default_rng(0)
    for row in rng.choice(len(table), 6, replace=False):
        entry = table.iloc[row]
        fields = {k: int(entry[k]) for k in ("tp", "cp", "pp", "dp", "ep", "etp", "vpp")}
        layout = Layout(**fields, num_microbatches=int(entry["num_microbatches"]),
                        cp_algorithm=entry["cp_algorithm"])  # fmt: skip
        result = api.estimate(job, layout, "dgx-h100", 64)
        assert result.step_time_s == pytest.approx(entry["step_time_s"], rel=1e-12)
        assert result.memory_per_gpu_bytes == pytest.approx(
            entry["memory_per_gpu_bytes"], rel=1e-12
        )


def test_search_counts_the_folding_rule_it_rejects():
    job = api.build_job("mixtral-8x7b", 4096, global_batch_size=256)
    space = SMALL_SPACE.model_copy(update={"ep": [1, 2, 4, 8], "etp": [1]})
    found = search(job, DGX, H100, 64, space)
    assert found.rejected["ep is not a multiple of tp/etp (etp 1 folds TP into EP)"] > 0
    assert set(found.table["etp"]) == {1}


def test_plan_csv_and_json_carry_etp(capsys, tmp_path):
    path = tmp_path / "rows.csv"
    code = cli.main(
        ["plan", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64",
         "--seq-len", "4096", "--global-batch-size", "256", "--tp", "2", "--pp", "1",
         "--schedule", "1f1b", "--micro-batch-size", "1", "--zero-stage", "1",
         "--recompute", "none", "--top", "40", "--csv", str(path), "--json"]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert set(pd.read_csv(path)["etp"]) == {1, 2}
    layouts = [entry["layout"] for entry in json.loads(out)["results"]]
    assert {layout["etp"] for layout in layouts} <= {1, 2} and layouts


def test_emitted_launch_settings_name_the_expert_tp():
    entry = {"layout": Layout(tp=2, dp=8, ep=8, etp=1).model_dump()}
    job = api.build_job("mixtral-8x7b", 4096, global_batch_size=64)
    assert "--expert-tensor-parallel-size 1" in api.emit_settings(entry, "megatron", job).text
    # torchtitan has no expert TP degree: EP borrows its ranks from FSDP and TP (etp 1).
    assert (
        "--parallelism.expert_parallel_degree 8" in api.emit_settings(entry, "torchtitan", job).text
    )


def test_estimate_explains_the_folded_expert_group():
    job = api.build_job("mixtral-8x7b", 4096, global_batch_size=64)
    layout = Layout(tp=2, pp=1, dp=8, ep=8, etp=1)
    text = " ".join(explain_estimate(api.estimate(job, layout, "dgx-h100"), job))
    assert "1 whole routed expert per rank (etp 1)" in text
    assert "the 2 TP ranks fold into each EP group of 8, 4 of it carved out of dp·cp" in text
