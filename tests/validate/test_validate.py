"""Real torch.distributed runs (gloo, CPU): bytes, memory, pipeline order, failures.

The quick layouts run once for the module (about a minute on 2 cores); each test then
checks one behaviour of what they measured against a closed form, the planner or torch.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from planner.spec.layout import Layout  # noqa: E402
from validate.compare import compare  # noqa: E402
from validate.run import QUICK_LAYOUTS, TINY, TINY_MOE, run_layout, run_layouts  # noqa: E402
from validate.spec import RunSpec  # noqa: E402

F32 = 4  # bytes per element: the workloads train in FP32


@pytest.fixture(scope="module")
def quick():
    results = run_layouts(QUICK_LAYOUTS, timeout_s=150)
    return {result.name: result for result in results}


def rows(result, rank: int = 0) -> dict[tuple[str, str], object]:
    return {(row.axis, row.collective): row for row in result.ranks[rank].comm}


def activation_bytes(workload, tokens: int) -> int:
    """One [tokens, hidden] FP32 tensor."""
    return tokens * workload.hidden_size * F32


# ----- the workload itself ---------------------------------------------------------------


@pytest.mark.parametrize("workload", [TINY, TINY_MOE], ids=lambda w: w.name)
def test_workload_parameters_equal_the_planner_model_spec(workload):
    from validate.workloads.model import build_model

    model = build_model(workload)
    assert sum(p.numel() for p in model.parameters()) == workload.model_spec().num_params()


def test_fused_kernels_have_correct_gradients():
    from validate.workloads.model import _RMSNormFunction, _SwiGLUFunction

    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: _RMSNormFunction.apply(x, w, 1e-5), (x, w))
    a = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_SwiGLUFunction.apply, (a, b))


# ----- every quick layout trains what the serial model trains ------------------------------


def test_every_quick_layout_runs(quick):
    assert {name: r.status for name, r in quick.items()} == {s.name: "ok" for s in QUICK_LAYOUTS}


def test_every_quick_layout_reproduces_the_serial_losses(quick):
    """Step 1 checks the forward pass, step 2 (after one AdamW step) the gradients."""
    for name, result in quick.items():
        errors = result.loss_errors()
        assert errors is not None and len(errors) == 2, name
        assert max(errors) < 1e-6, (name, errors)


# ----- bytes per collective, counted at the call sites, equal the closed forms -----------


def test_fsdp2_gathers_the_weights_twice_and_reduce_scatters_the_gradients_once(quick):
    result, workload = quick["dp-fsdp2"], TINY
    params_bytes = workload.model_spec().num_params() * F32
    groups = workload.num_layers + 1  # one FSDP group per layer and the root
    for rank in range(2):
        table = rows(result, rank)
        assert table[("dp", "all_gather")].calls == 2 * groups
        assert table[("dp", "all_gather")].bytes == 2 * params_bytes
        assert table[("dp", "reduce_scatter")].calls == groups
        assert table[("dp", "reduce_scatter")].bytes == params_bytes


def test_sequence_parallel_gathers_and_scatters_each_block_input_and_output(quick):
    """Per layer 2 all-gathers and 2 reduce-scatters of [s, h] forward, the mirror backward,
    plus the embedding's reduce-scatter and the head's all-gather (and their backward)."""
    result, workload = quick["tp-sp"], TINY
    spec = next(s for s in QUICK_LAYOUTS if s.name == "tp-sp")
    tensor = activation_bytes(workload, spec.layout.micro_batch_size * workload.seq_len)
    calls = 4 * workload.num_layers + 2
    table = rows(result)
    for collective in ("all_gather", "reduce_scatter"):
        assert table[("tp", collective)].calls == calls
        assert table[("tp", collective)].bytes == calls * tensor


def test_pipeline_sends_one_activation_and_one_gradient_per_microbatch_hop(quick):
    workload = TINY
    for name, hops_per_rank in (("pp-1f1b", 1), ("pp-zbv", 2)):
        spec = next(s for s in QUICK_LAYOUTS if s.name == name)
        tensor = activation_bytes(workload, spec.layout.micro_batch_size * workload.seq_len)
        for rank in range(2):
            send = rows(quick[name], rank)[("pp", "send")]
            # pp = 2: each rank sends m tensors per cross-rank hop it owns (1F1B: one hop,
            # ZB-V: two, since the V's bottom hop stays on rank 1).
            assert send.bytes == hops_per_rank * spec.num_microbatches * tensor, name


def test_expert_all_to_all_sends_four_fixed_capacity_exchanges_on_every_rank(quick):
    """Dispatch and combine, forward and backward, of E × capacity rows per sequence: with
    capacity factor 1 that is every routed token, whatever the routing, on every rank."""
    result, workload = quick["ep"], TINY_MOE
    tokens = workload.seq_len  # one sequence per rank
    moe_layers = workload.num_layers - workload.num_dense_layers
    per_layer = 4 * tokens * workload.num_experts_per_token * workload.hidden_size * F32
    for rank in range(2):
        row = rows(result, rank)[("ep", "all_to_all")]
        assert (row.bytes, row.calls) == (moe_layers * per_layer, 4 * moe_layers)
        assert row.sent_bytes == row.bytes / 2  # equal splits: half stays on the rank


def test_capacity_positions_fill_first_choices_before_second_choices():
    from validate.workloads.moe import capacity_positions, expert_capacity

    # One sequence of 3 tokens, top-2 over 2 experts: first choices 0, 0, 1; second 1, 1, 0.
    ids = torch.tensor([[[0, 1], [0, 1], [1, 0]]])
    assert capacity_positions(ids, 2).tolist() == [[[0, 1], [1, 2], [0, 2]]]
    assert expert_capacity(seq_len=3, top_k=2, num_experts=2) == 3


def test_expert_layout_all_reduces_only_the_dense_gradients(quick):
    spec = TINY_MOE.model_spec()
    expert = (
        spec.num_moe_layers * spec.num_routed_experts * spec.mlp_params(spec.moe_ffn_hidden_size)
    )
    dense_bytes = (spec.num_params() - expert) * F32
    assert rows(quick["ep"])[("dp", "all_reduce")].bytes == dense_bytes


def test_all_gather_attention_moves_the_closed_form(quick):
    """Per layer: K and V of the whole sequence all-gathered in forward and again in
    backward, their gradients reduce-scattered once (module docstring)."""
    workload = TINY
    whole_kv = 2 * workload.num_kv_heads * workload.head_dim * workload.seq_len * F32
    for rank in range(2):
        table = rows(quick["cp-allgather"], rank)
        assert table[("cp", "all_gather")].bytes == 2 * workload.num_layers * whole_kv
        assert table[("cp", "reduce_scatter")].bytes == workload.num_layers * whole_kv


def test_causal_mask_of_load_balanced_chunks_lets_each_query_see_its_past():
    from validate.workloads.context_parallel import (
        causal_mask,
        gathered_positions,
        local_positions,
    )

    # seq 8, cp 2: rank 0 holds chunks 0 and 3 (positions 0, 1, 6, 7), rank 1 chunks 1 and 2.
    assert local_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    keys = gathered_positions(8, 2)
    assert keys.tolist() == [0, 1, 6, 7, 2, 3, 4, 5]
    visible = causal_mask(local_positions(8, 2, 1), keys) == 0
    assert visible.sum(1).tolist() == [3, 4, 5, 6]  # positions 2, 3, 4, 5 see 3 … 6 keys


def test_fsdp_over_tp_shards_the_tp_local_weights(quick):
    """FSDP gathers each TP rank's weights (norms whole, the rest split) twice per step."""
    from planner.memory_report import memory_report

    spec = next(s for s in QUICK_LAYOUTS if s.name == "fsdp-tp")
    tp_local = memory_report(spec.job(), spec.planner_layout()).per_stage[0].num_params
    table = rows(quick["fsdp-tp"])
    assert table[("dp", "all_gather")].bytes == 2 * tp_local * F32
    assert table[("dp", "reduce_scatter")].bytes == tp_local * F32


