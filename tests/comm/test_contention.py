"""Links shared by parallel axes (planner.comm.contention): the closed forms, the per-link busy
times the collectives report, and the term in the step time (search row == estimate)."""

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwspecs.catalog import load_accelerator, load_cluster
from planner.comm.collectives import algorithm_costs, volume_factor
from planner.comm.contention import occupancy_excess, sharing_delay
from planner.comm.levels import cluster_view, link_key
from planner.comm.network import group_levels
from planner.comm.report import ComputeTimes, axis_traffic
from planner.comm.topology import place_groups
from planner.comm.traffic import axis_times_vectorized
from planner.estimate import estimate, layout_columns
from planner.evaluate import evaluate_columns
from planner.search import search
from planner.spec.job import Job
from planner.spec.layout import Layout
from planner.spec.model import load_model

DGX = load_cluster("dgx-h100")
H100 = load_accelerator("h100-sxm")
JOB = Job(model=load_model("llama3-8b"), seq_len=8192, global_batch_tokens=8192 * 64)
MOE_JOB = Job(model=load_model("mixtral-8x7b"), seq_len=4096, global_batch_tokens=4096 * 256)

# ----- the closed forms ------------------------------------------------------------------


def test_exposed_transfer_waits_for_the_other_axis_hidden_share_of_the_link():
    # CP exposed 1 s on a NIC that PP keeps busy 2 s of a 10 s compute window: 1 · 2/10.
    delay = sharing_delay({"cp": np.array([1.0])}, {"pp": np.array([2.0])}, np.array([10.0]))
    assert delay == pytest.approx([0.2])


def test_both_directions_count_and_the_share_is_capped_at_the_whole_link():
    exposed = {"cp": np.array([1.0]), "pp": np.array([0.5])}
    hidden = {"cp": np.array([0.0]), "pp": np.array([3.0]), "dp": np.array([4.0])}
    # cp waits for pp + dp (7 of 10 s); pp waits for dp only (4 of 10 s).
    assert sharing_delay(exposed, hidden, np.array([10.0])) == pytest.approx([0.7 + 0.2])
    # A link already full of other traffic at most doubles an exposed transfer.
    assert sharing_delay(exposed, hidden, np.array([1.0])) == pytest.approx([1.0 + 0.5])


def test_one_axis_alone_on_a_link_never_waits_for_itself():
    delay = sharing_delay({"pp": np.array([0.3])}, {"pp": np.array([5.0])}, np.array([1.0]))
    assert delay == pytest.approx([0.0])


def test_occupancy_counts_only_what_the_axes_together_add_above_the_step():
    busy = np.array([[12.0, 3.0], [8.0, 1.0], [12.0, 1.0]])
    busiest_axis = np.array([[7.0, 3.0], [7.0, 1.0], [11.0, 1.0]])
    step = np.array([10.0, 10.0, 10.0])
    # row 0: 12 − 10 on the first link; row 1: fits; row 2: 12 − 11 (one axis alone takes 11).
    assert occupancy_excess(busy, busiest_axis, step) == pytest.approx([2.0, 0.0, 1.0])


# ----- per-link busy time of one collective ---------------------------------------------


def _levels(ranks: int):
    return group_levels(cluster_view(DGX, 64), np.arange(ranks)[None, :])


def test_ring_over_two_nodes_keeps_each_nic_busy_for_its_share_of_the_bytes():
    levels = _levels(16)  # NVLink inside each node, the NIC between the two
    ring = algorithm_costs("all-gather", levels, 16)["ring"]
    busy = dict(ring.link_busy_s_per_byte)
    assert set(busy) == {"nvlink4", "ib-ndr"}
    nic = next(level for level in levels if link_key(level) == "ib-ndr")
    rate = nic.bytes_per_s_per_rank * nic.busbw_efficiency["ring"]
    # 8 channels, one per GPU of the node: each NIC carries (n−1)/n · S / 8.
    assert busy["ib-ndr"] == pytest.approx(volume_factor("all-gather", 16) / (8 * rate))
    assert ring.beta_s_per_byte == pytest.approx(max(busy.values()))  # levels run at once


