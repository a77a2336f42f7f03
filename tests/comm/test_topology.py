"""Rank placement and the links each group crosses (planner.comm.topology, planner.comm.network)."""

from __future__ import annotations

import dataclasses

import networkx as nx
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hwspecs.catalog import catalog_names, load_cluster
from hwspecs.errors import PlanError
from hwspecs.schema import Cluster
from planner.comm import network
from planner.comm.graph import cluster_graph
from planner.comm.levels import cluster_view
from planner.comm.mesh import GROUP_AXES, axis_groups, group_size
from planner.comm.network import group_levels
from planner.comm.point_to_point import pair_level
from planner.comm.topology import place_groups, topology_report
from planner.spec.layout import Layout

LLAMA3_ORDER = ("tp", "cp", "pp", "dp")  # Llama 3 §3.3.2, innermost first


def axis(report, name):
    return next(a for a in report.axes if a.axis == name)


def test_tp8_on_dgx_h100_stays_on_nvlink_while_dp_crosses_infiniband():
    report = topology_report("dgx-h100", {"tp": 8, "dp": 16})
    tp, dp = axis(report, "tp"), axis(report, "dp")
    assert tp.example_ranks == list(range(8))
    assert tp.tiers == ["nvlink"] and [lv.link for lv in tp.levels] == ["nvlink4"]
    assert dp.example_ranks == list(range(0, 128, 8))
    assert dp.tiers == ["scalable-unit"] and dp.levels[0].link == "ib-ndr"
    assert dp.bottleneck_bytes_per_s_per_rank == 50e9  # one 400G NIC per GPU


def test_rail_sharing_eight_dp_groups_share_a_nodes_eight_nics():
    (level,) = axis(topology_report("dgx-h100", {"tp": 8, "dp": 2}), "dp").levels
    assert level.concurrent_groups == 8 and level.crossing_ranks_per_instance == 8
    assert level.members_per_instance_below == 1 and level.bytes_per_s_per_rank == 50e9


def test_llama3_dp128_spans_pods_and_sees_the_1_to_7_oversubscription():
    report = topology_report("llama3-h100-24k", {"tp": 8, "pp": 16, "dp": 128}, LLAMA3_ORDER)
    assert axis(report, "tp").tiers == ["nvlink"]
    dp = axis(report, "dp")
    assert dp.example_ranks[:3] == [0, 128, 256]  # TP8·PP16 = 128 ranks inside
    assert dp.tiers == ["pod", "cluster"] and dp.tier == "cluster"
    top = dp.levels[-1]
    assert top.oversubscription == 7.0 and top.share == pytest.approx(1 / 7)
    assert top.bytes_per_s_per_rank == pytest.approx(50e9 / 7)
    assert top.crossing_ranks_per_instance == 3072  # every rank of a pod leaves it


def test_a_job_inside_one_pod_sees_no_oversubscription():
    dp = axis(topology_report("llama3-h100-24k", {"tp": 8, "pp": 16, "dp": 24}), "dp")
    assert dp.tiers == ["pod"] and all(level.share == 1.0 for level in dp.levels)


def test_innermost_axis_gets_consecutive_ranks_whatever_the_order():
    sizes = {"tp": 4, "cp": 2, "pp": 2, "dp": 4, "ep": 1}
    assert axis_groups("dp", sizes, ("dp", "tp", "cp", "pp"))[0].tolist() == [0, 1, 2, 3]
    assert axis_groups("tp", sizes, ("dp", "tp", "cp", "pp"))[0].tolist() == [0, 4, 8, 12]


def test_ep_is_carved_out_of_cp_then_dp():
    sizes = {"tp": 1, "cp": 2, "pp": 2, "dp": 4, "ep": 4}
    assert axis_groups("ep", sizes, ("tp", "cp", "ep", "pp", "dp"))[0].tolist() == [0, 1, 2, 3]
    assert axis_groups("dp", sizes, ("tp", "cp", "ep", "pp", "dp"))[0].tolist() == [0, 2, 8, 10]
    assert axis_groups("edp", sizes, ("tp", "cp", "ep", "pp", "dp"))[0].tolist() == [0, 8]


@settings(max_examples=40, deadline=None)
@given(
    degrees=st.lists(st.sampled_from([1, 2, 3, 4]), min_size=4, max_size=4),
    ep_index=st.integers(0, 5),
    order=st.permutations(["tp", "cp", "ep", "pp", "dp"]),
)
def test_every_axis_partitions_the_ranks(degrees, ep_index, order):
    tp, cp, pp, dp = degrees
    divisors = [e for e in range(1, dp * cp + 1) if (dp * cp) % e == 0]
    sizes = {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "ep": divisors[ep_index % len(divisors)]}
    num_gpus = tp * cp * pp * dp
    for name in GROUP_AXES:
        groups = axis_groups(name, sizes, order)
        assert groups.shape[1] == group_size(name, sizes)
        assert sorted(groups.ravel().tolist()) == list(range(num_gpus))
    tp_groups, dp_groups = axis_groups("tp", sizes, order), axis_groups("dp", sizes, order)
    overlap = max(len(set(a) & set(b)) for a in tp_groups.tolist() for b in dp_groups.tolist())
    assert overlap == 1  # orthogonal mesh axes meet in one rank