# ----- memory ----------------------------------------------------------------------------


def test_optimizer_states_measured_equal_the_planner_exactly(quick):
    """AdamW's m and v (8 bytes per parameter, sharded under FSDP) plus one FP32 step scalar
    per parameter tensor."""
    report = compare(list(quick.values()))
    for run in report.runs:
        result = quick[run.name]
        peak = max(result.ranks, key=lambda r: r.peak_memory_bytes)
        measured = peak.memory_breakdown_bytes["Optstate"]
        predicted = run.predicted["memory_breakdown_bytes"]["optimizer_states"]
        if result.spec.layout.pp == 1:
            assert 0 <= measured - predicted <= 64 * F32, run.name


@pytest.mark.parametrize("name", ["tp-sp", "pp-1f1b", "cp-allgather", "ep"])
def test_peak_memory_is_within_tolerance_of_the_planner(quick, name):
    """Where the accounting applies (no FSDP: the planner adds a 25 MiB DDP bucket there).

    The planner leaves out the backward pass's transient gradients and torch's per-micro-
    batch pipeline receive buffers, so it predicts low; 20 % bounds what this costs here.
    """
    (run,) = compare([quick[name]]).runs
    assert run.measured["memory_bytes"] > 0
    assert abs(run.error["memory_bytes"]) <= 0.20, run.error


