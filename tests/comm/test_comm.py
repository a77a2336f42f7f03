"""Collective alpha-beta models (planner.comm.collectives) against outside figures and formulas."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwspecs.catalog import catalog_names, load_link
from hwspecs.errors import PlanError
from planner.comm.collectives import (
    OPS,
    algorithm_costs,
    collective_time,
    nodes_reached,
    parse_num_bytes,
    volume_factor,
)
from planner.comm.topology import place_groups
from planner.spec.layout import Layout

GIB = 2**30


@pytest.mark.parametrize("n", [2, 3, 8, 64, 1000])
def test_per_rank_volumes_are_the_textbook_factors(n):
    # Thakur et al. 2005; NVIDIA nccl-tests PERFORMANCE.md (busbw factors).
    assert volume_factor("all-reduce", n) == pytest.approx(2 * (n - 1) / n)
    for op in ("all-gather", "reduce-scatter", "all-to-all"):
        assert volume_factor(op, n) == pytest.approx((n - 1) / n)
    assert volume_factor("p2p", n) == 1.0


@settings(max_examples=30, deadline=None)
@given(
    op=st.sampled_from(OPS),
    ranks=st.integers(2, 1024),
    num_bytes=st.floats(1, 1e11),
)
def test_bytes_per_rank_and_busbw_follow_the_factor(op, ranks, num_bytes):
    result = collective_time(op, num_bytes, ranks, "dgx-h100")
    factor = volume_factor(op, ranks)
    assert result.bytes_per_rank == pytest.approx(factor * num_bytes)
    assert result.busbw_bytes_per_s == pytest.approx(result.algbw_bytes_per_s * factor)
    assert result.time_s == pytest.approx(min(result.alternatives.values()))


@settings(max_examples=30, deadline=None)
@given(op=st.sampled_from(OPS), ranks=st.integers(2, 1024), small=st.floats(0, 1e9))
def test_time_grows_with_bytes(op, ranks, small):
    slow = collective_time(op, small * 2 + 1, ranks, "llama3-h100-24k").time_s
    assert collective_time(op, small, ranks, "llama3-h100-24k").time_s <= slow


def test_ring_all_reduce_is_a_reduce_scatter_then_an_all_gather():
    for ranks in (8, 16, 512):
        (levels) = place_groups("dgx-h100", {"dp": ranks}).groups["dp"].levels
        ring_ar = algorithm_costs("all-reduce", levels, ranks)["ring"]
        ring_rs = algorithm_costs("reduce-scatter", levels, ranks)["ring"]
        assert ring_ar.alpha_s == pytest.approx(2 * ring_rs.alpha_s)
        assert ring_ar.beta_s_per_byte == pytest.approx(2 * ring_rs.beta_s_per_byte)


def test_ring_on_one_nvlink_domain_is_the_alpha_beta_formula():
    nvlink = load_link("nvlink4")
    size, n = 1e9, 8
    expected = 2 * (n - 1) * nvlink.latency_s + 2 * (n - 1) / n * size / (
        nvlink.bytes_per_s_per_direction * nvlink.busbw_efficiency["ring"]
    )
    result = collective_time("all-reduce", size, n, "dgx-h100", algorithm="ring")
    assert result.time_s == pytest.approx(expected)


def test_nccl_tests_nvlink_figures_come_back_from_the_efficiencies():
    # nccl-tests on 8x H100/H200, 16 GiB: ring ≈ 367 GB/s busbw, NVLS ≈ 476-480 GB/s.
    ring = collective_time("all-reduce", 16 * GIB, 8, "dgx-h100", algorithm="ring")
    assert ring.busbw_bytes_per_s / 1e9 == pytest.approx(367, rel=0.01)
    nvls = collective_time("all-reduce", 16 * GIB, 8, "dgx-h100")
    assert nvls.algorithm == "nvls"  # the cheapest, as NCCL's tuner picks
    assert nvls.busbw_bytes_per_s / 1e9 == pytest.approx(478, rel=0.01)
    gather = collective_time("all-gather", 16 * GIB, 8, "dgx-h200")
    assert gather.busbw_bytes_per_s / 1e9 == pytest.approx(361.4, rel=0.02)


def test_nvl72_ring_and_sharp_figures_of_nvidia_gtc25():
    # NVIDIA GTC25 S72583 (via ml-engineering): NVL72 ring 680, SHARP 850 GB/s busbw.
    ring = collective_time("all-reduce", 16 * GIB, 72, "gb200-nvl72", algorithm="ring")
    assert ring.busbw_bytes_per_s / 1e9 == pytest.approx(680, rel=0.01)
    sharp = collective_time("all-reduce", 16 * GIB, 72, "gb200-nvl72", algorithm="nvls")
    assert sharp.busbw_bytes_per_s / 1e9 == pytest.approx(850, rel=0.03)


def test_ndr_nic_gives_about_47_gb_per_s():
    # nccl-tests #290 (NVIDIA): "For NDR @ 400Gbps you should see 46-48GB/s per NIC".
    send = collective_time("p2p", 16 * GIB, 16, "dgx-h100")
    assert send.tiers == ["scalable-unit"]
    assert 46 <= send.busbw_bytes_per_s / 1e9 <= 48
    levels = place_groups("dgx-h100", {"tp": 8, "dp": 2}).groups["dp"].levels
    ring = algorithm_costs("all-reduce", levels, 2)["ring"]
    assert 46 <= volume_factor("all-reduce", 2) / ring.beta_s_per_byte / 1e9 <= 48


def test_small_messages_are_latency_bound():
    result = collective_time("all-reduce", 1024, 8, "dgx-h100", algorithm="ring")
    assert result.latency_s / result.time_s > 0.99
    assert result.busbw_bytes_per_s < 1e9


def test_hierarchical_is_reduce_scatter_in_node_all_reduce_across_all_gather_in_node():
    nvlink, ndr = load_link("nvlink4"), load_link("ib-ndr")
    size = 8e9
    in_node = 2 * (7 / 8) * size / (450e9 * nvlink.busbw_efficiency["ring"])
    across = 2 * (1 / 2) * (size / 8) / (50e9 * ndr.busbw_efficiency["ring"])
    latency = 2 * 7 * nvlink.latency_s + 2 * 1 * ndr.latency_s
    result = collective_time("all-reduce", size, 16, "dgx-h100", algorithm="hierarchical")
    assert result.time_s == pytest.approx(in_node + across + latency)


def test_all_to_all_is_bound_by_the_busier_of_nvlink_and_the_nic():
    nvlink, ndr = load_link("nvlink4"), load_link("ib-ndr")
    size = 1e9
    inside = 7 / 16 * size / (450e9 * nvlink.busbw_efficiency["ring"])
    leaving = 8 / 16 * size / (50e9 * ndr.busbw_efficiency["ring"])
    result = collective_time("all-to-all", size, 16, "dgx-h100")
    assert result.time_s == pytest.approx(max(inside, leaving) + nvlink.latency_s + ndr.latency_s)


def _ep64_levels():
    """The levels of DeepSeek-V3's EP 64 group: 8 nodes of 8 H800s (dgx-h800)."""
    from planner.spec.layout import Layout

    placement = place_groups("dgx-h800", Layout(pp=16, dp=128, ep=64), gpus=2048)
    return placement.groups["ep"].levels