def test_hierarchical_phases_add_on_each_link():
    costs = algorithm_costs("all-reduce", _levels(32), 32)
    hierarchical = costs["hierarchical"]
    assert hierarchical.beta_s_per_byte == pytest.approx(
        sum(seconds for _, seconds in hierarchical.link_busy_s_per_byte)
    )


def test_point_to_point_busies_only_the_link_it_crosses():
    placement = place_groups(DGX, {"tp": 8, "pp": 2}, gpus=16)
    neighbour = placement.groups["pp"].neighbour_level
    (direct,) = algorithm_costs("p2p", (neighbour,), 2).values()
    assert direct.link_busy_s_per_byte == (("ib-ndr", direct.beta_s_per_byte),)


# ----- the term in the step ----------------------------------------------------------------


def _traffic(layout: dict, compute=(0.05, 0.1)):
    return axis_times_vectorized(JOB, DGX, **layout, forward_s=compute[0], backward_s=compute[1])


def test_axes_on_different_links_do_not_contend():
    # TP 8 on NVLink (exposed), DP 2 over the NIC (hidden): each link carries one axis.
    out = _traffic({"tp": 8, "dp": 2})
    assert set(out["link_busy_s"]) == {"nvlink4", "ib-ndr"}
    assert out["tp_exposed_time_s"] > 0 and out["dp_time_s"] > out["dp_exposed_time_s"]
    assert out["link_contention_s"] == 0.0


def _busy_from_report(layout: Layout, forward: float, backward: float):
    """{link: {axis: (exposed, hidden) seconds}} from the explained single-layout report and
    each collective's per-link busy time per byte (the path :mod:`planner.comm.report` takes)."""
    report = axis_traffic(JOB, layout, DGX, compute=ComputeTimes(forward_s=forward,
                                                                 backward_s=backward))  # fmt: skip
    placement = place_groups(DGX, layout)
    groups = {"tp": "tp", "cp": "cp", "pp": "pp", "dp": "dp_cp"}
    links: dict[str, dict[str, list[float]]] = {}
    for axis in report.axes:
        group = placement.groups[groups[axis.axis]]
        for term in axis.terms:
            levels = (group.neighbour_level,) if term.collective == "p2p" else group.levels
            cost = algorithm_costs(term.collective, levels, group.group_size)[term.algorithm]
            share = term.exposed_time_s / term.time_s
            for link, per_byte in cost.link_busy_s_per_byte:
                seconds = term.count_per_step * term.message_bytes * per_byte
                pair = links.setdefault(link, {}).setdefault(axis.axis, [0.0, 0.0])
                pair[0] += seconds * share
                pair[1] += seconds * (1 - share)
    return links, report.num_microbatches * (forward + backward)


def test_two_axes_on_one_nic_closed_form():
    """TP 8 alone on NVLink; PP 2 and DP 2 share each GPU's NIC. The exposed part of each
    (PP's fill and drain, DP's last bucket) waits for the other's hidden traffic:
    ``e_pp · h_dp / C + e_dp · h_pp / C`` with C = m·(F + B)."""
    fields = {"tp": 8, "pp": 2, "dp": 2, "schedule": "1f1b"}
    forward, backward = 0.05, 0.1
    out = _traffic(fields, (forward, backward))
    links, window = _busy_from_report(Layout(**fields), forward, backward)
    assert set(links["nvlink4"]) == {"tp"} and set(links["ib-ndr"]) == {"pp", "dp"}
    (e_pp, h_pp), (e_dp, h_dp) = links["ib-ndr"]["pp"], links["ib-ndr"]["dp"]
    assert min(e_pp, h_pp, e_dp, h_dp) > 0
    expected = e_pp * min(1.0, h_dp / window) + e_dp * min(1.0, h_pp / window)
    assert out["link_contention_s"] == pytest.approx(expected, rel=1e-9)
    assert out["link_busy_s"]["ib-ndr"] == pytest.approx(e_pp + h_pp + e_dp + h_dp, rel=1e-9)
    assert out["link_busiest_axis_s"]["ib-ndr"] == pytest.approx(max(e_pp + h_pp, e_dp + h_dp))