# ----- pipeline order --------------------------------------------------------------------


def test_pipeline_runs_the_planner_action_order(quick):
    for name in ("pp-1f1b", "pp-zbv"):
        for rank in quick[name].ranks:
            assert rank.executed_order == rank.planner_order, (name, rank.rank)


def test_runtime_schedules_run_torch_listed_order(quick):
    """ZB-V runs from its action list; what ran equals it. (1F1B's listed order in torch
    2.13 mislabels the last stage's forwards, so it is not compared.)"""
    for rank in quick["pp-zbv"].ranks:
        assert rank.executed_order == rank.torch_order


def test_pipeline_timestamps_cover_every_action(quick):
    spec = next(s for s in QUICK_LAYOUTS if s.name == "pp-zbv")
    for rank in quick["pp-zbv"].ranks:
        assert len(rank.pipeline_events) == 3 * 2 * spec.num_microbatches  # F, B, W × 2 chunks
        assert all(e.end_s >= e.start_s for e in rank.pipeline_events)


# ----- the report -----------------------------------------------------------------------


def test_report_has_predicted_measured_and_error_per_run(quick):
    data = compare(list(quick.values())).model_dump()
    assert set(data) == {"cluster", "runs", "summary"}
    for run in data["runs"]:
        assert {"tp", "cp", "pp", "dp", "ep", "schedule"} <= set(run["layout"])
        assert run["predicted"]["memory_bytes"] > 0
        assert run["measured"]["memory_bytes"] > 0
        assert run["measured"]["comm_bytes"] > 0
        assert "memory_bytes" in run["error"]
    assert data["summary"]["num_ok"] == len(QUICK_LAYOUTS)


def test_pipeline_runs_carry_measured_and_replayed_timelines(quick):
    """The planner's simulator replays each pipeline run with its measured F/B/W durations."""
    runs = {run.name: run for run in compare(list(quick.values())).runs}
    for name in ("pp-1f1b", "pp-zbv"):
        measured, replayed = (
            runs[name].measured["pipeline"],
            runs[name].predicted["pipeline_replay"],
        )
        assert 0 <= measured["bubble_fraction"] < 1
        assert 0 <= replayed["bubble_fraction"] < 1
        assert len(replayed["timeline"]) == len(measured["timeline"])


# ----- failures --------------------------------------------------------------------------


def _tiny_dp(name: str, **extra) -> RunSpec:
    return RunSpec(
        name=name,
        workload=TINY,
        layout=Layout(dp=2, zero_stage=0),
        warmup_steps=1,
        timed_steps=1,
        check_reference_loss=False,
        **extra,
    )