def test_tpu_v5p_axes_map_onto_torus_dimensions():
    report = topology_report("tpu-v5p", {"tp": 16, "pp": 4, "dp": 8})
    (x,) = axis(report, "tp").levels
    assert x.tier == "ici-x" and x.participants == 16 and x.bidirectional  # whole axis, wraps
    (y,) = axis(topology_report("tpu-v5p", {"tp": 16, "dp": 4}), "dp").levels
    assert y.tier == "ici-y" and y.participants == 4 and not y.bidirectional  # 4 of 20
    (part,) = axis(topology_report("tpu-v5p", {"tp": 8, "dp": 2}), "tp").levels
    assert not part.bidirectional and part.bytes_per_s_per_rank == 100e9  # per ICI link


def test_tpu_v6e_pods_talk_over_dcn_at_the_chips_dcn_rate():
    dp = axis(topology_report("tpu-v6e", {"tp": 256, "dp": 4}), "dp")
    assert dp.tiers == ["dcn"]
    assert dp.levels[0].bytes_per_s_per_rank == 12.5e9  # 100 Gb/s per v6e chip


def test_amd_full_mesh_gives_a_pair_one_link():
    (level,) = axis(topology_report("mi300x", {"tp": 2, "dp": 4}), "tp").levels
    assert level.bytes_per_s_per_rank == 64e9  # ROCm mi300.md: one 64 GB/s link per peer
    (level,) = axis(topology_report("mi300x", {"tp": 8}), "tp").levels
    assert level.bytes_per_s_per_rank == 448e9


def test_pipeline_neighbours_use_the_slowest_stage_boundary():
    pp = axis(topology_report("llama3-h100-24k", {"tp": 8, "pp": 16, "dp": 1}), "pp")
    assert pp.neighbour_level.tier == "pod"  # stage 1 → 2 leaves the 16-GPU rack


def _top_switch_tier(graph: nx.Graph, a: int, b: int) -> str:
    path = nx.shortest_path(graph, ("gpu", a), ("gpu", b))
    switches = [graph.nodes[n].get("level", -1) for n in path]
    node = path[int(np.argmax(switches))]
    return node[0]


def test_networkx_graph_agrees_with_the_arithmetic():
    view = cluster_view("dgx-h100", 512)
    graph = cluster_graph("dgx-h100", gpus=512)
    for a, b, tier in [(0, 7, "nvlink"), (0, 8, "scalable-unit"), (3, 300, "superpod")]:
        assert _top_switch_tier(graph, a, b) == tier
        assert pair_level(view, np.array([a]), np.array([b])).tier == tier
    torus = cluster_graph("tpu-v4")
    assert nx.shortest_path_length(torus, ("gpu", 0), ("gpu", 15)) == 1  # x wraps around
    assert nx.shortest_path_length(torus, ("gpu", 0), ("gpu", 16 * 16 * 8 + 3)) == 11


def test_dp_fills_the_gpus_when_left_out():
    assert topology_report("dgx-h100", {"tp": 8}).sizes["dp"] == 128
    assert topology_report("dgx-h100", {"tp": 8, "pp": 2}, gpus=64).sizes["dp"] == 4


def test_placements_are_cached():
    layout = Layout(tp=8, pp=4, dp=4)
    assert place_groups("dgx-h100", layout) is place_groups("dgx-h100", layout)


@pytest.mark.parametrize("name", catalog_names("cluster"))
def test_every_catalog_cluster_places_a_layout(name):
    cluster = load_cluster(name)
    tp = min(8, cluster.scale_up_domain_size)
    report = topology_report(cluster, {"tp": tp, "dp": cluster.num_gpus // tp})
    assert report.num_gpus == cluster.num_gpus
    assert report.model_dump()["axes"][0]["axis"] == "tp"


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: topology_report("dgx-h100", {"tp": 8, "dp": 256}), "has 1024"),
        (
            lambda: topology_report("dgx-h100", {"tp": 8, "dp": 4}, ("tp", "xx", "pp", "dp")),
            "order",
        ),
        (lambda: topology_report("dgx-h100", {"dp": 4, "ep": 3}), "ep 3"),
        (lambda: topology_report("dgx-h100", {"tp": 8, "dp": 4}, gpus=64), "gpus"),
        (lambda: cluster_view("dgx-h100", 2048), "gpus"),
        (lambda: topology_report("dgx-h100", {"tp": 8, "pp": 3}), "does not tile 1024"),
        (lambda: topology_report("dgx-h100", {"tp": 8}, gpus=2000), "not available"),
    ],
)
def test_bad_placements_are_one_line_errors(call, words):
    with pytest.raises(PlanError, match=words) as error:
        call()
    assert "\n" not in str(error.value)


def test_a_user_cluster_whose_tiers_do_not_cover_it_is_rejected():
    data = load_cluster("dgx-h100").model_dump()
    data["tiers"] = data["tiers"][:1]
    with pytest.raises(PlanError, match="outermost tier"):
        cluster_view(Cluster.model_validate(data))