def test_node_limited_all_to_all_crosses_ib_once_per_destination_node():
    """DeepSeek-V3 §3.2.2: top-8 over at most 4 of 8 nodes; NVLink forwards to the experts."""
    nvlink, ndr = load_link("nvlink4-h800"), load_link("ib-ndr")
    size = 1e9  # a rank's send buffer: its tokens × 8 copies × h
    leaving = 4 / 8 * (56 / 64) * size / (50e9 * ndr.busbw_efficiency["ring"])
    forwarded = 7 / 8 * size / (200e9 * nvlink.busbw_efficiency["ring"])
    levels = _ep64_levels()
    cost = algorithm_costs("all-to-all", levels, 64, routing=(8, 4))["node-limited"]
    assert cost.time_s(size) == pytest.approx(max(leaving, forwarded) + cost.alpha_s)
    pairwise = algorithm_costs("all-to-all", levels, 64)["pairwise"]
    assert cost.time_s(size) < pairwise.time_s(size)


@settings(max_examples=20, deadline=None)
@given(top_k=st.integers(1, 16), max_nodes=st.integers(1, 16))
def test_node_limit_beyond_top_k_or_the_node_count_changes_nothing(top_k, max_nodes):
    levels = _ep64_levels()
    limited = algorithm_costs("all-to-all", levels, 64, routing=(top_k, max_nodes))
    capped = algorithm_costs("all-to-all", levels, 64, routing=(top_k, min(top_k, max_nodes, 8)))
    assert limited["node-limited"] == capped["node-limited"]


