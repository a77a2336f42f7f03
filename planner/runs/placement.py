"""Where a published run ran: the catalog cluster it is predicted on (the row's own, else its
accelerator's reference cluster), grown to the run's GPU count where the run is larger and
spread over the scale-up domains as block scheduling places it."""

from __future__ import annotations

from hwspecs.catalog import catalog_names, load_cluster
from hwspecs.errors import PlanError
from hwspecs.runs import RunRow
from hwspecs.schema import Cluster, ClusterTier
from planner.runs.uncovered import Uncovered

#: The catalog cluster a run on each accelerator is predicted on, grown to the run's GPU
#: count with its outermost link where the run is larger (rows rarely print their network).
REFERENCE_CLUSTERS = {
    "h100-sxm": "dgx-h100",
    "h200-sxm": "dgx-h200",
    "h800-sxm": "dgx-h800",
    "a100-sxm-80gb": "dgx-a100",
    "a100-sxm-40gb": "dgx-a100",
    "b200": "dgx-b200",
    "gb200": "gb200-nvl72",
    "b300": "dgx-b300",
    "gb300": "gb300-nvl72",
    "mi300x": "mi300x",
    "tpu-v4": "tpu-v4",
    "tpu-v5p": "tpu-v5p",
    "tpu-v5e": "tpu-v5e",
    "tpu-v6e": "tpu-v6e",
}


def run_cluster(row: RunRow) -> Cluster:
    """The cluster the row is predicted on: its named catalog cluster (or cluster TOML, such
    as the calibrated machine a ``llmplan validate --out`` row names, whose accelerator is
    then that file's), else the accelerator's reference cluster, grown to the row's GPU
    count where it is larger."""
    accelerator = row.hardware.accelerator
    in_catalog = accelerator in catalog_names("accelerator")
    if not in_catalog and row.hardware.cluster is None:
        raise Uncovered(f"accelerator {accelerator} not in the catalog")
    name = row.hardware.cluster or REFERENCE_CLUSTERS.get(accelerator)
    if name is None:
        raise Uncovered(f"no reference cluster for {accelerator}")
    try:
        cluster = load_cluster(name)
    except PlanError as error:
        raise Uncovered(f"cluster {name}: {error}") from None
    if in_catalog and cluster.accelerator != accelerator:  # a row on a cluster's sibling part
        cluster = cluster.model_copy(update={"accelerator": accelerator})
    gpus = row.hardware.num_gpus
    if gpus <= cluster.num_gpus:
        return spread_over_domains(cluster, gpus)
    return spread_over_domains(_grown(cluster, gpus), gpus)


def _grown(cluster: Cluster, gpus: int) -> Cluster:
    """``cluster`` with one more tier of its outermost link holding ``gpus``: copies of it
    joined as its own copies are (a TPU cluster of pods over DCN by more DCN; a single TPU
    pod, whose one tier is its torus, does not grow)."""
    if cluster.torus_shape is not None and len(cluster.tiers) == 1:
        raise Uncovered("run larger than the catalog's TPU pod")
    outer = cluster.tiers[-1]
    size = -(-gpus // outer.group_size) * outer.group_size
    grown = ClusterTier(name="grown", link=outer.link, group_size=size)
    data = cluster.model_dump()
    data["sources"] = {
        **data["sources"],
        "num_gpus": f"grown to the run's {gpus} GPUs (runs check assumption)",
        f"tiers.{len(cluster.tiers)}": "runs check assumption: the outermost tier's link, "
        "non-blocking, joins copies of the reference cluster",
    }
    return Cluster.model_validate({**data, "num_gpus": size, "tiers": [*cluster.tiers, grown]})


def spread_over_domains(cluster: Cluster, gpus: int) -> Cluster:
    """``cluster`` as a run of ``gpus`` that fills no whole number of its scale-up domains
    uses it: spread evenly over the fewest domains that hold it, whole nodes in each (a
    256-GPU run on NVL72 racks takes 16 of the 18 compute trays of each of 4 racks, so its
    64-rank groups stay inside one NVLink domain; block-topology scheduling places jobs so).
    Unchanged where the run fills whole domains, fits in one, or cannot be spread evenly."""
    domain, node = cluster.scale_up_domain_size, cluster.gpus_per_node
    tier = cluster.tiers[0]
    if domain is None or gpus <= domain or gpus % domain == 0 or tier.group_size != domain:
        return cluster
    fewest = -(-gpus // domain)
    used_domains = next((k for k in range(fewest, gpus // node + 1)
                         if gpus % k == 0 and (gpus // k) % node == 0), None)  # fmt: skip
    if used_domains is None:
        return cluster
    per_domain = gpus // used_domains
    tiers = [tier.model_copy(update={"group_size": per_domain})]
    for outer in cluster.tiers[1:]:  # each outer tier holds as many domains as before
        tiers.append(
            outer.model_copy(update={"group_size": outer.group_size // domain * per_domain})
        )
    if tiers[-1].group_size < gpus:
        return cluster
    data = cluster.model_dump()
    data["sources"] = {
        **data["sources"],
        "tiers.0": f"{data['sources'].get('tiers.0', '')}; runs check assumption: the run spread "
        f"evenly over {used_domains} domains, {per_domain} GPUs in each",
    }
    return Cluster.model_validate({**data, "num_gpus": tiers[-1].group_size,
                                   "scale_up_domain_size": per_domain, "tiers": tiers})  # fmt: skip
