"""The cluster as the placement sees it (:class:`ClusterView`: its first devices with their
specs resolved) and one network level a group of ranks crosses (:class:`Level`), the two
records :mod:`planner.comm.network` computes with and :mod:`planner.comm.collectives` prices."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hwspecs.catalog import load_accelerator, load_cluster, load_link
from hwspecs.errors import PlanError
from hwspecs.schema import Accelerator, Cluster, ClusterTier, LinkTier

SCALE_OUT_KINDS = ("scale-out", "dcn")


TORUS_AXIS_NAMES = "xyzw"


@dataclass(frozen=True)
class ClusterView:
    """A cluster restricted to its first ``num_gpus`` devices, with its specs resolved."""

    cluster: Cluster
    accelerator: Accelerator
    links: dict[str, LinkTier]
    num_gpus: int
    torus_shape: tuple[int, ...] | None  # chips per axis of the torus tier (tier 0), if any

    @property
    def tiers(self) -> list[ClusterTier]:
        return self.cluster.tiers

    def is_torus_tier(self, index: int) -> bool:
        return index == 0 and self.torus_shape is not None


def as_cluster(cluster: Cluster | str) -> Cluster:
    return load_cluster(cluster) if isinstance(cluster, str) else cluster


def cluster_view(cluster: Cluster | str, gpus: int | None = None) -> ClusterView:
    """Resolve ``cluster``'s accelerator and links and keep its first ``gpus`` devices."""
    cluster = as_cluster(cluster)
    num_gpus = cluster.num_gpus if gpus is None else int(gpus)
    if num_gpus < 1 or num_gpus > cluster.num_gpus:
        raise PlanError(
            f"gpus {num_gpus} is not available on cluster '{cluster.id}': choose 1 to "
            f"{cluster.num_gpus}"
        )
    if cluster.tiers[-1].group_size < num_gpus:
        raise PlanError(
            f"cluster '{cluster.id}': its outermost tier '{cluster.tiers[-1].name}' holds "
            f"{cluster.tiers[-1].group_size} GPUs but {num_gpus} are used; add a tier"
        )
    links = {tier.link: load_link(tier.link) for tier in cluster.tiers}
    shape = None
    first = cluster.tiers[0]
    torus = links[first.link].kind == "torus" and cluster.torus_shape
    if torus and math.prod(cluster.torus_shape) == first.group_size:
        shape = tuple(cluster.torus_shape)
    return ClusterView(cluster, load_accelerator(cluster.accelerator), links, num_gpus, shape)


@dataclass(frozen=True)
class Level:
    """One network level a group crosses (a cluster tier, or one axis of a torus tier)."""

    tier: str  # tier name, with the torus axis for torus levels ("ici-x")
    tier_index: int
    link: str
    kind: str
    participants: int  # instances of the level below joined inside one instance of this one
    members_below: int  # group members inside one instance of the level below (fewest)
    steps: int  # ring steps at this level: instances touched below − at this level
    bytes_per_s_per_rank: float  # one direction, after sharing; per link-hop for torus levels
    latency_s: float
    busbw_efficiency: dict[str, float]
    in_network_reduction: bool
    bidirectional: bool  # torus axis covered whole with wraparound: two counter-rotating rings
    oversubscription: float
    share: float
    crossing_ranks: int  # ranks in the busiest instance below whose group leaves it
    concurrent_groups: int  # groups of the axis sharing that instance's uplinks
    stride: int = 1  # torus: hops between neighbouring members along the axis
    #: Measured (op, group size) fits of the link (:attr:`LinkTier.collective_fits`).
    collective_fits: tuple = ()

    @property
    def is_torus(self) -> bool:
        return self.kind == "torus"

    @property
    def group_bytes_per_s(self) -> float:
        """Bus-bandwidth ceiling this level gives a rank of the group (before efficiency)."""
        return self.members_below * self.bytes_per_s_per_rank * (2 if self.bidirectional else 1)


def link_key(level: Level) -> str:
    """The physical link a level's traffic leaves a rank through: the link id (a GPU's NVLink
    ports serve every scale-up tier, its NIC every scale-out tier of that link), or for a
    torus the axis ("ici-x"), whose links are its own. Torus traffic that follows no single
    axis (a snake ring, a point-to-point hop) is keyed by the tier ("ici")."""
    return level.tier if level.is_torus else level.link