def test_a_failing_rank_is_reported_and_the_next_layout_still_runs():
    seen = []
    failing = _tiny_dp("raises", inject_failure="raise", failure_rank=1)
    results = run_layouts([failing, _tiny_dp("after")], timeout_s=60, on_result=seen.append)
    assert [r.name for r in seen] == ["raises", "after"]
    failed, after = results
    assert failed.status == "failed"
    rank1 = next(f for f in failed.failures if f.rank == 1)
    assert rank1.kind == "error" and "injected failure on rank 1" in rank1.message
    assert after.status == "ok"


def test_a_hung_rank_is_reported_by_rank_after_the_time_limit():
    result = run_layout(_tiny_dp("hangs", inject_failure="hang", failure_rank=1), timeout_s=10)
    assert result.status == "timeout"
    assert any(f.rank == 1 and f.kind == "hung" for f in result.failures)
    assert result.wall_s < 30


# ----- calibration (pure parts quick, the measurement slow) --------------------------------


def test_alpha_beta_fit_recovers_a_line():
    from validate.calibrate import fit_alpha_beta

    sizes = [2**k for k in range(10, 23, 3)]
    alpha, beta = fit_alpha_beta(sizes, [50e-6 + s / 2e9 for s in sizes])
    assert alpha == pytest.approx(50e-6, rel=1e-6)
    assert beta == pytest.approx(1 / 2e9, rel=1e-6)


@pytest.fixture(scope="module")
def synthetic_calibration(tmp_path_factory):
    """A calibration from made-up measurements, written as the three TOML files."""
    import datetime

    from validate.calibrate import ClusterCalibration, CollectiveFit, GemmPoint
    from validate.local_specs import accelerator_spec, cluster_spec, link_spec, write_specs

    gemms = [
        GemmPoint(what="mm", m=128, k=64, n=192, dtype=d, seconds=1e-4, flops_per_s=r)
        for d, r in (("fp32", 2e10), ("fp32", 3e10), ("bf16", 2e9))
    ]
    sizes = [2**12, 2**16, 2**20]
    fits = [
        CollectiveFit(collective=c, world_size=n, group_size=g, message_bytes=sizes,
                      seconds=[1e-4 * n + s * 1e-9 for s in sizes], alpha_s=1e-4 * n,
                      beta_s_per_byte=1e-9)
        for n, g in ((2, None), (4, None), (4, 2))
        for c in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")
        if c != "p2p" or n == 2
    ]  # fmt: skip
    method = "llmplan calibrate test"
    calibration = ClusterCalibration(
        hostname="test",
        date=datetime.date.today().isoformat(),
        torch_version=torch.__version__,
        ranks=[2, 4],
        gemms=gemms,
        memory_bytes_per_s=5e9,
        collectives=fits,
        accelerator=accelerator_spec(gemms, 5e9, 4, method),
        link=link_spec(fits, 4, method),
        cluster=cluster_spec("x", "y", 4, method),
        accelerators={
            str(n): accelerator_spec(gemms, 5e9, n, method, op_overhead_s=n * 1e-5) for n in (2, 4)
        },
        links={str(n): link_spec(fits, n, method) for n in (2, 4)},
    )
    return write_specs(calibration, tmp_path_factory.mktemp("cluster") / "local.toml")


def test_written_specs_load_through_the_catalog(synthetic_calibration):
    from hwspecs.catalog import load_accelerator, load_cluster, load_link

    cluster = load_cluster(synthetic_calibration.paths["cluster"])
    assert load_accelerator(cluster.accelerator).fp32_tflops == pytest.approx(0.03)
    link = load_link(cluster.tiers[0].link)
    assert link.bytes_per_s_per_direction == pytest.approx(1e9)
    # ring all-reduce on 4: factor 1.5 / (rate 1e9 × beta 1e-9)
    assert link.busbw_efficiency["ring"] == pytest.approx(1.5)