def test_group_limited_routing_reaches_more_nodes_once_a_group_spans_several():
    """DeepSeek-V3's router keeps 4 of 8 expert groups (HF n_group 8, topk_group 4). Over
    EP 64 on 8 nodes a group is a node: 4 nodes per token, the report's M. Over EP 256 on
    32 nodes each group spans 4 nodes, so a token's 8 experts can lie on 8 nodes; over
    EP 32 on 4 nodes a node holds two groups and a token reaches at most all 4."""
    assert nodes_reached(8, 4, 8, 8) == 4
    assert nodes_reached(8, 4, 8, 32) == 8
    assert nodes_reached(8, 4, 8, 16) == 8
    assert nodes_reached(8, 4, 8, 4) == 4
    assert nodes_reached(8, 4, None, 32) == 4  # a limit stated per node holds at any span
    placement = place_groups("dgx-h800", Layout(pp=2, dp=1024, ep=256), gpus=2048)
    levels, size = placement.groups["ep"].levels, 1e9
    grouped = algorithm_costs("all-to-all", levels, 256, routing=(8, 4, 8))["node-limited"]
    per_node = algorithm_costs("all-to-all", levels, 256, routing=(8, 4, None))["node-limited"]
    ndr = load_link("ib-ndr")
    leaving = 8 / 8 * (248 / 256) * size / (50e9 * ndr.busbw_efficiency["ring"])
    assert grouped.time_s(size) == pytest.approx(leaving + grouped.alpha_s)
    assert grouped.time_s(size) == pytest.approx(2 * per_node.time_s(size) - per_node.alpha_s)


def test_tpu_v5p_one_torus_axis_is_a_bidirectional_ring():
    # scaling-book: an all-reduce over a wrapped axis runs two rings, 2x the one-way link rate.
    ici = load_link("tpu-ici-v5p")
    size, n = 4 * GIB, 16
    rate = ici.bytes_per_s_per_direction_per_link * ici.busbw_efficiency["ring"]
    expected = 2 * (n - 1) / n * size / (2 * rate) + 2 * (n - 1) * ici.latency_s
    result = collective_time("all-reduce", size, n, "tpu-v5p")
    assert result.algorithm == "torus" and result.tiers == ["ici-x"]
    assert result.time_s == pytest.approx(expected)
    half_axis = collective_time("all-reduce", size, 8, "tpu-v5p")  # no wraparound
    assert half_axis.time_s == pytest.approx(2 * 7 / 8 * size / rate + 2 * 7 * ici.latency_s)


def test_mi300x_pair_all_reduce_uses_one_xgmi_link():
    pair = collective_time("all-reduce", 4 * GIB, 2, "mi300x")
    full = collective_time("all-reduce", 4 * GIB, 8, "mi300x")
    assert full.busbw_bytes_per_s / pair.busbw_bytes_per_s == pytest.approx(7, rel=0.01)


@pytest.mark.parametrize("name", catalog_names("cluster"))
@pytest.mark.parametrize("op", OPS)
def test_every_op_runs_on_every_catalog_cluster(name, op):
    result = collective_time(op, GIB, 16, name)
    assert result.time_s > 0 and result.tiers
    assert set(result.model_dump()) >= {
        "time_s", "algbw_bytes_per_s", "busbw_bytes_per_s", "algorithm", "tiers"
    }  # fmt: skip


def test_a_single_rank_moves_nothing():
    result = collective_time("all-reduce", GIB, 1, "dgx-h100")
    assert result.time_s == 0 and result.algorithm == "none"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("all-reduce", GIB, 8, "dgx-h100", "foo"), "unknown algorithm 'foo'"),
        (("all-reduce", GIB, 8, "dgx-a100", "nvls"), "not available"),
        (("all-reduce", GIB, 8, "dgx-h100", "tree"), "not available"),
        (("all-gather", GIB, 8, "dgx-h100", "nvls"), "not available"),
        (("all-reduce", GIB, 16, "dgx-h100", "torus"), "not available"),
        (("all-reduce", GIB, 2048, "dgx-h100"), "exceed"),
        (("broadcast", GIB, 8, "dgx-h100"), "unknown op"),
    ],
)
def test_bad_collectives_are_one_line_errors(args, words):
    with pytest.raises(PlanError, match=words) as error:
        collective_time(*args)
    assert "\n" not in str(error.value)


def test_gpus_limits_the_cluster():
    assert collective_time("all-reduce", GIB, 16, "dgx-h100", gpus=16).ranks == 16
    with pytest.raises(PlanError, match="exceed the 8 GPUs"):
        collective_time("all-reduce", GIB, 16, "dgx-h100", gpus=8)
    with pytest.raises(PlanError, match="not available on cluster"):
        collective_time("all-reduce", GIB, 16, "dgx-h100", gpus=4096)