def test_topology_html_highlights_one_group_per_axis(tmp_path):
    from plots.topology import topology_figure, write_topology_html

    report = topology_report("dgx-h100", {"tp": 8, "pp": 2, "dp": 4})
    figure = topology_figure(report)
    markers = [trace for trace in figure.data if trace.mode == "markers"]
    assert [list(trace.x) for trace in markers] == [
        a.example_ranks for a in report.axes if a.group_size > 1
    ]
    path = write_topology_html(report, tmp_path / "topology.html")
    assert "plotly" in path.read_text()


# ----- the fast group levels against the plain np.unique reference ---------------------


def _distinct_per_row(values):
    ordered = np.sort(values, axis=1)
    return 1 + (np.diff(ordered, axis=1) != 0).sum(axis=1)


def _reference_group_levels(view, groups):
    """planner.comm.network.group_levels as first written: np.unique per level, no shortcuts."""
    groups = np.asarray(groups, dtype=np.int64)
    num_groups, size = groups.shape
    if size == 1:
        return ()
    row = np.repeat(np.arange(num_groups), size).reshape(groups.shape)
    levels, below, below_size = [], groups, 1
    for index, tier in enumerate(view.tiers):
        link = view.links[tier.link]
        inst = groups // tier.group_size
        if view.is_torus_tier(index):
            local = network._members_in_first_instance(groups, inst) % tier.group_size
            levels.extend(network._torus_levels(view, local, tier, link))
            below, below_size = inst, tier.group_size
            continue
        active = _distinct_per_row(below) > _distinct_per_row(inst)
        if active.any():
            span = groups.max() + 1
            keys, counts = np.unique(row * span + below, return_counts=True)
            key_rows, key_below = keys // span, keys % span
            ratio = tier.group_size // below_size
            participants = np.unique(key_rows * span + key_below // ratio, return_counts=True)[1]
            crossing = (_distinct_per_row(below) > 1)[key_rows]
            crossing_ranks = np.bincount(key_below[crossing], weights=counts[crossing])
            worst = int(crossing_ranks.max())
            share = 1.0
            if tier.oversubscription > 1:
                share = min(1.0, below_size / (tier.oversubscription * worst))
            rate = network.link_rate(view, link)
            if network.is_full_mesh(tier, link):
                rate = min(rate, network.per_link_rate(link) * (int(participants.max()) - 1))
            steps = (_distinct_per_row(below) - _distinct_per_row(inst))[active].max()
            levels.append(
                network.Level(
                    tier=tier.name,
                    tier_index=index,
                    link=link.id,
                    kind=link.kind,
                    participants=int(participants.max()),
                    members_below=int(counts[active[key_rows]].min()),
                    steps=int(steps),
                    bytes_per_s_per_rank=rate * share,
                    latency_s=link.latency_s,
                    busbw_efficiency=dict(link.busbw_efficiency),
                    in_network_reduction=link.in_network_reduction,
                    bidirectional=False,
                    oversubscription=tier.oversubscription,
                    share=share,
                    crossing_ranks=worst,
                    concurrent_groups=int(np.bincount(key_below[crossing]).max()),
                )
            )
        below, below_size = inst, tier.group_size
    return tuple(levels)


def _fields(levels):
    return [dataclasses.astuple(level) for level in levels]


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(["llama3-h100-24k", "gb200-nvl72", "mi300x", "dgx-a100", "tpu-v5p"]),
    tp=st.sampled_from([1, 2, 3, 4, 8]),
    cp=st.sampled_from([1, 2, 3, 4]),
    pp=st.sampled_from([1, 2, 4, 6, 16]),
    dp=st.sampled_from([1, 2, 3, 5, 8, 48, 128]),
    ep_index=st.integers(0, 7),
    order=st.permutations(["tp", "cp", "ep", "pp", "dp"]),
    seed=st.integers(0, 2**16),
)
def test_mesh_levels_equal_the_np_unique_reference(name, tp, cp, pp, dp, ep_index, order, seed):
    num_gpus = tp * cp * pp * dp
    assume(num_gpus <= load_cluster(name).num_gpus)
    divisors = [e for e in range(1, dp * cp + 1) if (dp * cp) % e == 0]
    sizes = {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "ep": divisors[ep_index % len(divisors)]}
    placement = place_groups(name, sizes, order)
    view = placement.view
    shuffle = np.random.default_rng(seed).permutation
    for axis_name in GROUP_AXES:
        groups = axis_groups(axis_name, sizes, order)
        expected = _fields(_reference_group_levels(view, groups))
        placed = placement.groups[axis_name]
        assert _fields(placed.levels) == expected, axis_name
        assert placed.example_ranks == tuple(groups[0].tolist())
        assert (placed.num_groups, placed.group_size) == groups.shape
        mixed = groups[:, shuffle(groups.shape[1])]  # group_levels sorts each row itself
        assert _fields(group_levels(view, mixed)) == expected, axis_name