def test_each_world_size_is_predicted_on_the_cluster_calibrated_under_it(synthetic_calibration):
    from hwspecs.catalog import load_accelerator, load_cluster
    from validate.compare import cluster_for_world_size

    path = synthetic_calibration.paths["cluster"]
    for n in (2, 4):
        sized = cluster_for_world_size(path, n)
        assert sized == synthetic_calibration.paths[f"cluster_n{n}"] != path
        accelerator = load_accelerator(load_cluster(sized).accelerator)
        assert accelerator.op_overhead_s == pytest.approx(n * 1e-5)
        assert "op_overhead_s" in accelerator.sources
        assert cluster_for_world_size(synthetic_calibration, n) == sized
    assert cluster_for_world_size(path, 8) == path  # not calibrated: the main file


def test_each_world_size_links_the_collective_fits_measured_under_it(synthetic_calibration):
    from hwspecs.catalog import load_cluster, load_link
    from planner.comm.collectives import collective_time

    for n in (2, 4):
        cluster = load_cluster(synthetic_calibration.paths[f"cluster_n{n}"])
        link = load_link(cluster.tiers[0].link)
        measured = {(f.op, f.group_size): f.alpha_s for f in link.collective_fits}
        # Whole-world fits, and on 4 ranks also the groups of 2 (a 2-D layout's TP or FSDP).
        expected = {(op, n): 1e-4 * n for op in ("all-reduce", "all-gather", "reduce-scatter",
                                                  "all-to-all")}  # fmt: skip
        if n == 2:
            expected[("p2p", 2)] = 2e-4
        else:
            expected.update({(op, 2): 4e-4 for op, _ in list(expected)})
        assert measured == pytest.approx(expected)
        one = collective_time("all-reduce", 2**20, 2, cluster)
        assert one.algorithm == "measured"
        assert one.time_s == pytest.approx(2e-4 * (n // 2) + 2**20 * 1e-9)


def test_compute_figures_are_measured_by_all_ranks_at_once():
    from validate.calibrate import measure_compute, workload_gemm_shapes
    from validate.run import TINY

    syncs = []
    figures = measure_compute((TINY,), sync=lambda: syncs.append(1))
    # A barrier before every GEMM shape and dtype, attention's forward and backward, the
    # bandwidth and the op-mix overhead.
    assert len(syncs) == 2 * len(workload_gemm_shapes(TINY)) + 2 + 2
    (attention,) = figures["attention"]
    assert attention["forward_s"] > 0 and attention["backward_s"] > 0
    assert len(figures["gemms"]) == 2 * len(workload_gemm_shapes(TINY))


def test_measured_attention_becomes_the_accelerators_attention_efficiencies():
    from planner.cost.compute import GpuRates
    from validate.calibrate import GemmPoint, measure_attention
    from validate.local_specs import accelerator_spec
    from validate.run import TINY

    point = measure_attention(TINY)
    assert point.forward_flops == 2 * 128 * 128 * 0.5 * 4 * 16 * 2  # causal scores + context
    gemms = [
        GemmPoint(what="mm", m=1, k=1, n=1, dtype=d, seconds=1.0, flops_per_s=r)
        for d, r in (("fp32", 1e12), ("bf16", 1e11))
    ]  # a peak above any attention rate, so the efficiency is the rate over it
    accelerator = accelerator_spec(gemms, 5e9, 2, "test", 1e-5, [point])
    rates = GpuRates.of(accelerator, "tf32")
    assert rates.attention_forward_flops_per_s == pytest.approx(point.forward_flops_per_s)
    assert rates.attention_backward_flops_per_s == pytest.approx(point.backward_flops_per_s)
    assert not accelerator.overlaps_communication


def test_op_mix_overhead_is_a_positive_time_per_counted_operation():
    from validate.host_costs import count_dispatched_ops, measure_op_overhead, op_mix

    step, _ = op_mix()
    assert count_dispatched_ops(step) > 100  # forward, backward and AdamW of 5 tensors
    assert 0 < measure_op_overhead() < 1e-2


def test_report_on_a_cluster_predicts_comm_bytes_per_axis(quick, synthetic_calibration):
    report = compare(list(quick.values()), synthetic_calibration)
    assert report.cluster == synthetic_calibration.paths["cluster"]
    by_name = {run.name: run for run in report.runs}
    # DP gradient and PP activation traffic: the planner's terms equal what ran.
    assert by_name["dp-fsdp2"].error["comm_bytes_per_axis"]["dp"] == pytest.approx(0, abs=1e-12)
    assert by_name["pp-1f1b"].error["comm_bytes_per_axis"]["pp"] == pytest.approx(0, abs=1e-12)
    assert by_name["ep"].error["comm_bytes_per_axis"]["dp"] == pytest.approx(0, abs=1e-12)


@pytest.mark.slow
def test_calibrate_writes_a_cluster_every_command_can_load(tmp_path):
    from hwspecs.catalog import load_cluster
    from validate.calibrate import calibrate

    calibration = calibrate(ranks=(2, 4), out_path=tmp_path / "local.toml")
    cluster = load_cluster(calibration.paths["cluster"])
    assert cluster.num_gpus == 4
    assert calibration.link.bytes_per_s_per_direction > 0


@pytest.mark.slow
def test_full_layouts_run():
    from validate.run import FULL_LAYOUTS

    results = run_layouts(FULL_LAYOUTS, quick=False, timeout_s=300)
    assert [r.status for r in results] == ["ok"] * len(FULL_LAYOUTS)


def test_cli_validate_prints_predicted_vs_measured_and_writes_html(
    capsys, tmp_path, synthetic_calibration
):
    """`llmplan validate` end to end on one pipeline layout (cluster given: no calibration)."""
    import cli

    html = tmp_path / "report.html"
    cluster = synthetic_calibration.paths["cluster"]
    runs = tmp_path / "runs.json"
    argv = ["validate", "--layouts", "pp-1f1b", "--cluster", cluster, "--html", str(html),
            "--out", str(runs), "--json"]  # fmt: skip
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    (row,) = json.loads(runs.read_text())
    assert row["hardware"]["cluster"] == cluster and row["training"]["pp"] == 2
    run = report["runs"][0]
    assert run["status"] == "ok"
    assert {"step_time_s", "memory_bytes", "comm_bytes"} <= set(run["predicted"]) & set(
        run["measured"]
    )
    assert run["measured"]["order_matches_planner"] is True
    assert "measured" in html.read_text()


def test_measured_runs_are_rows_runs_check_predicts_on_the_calibrated_cluster(
    quick, synthetic_calibration, tmp_path
):
    """`validate --out` rows: the runs schema, on the calibrated cluster, covered by runs check."""
    from planner import api
    from validate.runs_out import measured_runs

    cluster = synthetic_calibration.paths["cluster"]
    rows = measured_runs(list(quick.values()), cluster)
    assert len(rows) == sum(result.ok for result in quick.values())
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([row.model_dump(mode="json") for row in rows]))
    check = api.runs_check([str(path)], profile="none")
    assert check.num_covered == len(rows), check.uncovered
    by_id = {row.id: row for row in check.rows}
    for row in rows:
        predicted = by_id[row.id]
        spec = quick[row.source_ref.config].spec
        assert predicted.layout["tp"] == spec.layout.tp and predicted.layout["pp"] == spec.layout.pp
        assert predicted.layout["schedule"] == spec.planner_layout().schedule or spec.layout.pp == 1
        measured = (
            spec.global_batch_size
            * spec.workload.seq_len
            / quick[row.source_ref.config].step_time_s()
        )
        assert predicted.measured_tokens_per_s_per_gpu == pytest.approx(measured / spec.world_size)


# ----- the parallel forms' own operations (planner.structure.op_counts), counted again ---------------


def _per_layer(spec, layers: tuple[int, int]) -> dict:
    """One layer's {phase: {kind: operations}}: the census at two layer counts, differenced."""
    from validate.op_census import census

    low, high = (
        census(spec.model_copy(update={"workload": spec.workload.model_copy(
            update={"num_layers": n})}))
        for n in layers
    )  # fmt: skip
    span = layers[1] - layers[0]
    return {
        phase: {kind: (high[phase][kind] - low[phase][kind]) / span for kind in high[phase]}
        for phase in high
    }


def _census_cases():
    from planner.structure import op_counts as oc

    dense, moe = oc.DENSE_LAYER_OPS, oc.MOE_LAYER_OPS
    backward = dense.input_grad + dense.weight_grad
    tp_sp, tp = oc.tensor_parallel_ops(True), oc.tensor_parallel_ops(False)
    ddp = oc.DDP_BACKWARD_OPS_PER_TENSOR * 9  # the reference layer's 9 parameter tensors
    # AdamW and zero_grad on the layer's 9 tensors, all but the step counter's on DTensors
    sharded_step = (9 * oc.optimizer_ops_per_tensor("adamw"),
                    9 * oc.optimizer_sharded_ops_per_tensor("adamw"), 0)  # fmt: skip

    def tensor_parallel_phases(ops) -> dict:
        """Per layer, each pass's (operations, on DTensors, collectives) under DTensor TP."""
        return {
            "forward": (dense.forward + ops.added.forward, ops.on_dtensors.forward,
                        ops.collectives.forward),
            "backward": (backward + ops.added.input_grad, sum(ops.on_dtensors[1:]),
                         ops.collectives.input_grad),
        }  # fmt: skip

    # (spec, layer counts, {phase: {kind: per layer}}) — totals are plain + DTensor.
    return {
        "tp-sp": (
            RunSpec(name="tp-sp", layout=Layout(tp=2, sequence_parallel=True, zero_stage=0)),
            (1, 3),
            {**tensor_parallel_phases(tp_sp), "optimizer": sharded_step},
        ),
        "tp": (
            RunSpec(name="tp", layout=Layout(tp=2, sequence_parallel=False, zero_stage=0)),
            (1, 3),
            tensor_parallel_phases(tp),
        ),
        "fsdp2": (
            RunSpec(name="fsdp2", layout=Layout(dp=2, zero_stage=3)),
            (1, 3),
            {"forward": (dense.forward + oc.FSDP_UNIT_OPS.forward, 0, 1),
             "backward": (backward + oc.FSDP_UNIT_OPS.input_grad, 0, 2),
             "optimizer": sharded_step},
        ),
        "ddp": (
            RunSpec(name="ddp", layout=Layout(dp=2, zero_stage=0)),
            (1, 3),
            {"forward": (dense.forward, 0, 0), "backward": (backward + ddp, 0, 0)},
        ),
        "cp": (
            RunSpec(name="cp", layout=Layout(cp=2, zero_stage=0)),
            (1, 3),
            {"forward": (dense.forward + oc.CP_LAYER_OPS.forward, 0, 1),
             "backward": (backward + ddp + oc.CP_LAYER_OPS.input_grad, 0, 2)},
        ),
        "ep": (  # MoE layers after the one dense layer; DDP on the 7 non-expert tensors
            RunSpec(name="ep", workload=TINY_MOE, layout=Layout(dp=2, ep=2, zero_stage=0)),
            (2, 4),
            {"forward": (moe.forward + oc.EP_LAYER_OPS.forward, 0, 2),
             "backward": (moe.input_grad + moe.weight_grad + 14 + oc.EP_LAYER_OPS.input_grad,
                          0, 2)},
        ),
    }  # fmt: skip


@pytest.mark.parametrize("form", ["tp-sp", "tp", "fsdp2", "ddp", "cp", "ep"])
def test_parallel_forms_dispatch_the_operations_the_planner_counts(form):
    """planner.structure.op_counts' per-layer figures for each parallel form, against torch 2.13's
    implementation counted again by layer-count difference (validate.op_census)."""
    spec, layers, expected = _census_cases()[form]
    measured = _per_layer(spec, layers)
    for phase, (total, on_dtensors, collectives) in expected.items():
        counts = measured[phase]
        assert counts["plain"] + counts["dtensor"] == total, (phase, counts)
        assert counts["dtensor"] == on_dtensors, (phase, counts)
        assert counts["collective"] == collectives, (phase, counts)