def test_context_parallel_across_nodes_matches_the_report_on_every_link():
    """CP 16 over two nodes (exposed) meets DP's gradients over dp·cp and PP's sends on the
    NIC, and DP's ring on NVLink: the sum over links and axes of the closed form."""
    fields = {"tp": 1, "cp": 16, "pp": 2, "dp": 1, "schedule": "1f1b"}
    forward, backward = 0.05, 0.1
    out = _traffic(fields, (forward, backward))
    links, window = _busy_from_report(Layout(**fields), forward, backward)
    assert {"cp", "pp", "dp"} <= set(links["ib-ndr"])
    expected = 0.0
    for axes in links.values():
        hidden = sum(h for _, h in axes.values())
        expected += sum(e * min(1.0, (hidden - h) / window) for e, h in axes.values())
    assert expected > 0
    assert out["link_contention_s"] == pytest.approx(expected, rel=1e-9)


def test_without_compute_times_nothing_is_hidden_and_nothing_contends():
    out = axis_times_vectorized(JOB, DGX, tp=1, cp=16, pp=2, dp=1)
    assert out["link_contention_s"] == 0.0


def _layout_of(row) -> Layout:
    fields = ("tp", "cp", "pp", "dp", "ep", "etp", "vpp", "micro_batch_size", "schedule",
              "zero_stage", "recompute", "sequence_parallel", "cp_algorithm")  # fmt: skip
    values = {k: (row[k].item() if hasattr(row[k], "item") else row[k]) for k in fields}
    return Layout(**values, num_microbatches=int(row["num_microbatches"]))


@pytest.fixture(scope="module")
def moe_table():
    return search(MOE_JOB, DGX, H100, 64).table


def test_search_row_equals_the_estimate_with_contention(moe_table):
    contended = moe_table[moe_table["link_contention_s"] > 0]
    assert len(contended) > 0
    assert moe_table["link_contention_s"].dtype == np.float32
    for _, row in [*contended.head(3).iterrows(), next(moe_table.iterrows())]:
        result = estimate(MOE_JOB, _layout_of(row), DGX)
        # The search table keeps the breakdown as float32 (planner.evaluate's compact
        # screen): equal to its resolution; the step time it ranks by, to float64's.
        assert result.time_breakdown_s["link_contention"] == pytest.approx(
            row["link_contention_s"], rel=2**-23, abs=0.0
        )
        assert result.step_time_s == pytest.approx(row["step_time_s"], rel=1e-12, abs=0.0)
        assert result.step_time_s == pytest.approx(row["step_time_s"], rel=1e-12)
        assert result.step_time_s == pytest.approx(sum(result.time_breakdown_s.values()))


#: Outputs the term may not touch: memory, compute, FLOPs per token, each axis's own times.
UNCHANGED = ("memory_per_gpu_bytes", "compute_s", "recompute_s", "pipeline_bubble_s",
             "pipeline_time_s", "forward_s", "input_grad_s", "weight_grad_s", "exposed_comm_s",
             "optimizer_s", "dp_time_s", "cp_time_s", "pp_time_s", "ep_time_s")  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(index=st.integers(min_value=0, max_value=10**9))
def test_contention_is_nonnegative_and_changes_only_the_step(moe_table, index):
    row = moe_table.iloc[index % len(moe_table)]
    layout = _layout_of(row)
    columns = layout_columns(layout, layout.num_microbatches)
    with_term = evaluate_columns(MOE_JOB, DGX, H100, columns)
    with mock.patch(
        "planner.evaluate.time._link_contention", lambda comm, step: np.zeros(len(step))
    ):
        without = evaluate_columns(MOE_JOB, DGX, H100, columns)
    contention = with_term["link_contention_s"]
    assert np.all(contention >= 0)
    assert with_term["step_time_s"] == pytest.approx(without["step_time_s"] + contention)
    for key in UNCHANGED + tuple(k for k in with_term if k.startswith("memory_")):
        np.testing.assert_array_equal(with_term[key], without[key], err_msg=key)
    flops_per_token = with_term["hardware_tflops_per_gpu"] / with_term["tokens_per_s_per_gpu"]
    assert flops_per_token == pytest.approx(
        without["hardware_tflops_per_gpu"] / without["tokens_per_s_per_gpu"]
    )