def test_sizes_parse_like_the_cli_takes_them():
    assert parse_num_bytes("1GiB") == 2**30
    assert parse_num_bytes("512MB") == 512e6
    assert parse_num_bytes("1e9") == 1e9
    assert parse_num_bytes("4096") == 4096
    with pytest.raises(PlanError, match="takes a size in bytes"):
        parse_num_bytes("lots")


# ----- measured per-(op, group size) fits (LinkTier.collective_fits) ------------------------


@pytest.fixture(scope="module")
def fitted_cluster(tmp_path_factory):
    """dgx-h100 whose NVLink lists a measured all-reduce fit on 8 ranks and one on 2."""
    from hwspecs.catalog import load_cluster
    from hwspecs.schema import CollectiveFit
    from validate.local_specs import to_toml

    folder = tmp_path_factory.mktemp("fits")
    link = load_link("nvlink4")
    fits = [
        CollectiveFit(op="all-reduce", group_size=8, alpha_s=1e-3, bytes_per_s=1e9),
        CollectiveFit(op="all-gather", group_size=2, alpha_s=2e-3, bytes_per_s=5e8),
    ]
    sources = {**link.sources, "collective_fits": "test: made-up fits"}
    fitted = link.model_copy(update={"collective_fits": fits, "sources": sources})
    (folder / "link.toml").write_text(to_toml(fitted.model_dump()))
    dgx = load_cluster("dgx-h100")
    tiers = [dgx.tiers[0].model_copy(update={"link": str(folder / "link.toml")}), *dgx.tiers[1:]]
    return dgx.model_copy(update={"tiers": tiers})


def test_a_listed_fit_replaces_the_formulas_for_its_op_and_group_size(fitted_cluster):
    result = collective_time("all-reduce", 2**20, 8, fitted_cluster)
    assert result.algorithm == "measured"
    assert result.time_s == pytest.approx(1e-3 + 2**20 / 1e9)
    assert result.alternatives == {"measured": pytest.approx(1e-3 + 2**20 / 1e9)}
    gather = collective_time("all-gather", 2**20, 2, fitted_cluster)
    assert gather.time_s == pytest.approx(2e-3 + 2**20 / 5e8)


def test_ops_and_group_sizes_without_a_fit_keep_the_formulas(fitted_cluster):
    for op, ranks in (("all-reduce", 4), ("all-gather", 8), ("reduce-scatter", 8)):
        fitted = collective_time(op, 2**20, ranks, fitted_cluster)
        plain = collective_time(op, 2**20, ranks, "dgx-h100")
        assert fitted.algorithm == plain.algorithm != "measured"
        assert fitted.time_s == pytest.approx(plain.time_s)


def test_a_group_crossing_two_levels_ignores_the_one_level_fit(fitted_cluster):
    # 16 ranks cross NVLink and InfiniBand: no single link's measurement describes them.
    fitted = collective_time("all-reduce", 2**20, 16, fitted_cluster)
    assert fitted.algorithm != "measured"
    assert fitted.time_s == pytest.approx(
        collective_time("all-reduce", 2**20, 16, "dgx-h100").time_s
    )


def test_catalog_links_list_no_fits():
    assert all(not load_link(name).collective_fits for name in catalog_names("link"))


def test_search_row_equals_the_estimate_on_a_link_with_fits(fitted_cluster):
    from hwspecs.catalog import load_accelerator, load_cluster
    from planner.estimate import estimate
    from planner.search import SearchSpace, search
    from planner.spec.job import Job
    from planner.spec.layout import Layout
    from planner.spec.model import load_model

    small = load_model("llama3-8b").model_copy(update={"num_layers": 4})
    job = Job(model=small, seq_len=4096, global_batch_tokens=4096 * 64)
    # Data parallelism over the 8 GPUs of one NVLink domain: gradients all-reduced on 8.
    space = SearchSpace(tp=[1], cp=[1], pp=[1], dp=[8], ep=[1], zero_stage=[0],
                        micro_batch_size=[1], recompute=["full"])  # fmt: skip
    found = search(job, fitted_cluster, load_accelerator("h100-sxm"), 8, space)
    row = found.table.iloc[0]
    keys = ("tp", "cp", "pp", "dp", "ep", "vpp", "micro_batch_size", "schedule", "zero_stage",
            "recompute", "sequence_parallel")  # fmt: skip
    layout = Layout(
        **{k: (row[k].item() if hasattr(row[k], "item") else row[k]) for k in keys},
        num_microbatches=int(row["num_microbatches"]),
    )
    fitted = estimate(job, layout, fitted_cluster)
    assert fitted.step_time_s == pytest.approx(row["step_time_s"])
    plain = estimate(job, layout, load_cluster("dgx-h100"))
    assert fitted.step_time_s != pytest.approx(plain.step_time_s)
