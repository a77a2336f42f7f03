"""The cluster as a networkx graph: GPUs, switches per tier and torus links — the structure
:mod:`planner.comm.network` costs, drawn for tests and pictures (the search never builds it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hwspecs.schema import Cluster
from planner.comm.levels import ClusterView, cluster_view

if TYPE_CHECKING:
    import networkx


def cluster_graph(cluster: Cluster | str, gpus: int | None = None) -> networkx.Graph:
    """The cluster's first ``gpus`` devices as a networkx graph.

    Nodes: ``("gpu", r)`` and ``(tier name, instance)`` switches. A GPU links to the switch
    of its scale-up domain (tier 0) and, through its NIC, to the switch of tier 1; each
    switch of tier k ≥ 1 links up to the one of tier k+1. A torus tier has no switch: its
    chips link to their neighbours along each axis (wrapping when the cluster says so).
    Edges carry ``link`` (id) and ``tier`` (name). The top switch a shortest path between
    two GPUs passes through names the tier their traffic crosses.
    """
    view = cluster_view(cluster, gpus)
    import networkx as nx  # imported here: the search does not need the graph

    graph = nx.Graph()
    ranks = range(view.num_gpus)
    graph.add_nodes_from((("gpu", r) for r in ranks), kind="gpu")
    for index, tier in enumerate(view.tiers):
        if view.is_torus_tier(index):
            _add_torus_edges(graph, view, tier)
            continue
        count = -(-view.num_gpus // tier.group_size)
        graph.add_nodes_from(((tier.name, i) for i in range(count)), kind="switch", level=index)
        if index <= 1:  # GPUs attach to the scale-up switch and, by NIC, to the first leaf
            graph.add_edges_from((("gpu", r), (tier.name, r // tier.group_size)) for r in ranks)
        else:
            inner = view.tiers[index - 1]
            graph.add_edges_from(
                ((inner.name, i), (tier.name, i * inner.group_size // tier.group_size))
                for i in range(-(-view.num_gpus // inner.group_size))
            )
        for u, v in graph.edges((tier.name, i) for i in range(count)):
            graph.edges[u, v].setdefault("tier", tier.name)
            graph.edges[u, v].setdefault("link", tier.link)
    return graph


def _add_torus_edges(graph, view: ClusterView, tier) -> None:
    shape, domain = view.torus_shape, tier.group_size
    for rank in range(view.num_gpus):
        base, local = rank - rank % domain, rank % domain
        stride = 1
        for extent in shape:
            coord = (local // stride) % extent
            step = coord + 1
            if step < extent or (view.cluster.torus_wraparound and extent > 2):
                neighbour = base + local + ((step % extent) - coord) * stride
                if neighbour < view.num_gpus:
                    graph.add_edge(
                        ("gpu", rank), ("gpu", neighbour), tier=tier.name, link=tier.link
                    )
            stride *= extent
