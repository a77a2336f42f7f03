"""The hardware catalog loads, cross-references resolve, and key figures match their sources.

Expected values are copied from the published tables cited in each catalog file (vendor
datasheets, ml-engineering MAMF and nccl-tests figures, the Llama 3 and DeepSeek papers).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from hwspecs.catalog import catalog_names, load_accelerator, load_cluster, load_link
from hwspecs.errors import PlanError
from hwspecs.schema import DEFAULT_SOURCE_PREFIX, Accelerator, LinkTier

ACCELERATORS = catalog_names("accelerator")
LINKS = catalog_names("link")
CLUSTERS = catalog_names("cluster")

GB = 1e9
MIB = 2**20


# --- every file loads and names what it should -------------------------------------------


@pytest.mark.parametrize("name", ACCELERATORS)
def test_accelerator_file_loads_under_its_own_id(name: str) -> None:
    assert load_accelerator(name).id == name


@pytest.mark.parametrize("name", LINKS)
def test_link_file_loads_under_its_own_id(name: str) -> None:
    assert load_link(name).id == name


@pytest.mark.parametrize("name", CLUSTERS)
def test_cluster_file_loads_under_its_own_id(name: str) -> None:
    assert load_cluster(name).id == name


def test_catalog_holds_the_planned_entries() -> None:
    assert set(ACCELERATORS) >= {
        "a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm", "h100-pcie", "h800-sxm", "h200-sxm",
        "b200", "gb200", "mi300x", "mi325x", "mi355x",
        "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-v7",
    }  # fmt: skip
    assert set(LINKS) >= {
        "nvlink3", "nvlink4", "nvlink4-h800", "nvlink5", "pcie4", "pcie5",
        "ib-hdr", "ib-ndr", "ib-xdr", "roce-400g", "xgmi-mi300x", "xgmi-mi355x",
        "tpu-ici-v4", "tpu-ici-v5e", "tpu-ici-v5p", "tpu-ici-v6e", "tpu-ici-v7", "dcn",
    }  # fmt: skip
    assert set(CLUSTERS) >= {
        "dgx-a100", "dgx-h100", "dgx-h200", "dgx-h800", "llama3-h100-24k", "gb200-nvl72",
        "tpu-v4", "tpu-v5p", "tpu-v6e", "mi300x",
    }  # fmt: skip


# --- cross-references ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ACCELERATORS)
def test_accelerator_links_exist_in_catalog(name: str) -> None:
    accelerator = load_accelerator(name)
    assert accelerator.scale_up_link in LINKS
    if accelerator.nic_link is not None:
        assert accelerator.nic_link in LINKS


@pytest.mark.parametrize("name", CLUSTERS)
def test_cluster_accelerator_and_tier_links_exist_in_catalog(name: str) -> None:
    cluster = load_cluster(name)
    assert cluster.accelerator in ACCELERATORS
    assert all(tier.link in LINKS for tier in cluster.tiers)


@pytest.mark.parametrize("name", CLUSTERS)
def test_cluster_tiers_run_from_scale_up_domain_to_whole_cluster(name: str) -> None:
    cluster = load_cluster(name)
    assert cluster.tiers[0].group_size == cluster.scale_up_domain_size
    assert cluster.tiers[-1].group_size == cluster.num_gpus
    assert (
        cluster.scale_up_domain_size == load_accelerator(cluster.accelerator).scale_up_domain_size
    )
    assert cluster.tiers[0].link == load_accelerator(cluster.accelerator).scale_up_link


# --- every accelerator is usable by the planner ------------------------------------------


@pytest.mark.parametrize("name", ACCELERATORS)
def test_every_accelerator_has_a_bf16_matmul_efficiency(name: str) -> None:
    assert 0 < load_accelerator(name).matmul_efficiency["bf16"] <= 1


@pytest.mark.parametrize("name", ACCELERATORS)
def test_tpus_publish_no_fp32_or_tf32_peak(name: str) -> None:
    accelerator = load_accelerator(name)
    if accelerator.kind == "tpu":
        assert accelerator.fp32_tflops is None
        assert accelerator.tf32_tflops is None


@pytest.mark.parametrize("name", LINKS)
def test_per_link_rate_times_link_count_is_the_per_gpu_rate(name: str) -> None:
    link = load_link(name)
    if link.links_per_gpu and link.bytes_per_s_per_direction_per_link:
        total = link.links_per_gpu * link.bytes_per_s_per_direction_per_link
        assert math.isclose(total, link.bytes_per_s_per_direction, rel_tol=1e-9)


@pytest.mark.parametrize("name", LINKS)
def test_in_network_reduction_only_where_nvls_is_measured(name: str) -> None:
    link = load_link(name)
    assert link.in_network_reduction == ("nvls" in link.busbw_efficiency)


@pytest.mark.parametrize(
    ("name", "spec_path"),
    [
        ("h100-pcie", "matmul_efficiency.bf16"),
        ("h800-sxm", "matmul_efficiency.bf16"),
        ("tpu-v5p", "matmul_efficiency.fp8"),
        ("mi300x", "matmul_efficiency.fp8"),
    ],
)
def test_unmeasured_matmul_efficiencies_are_marked_default(name: str, spec_path: str) -> None:
    assert load_accelerator(name).source_of(spec_path).startswith(DEFAULT_SOURCE_PREFIX)


def test_no_published_full_recompute_run_beats_its_matmul_ceiling() -> None:
    """A run that recomputes every layer does 4/3 of its model FLOPs, nearly all in
    matmuls, so its hardware FLOP rate bounds its chip's matmul rate from below: the catalog's
    ceiling (peak × matmul efficiency) must not sit under it. The GPUs' median MAMF, once
    the TPUs' default, failed this on MaxText's TPU v5p rows (64.8% MFU, 86% of peak)."""
    from hwspecs.catalog import load_runs

    checked = 0
    for row in load_runs("train"):
        t, m = row.training, row.measured
        if row.hardware.accelerator not in ACCELERATORS or not m.model_tflops_per_gpu:
            continue
        if "full" not in (t.recompute or "").lower() or "bf16" not in (t.precision or "").lower():
            continue
        chip = load_accelerator(row.hardware.accelerator)
        ceiling = chip.bf16_tflops * chip.matmul_efficiency["bf16"]
        assert m.model_tflops_per_gpu * 4 / 3 <= ceiling, row.id
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("name", ["tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-v7"])
def test_tpu_matmul_ceiling_is_the_measured_tpu_matmul(name: str) -> None:
    """scaling-book's profile of a bf16[32·1024, 8192] × [8192, 32768] matmul on TPU v2:
    95.6 ms at peak, 96 ms measured."""
    chip = load_accelerator(name)
    assert chip.matmul_efficiency["bf16"] == pytest.approx(95.6 / 96, abs=1e-4)
    assert "scaling-book" in chip.source_of("matmul_efficiency.bf16")


@pytest.mark.parametrize("name", ["roce-400g", "ib-xdr", "pcie5", "xgmi-mi300x", "tpu-ici-v6e"])
def test_unmeasured_busbw_efficiencies_are_marked_default(name: str) -> None:
    assert load_link(name).source_of("busbw_efficiency.ring").startswith(DEFAULT_SOURCE_PREFIX)


BUSBW_DEFAULT_GROUPS = {"scale-up": "scale-up", "torus": "scale-up", "host": "scale-up"}


@pytest.mark.parametrize("name", LINKS)
def test_default_ring_efficiency_is_median_of_measured_tiers_in_its_group(name: str) -> None:
    """hwspecs/data/README.md rule 3: scale-up/torus/host vs scale-out/dcn groups."""
    link = load_link(name)
    if not link.source_of("busbw_efficiency.ring").startswith(DEFAULT_SOURCE_PREFIX):
        return
    group = BUSBW_DEFAULT_GROUPS.get(link.kind, "network")
    measured = [
        other.busbw_efficiency["ring"]
        for other in map(load_link, LINKS)
        if BUSBW_DEFAULT_GROUPS.get(other.kind, "network") == group
        and other.source_of("busbw_efficiency.ring").startswith("measured")
    ]
    assert link.busbw_efficiency["ring"] == pytest.approx(statistics.median(measured), abs=0.001)


@pytest.mark.parametrize("dtype", ["fp8"])
def test_tpu_default_matmul_efficiency_is_median_of_all_measurements(dtype: str) -> None:
    """hwspecs/data/README.md rule 1, whole-catalog step; each measurement counts once (bf16
    is a TPU measurement: test_tpu_matmul_ceiling_is_the_measured_tpu_matmul)."""
    accelerators = [load_accelerator(name) for name in ACCELERATORS]
    measured = {
        accelerator.matmul_efficiency[dtype]
        for accelerator in accelerators
        if accelerator.source_of(f"matmul_efficiency.{dtype}").startswith("measured")
    }
    for accelerator in accelerators:
        if accelerator.kind == "tpu" and dtype in accelerator.matmul_efficiency:
            expected = statistics.median(measured)
            assert accelerator.matmul_efficiency[dtype] == pytest.approx(expected, abs=0.0005)


# --- key figures equal the published tables -----------------------------------------------


def test_h100_sxm_dense_peaks_match_nvidia_datasheet() -> None:
    h100 = load_accelerator("h100-sxm")
    assert h100.bf16_tflops == 989.4
    assert h100.fp8_tflops == 1978.9
    assert h100.tf32_tflops == 494.7
    assert h100.hbm_bytes == 81_559 * MIB
    assert h100.hbm_bytes_per_s == 3.35e12


def test_h100_sxm_matmul_efficiency_matches_mamf() -> None:
    h100 = load_accelerator("h100-sxm")
    assert h100.matmul_efficiency["bf16"] == pytest.approx(794.5 / 989.4, abs=0.002)
    assert h100.matmul_efficiency["fp8"] == pytest.approx(1402.6 / 1978.9, abs=0.002)


@pytest.mark.parametrize(
    ("name", "dtype", "mamf_tflops"),
    [
        ("a100-sxm-80gb", "bf16", 271.2),
        ("h200-sxm", "fp8", 1453.4),
        ("b200", "bf16", 1745.0),
        ("b200", "fp8", 3432.5),
        ("gb200", "bf16", 1822.0),
        ("gb200", "fp8", 3615.6),
        ("mi300x", "bf16", 668.4),
        ("mi325x", "bf16", 784.9),
        ("mi355x", "bf16", 1565.0),
    ],
)
def test_measured_mamf_reproduces_against_stored_peak(
    name: str, dtype: str, mamf_tflops: float
) -> None:
    accelerator = load_accelerator(name)
    achievable_tflops = accelerator.achievable_matmul_flops_per_s(dtype) / 1e12
    assert achievable_tflops == pytest.approx(mamf_tflops, rel=0.002)


def test_mi355x_efficiency_uses_spec_peak_not_ml_engineering_2300() -> None:
    mi355x = load_accelerator("mi355x")
    assert mi355x.bf16_tflops == 2516.6
    assert mi355x.matmul_efficiency["bf16"] == pytest.approx(1565 / 2516.6, abs=0.002)
    assert mi355x.matmul_efficiency["bf16"] < 1565 / 2300 - 0.05


def test_h800_has_h100_sxm_tensor_peaks_and_reduced_nvlink() -> None:
    h800, h100 = load_accelerator("h800-sxm"), load_accelerator("h100-sxm")
    assert h800.bf16_tflops == h100.bf16_tflops
    assert h800.fp8_tflops == h100.fp8_tflops
    assert load_link(h800.scale_up_link).bytes_per_s_per_direction == 200 * GB


@pytest.mark.parametrize(
    ("name", "bf16_tflops", "hbm_bytes"),
    [
        ("a100-sxm-80gb", 312, 85_056_798_720),
        ("h200-sxm", 989.4, 143_771 * MIB),
        ("b200", 2250, 183_359 * MIB),
        ("gb200", 2500, 189_471 * MIB),
        ("mi300x", 1307.4, 192 * 2**30),
        ("tpu-v5p", 459, 95 * 2**30),
        ("tpu-v6e", 918, 32_000_000_000),
        ("tpu-v7", 2307, 192 * 2**30),
    ],
)
def test_peak_and_reported_hbm_match_reference(
    name: str, bf16_tflops: float, hbm_bytes: int
) -> None:
    accelerator = load_accelerator(name)
    assert accelerator.bf16_tflops == bf16_tflops
    assert accelerator.hbm_bytes == hbm_bytes


def test_nvlink4_ring_and_nvls_busbw_match_nccl_tests() -> None:
    nvlink4 = load_link("nvlink4")
    assert nvlink4.bytes_per_s_per_direction == 450 * GB
    ring = nvlink4.bytes_per_s_per_direction * nvlink4.busbw_efficiency["ring"]
    nvls = nvlink4.bytes_per_s_per_direction * nvlink4.busbw_efficiency["nvls"]
    assert ring / GB == pytest.approx(367.2, abs=1.0)
    assert nvls / GB == pytest.approx(480.0, abs=1.0)


def test_nvlink5_ring_and_nvls_busbw_match_b200_nccl_tests() -> None:
    nvlink5 = load_link("nvlink5")
    ring = nvlink5.bytes_per_s_per_direction * nvlink5.busbw_efficiency["ring"]
    nvls = nvlink5.bytes_per_s_per_direction * nvlink5.busbw_efficiency["nvls"]
    assert ring / GB == pytest.approx(682.2, abs=1.0)
    assert nvls / GB == pytest.approx(838.0, abs=1.0)


def test_ndr_inter_node_busbw_is_46_to_48_gb_per_s_per_nic() -> None:
    ndr = load_link("ib-ndr")
    assert ndr.bytes_per_s_per_direction == 50 * GB
    assert 46 <= ndr.bytes_per_s_per_direction * ndr.busbw_efficiency["ring"] / GB <= 48


def test_hdr_inter_node_busbw_is_about_24_gb_per_s_per_nic() -> None:
    hdr = load_link("ib-hdr")
    assert hdr.bytes_per_s_per_direction * hdr.busbw_efficiency["ring"] / GB == pytest.approx(24)


def test_h800_nvlink_achieves_160_gb_per_s() -> None:
    h800 = load_link("nvlink4-h800")
    assert h800.bytes_per_s_per_direction * h800.busbw_efficiency["ring"] / GB == pytest.approx(160)


@pytest.mark.parametrize(
    ("name", "bidirectional_gb_per_s_per_chip", "links"),
    [
        ("tpu-ici-v5e", 400, 4),
        ("tpu-ici-v5p", 1200, 6),
        ("tpu-ici-v6e", 800, 4),
        ("tpu-ici-v7", 1200, 6),
    ],
)
def test_tpu_ici_per_chip_rate_is_half_google_bidirectional_figure(
    name: str, bidirectional_gb_per_s_per_chip: float, links: int
) -> None:
    ici = load_link(name)
    assert ici.bytes_per_s_per_direction == bidirectional_gb_per_s_per_chip / 2 * GB
    assert ici.links_per_gpu == links


def test_nic_links_are_400_gb_per_s_per_port() -> None:
    for name in ("ib-ndr", "roce-400g"):
        assert load_link(name).bytes_per_s_per_direction == 400e9 / 8


# --- clusters -----------------------------------------------------------------------------


def test_llama3_cluster_has_3072_gpu_pods_and_1_to_7_above_them() -> None:
    cluster = load_cluster("llama3-h100-24k")
    assert cluster.num_gpus == 24_576
    assert [tier.group_size for tier in cluster.tiers] == [8, 16, 3072, 24_576]
    assert [tier.oversubscription for tier in cluster.tiers] == [1.0, 1.0, 1.0, 7.0]
    assert [tier.link for tier in cluster.tiers] == ["nvlink4"] + ["roce-400g"] * 3


def test_deepseek_cluster_is_2048_h800_on_nvlink_and_ndr() -> None:
    cluster = load_cluster("dgx-h800")
    assert (cluster.accelerator, cluster.num_gpus, cluster.gpus_per_node) == ("h800-sxm", 2048, 8)
    assert [tier.link for tier in cluster.tiers] == ["nvlink4-h800", "ib-ndr", "ib-ndr"]


@pytest.mark.parametrize(("name", "shape"), [("tpu-v4", [16, 16, 16]), ("tpu-v5p", [16, 20, 28])])
def test_tpu_torus_shape_multiplies_to_chip_count(name: str, shape: list[int]) -> None:
    cluster = load_cluster(name)
    assert cluster.torus_shape == shape
    assert math.prod(cluster.torus_shape) == cluster.num_gpus


@pytest.mark.parametrize("name", CLUSTERS)
def test_any_torus_shape_multiplies_to_the_ici_domain(name: str) -> None:
    cluster = load_cluster(name)
    if cluster.torus_shape is not None:
        assert math.prod(cluster.torus_shape) == cluster.scale_up_domain_size
        assert cluster.num_gpus % cluster.scale_up_domain_size == 0


def test_gb200_cluster_has_72_gpu_nvlink_domains() -> None:
    cluster = load_cluster("gb200-nvl72")
    assert cluster.scale_up_domain_size == 72
    assert cluster.num_gpus % 72 == 0


# --- user files and validation ------------------------------------------------------------

USER_ACCELERATOR = """
id = "my-gpu"
name = "My GPU"
vendor = "Acme"
bf16_tflops = 100.0
hbm_bytes = 1_000_000_000
hbm_bytes_per_s = 1.0e12
{extra}
[sources]
bf16_tflops = "my datasheet"
hbm_bytes = "my datasheet"
hbm_bytes_per_s = "my datasheet"
scale_up_domain_size = "default: one GPU"
nics_per_gpu = "default: one NIC"
{extra_source}
"""


def write_user_accelerator(tmp_path: Path, extra: str = "", extra_source: str = "") -> str:
    path = tmp_path / "my-gpu.toml"
    path.write_text(USER_ACCELERATOR.format(extra=extra, extra_source=extra_source))
    return str(path)


def test_user_toml_path_is_accepted(tmp_path: Path) -> None:
    path = write_user_accelerator(
        tmp_path,
        extra="hbm_bandwidth_efficiency = 0.9",
        extra_source='hbm_bandwidth_efficiency = "mine"',
    )
    accelerator = load_accelerator(path)
    assert isinstance(accelerator, Accelerator)
    assert accelerator.peak_flops_per_s("bf16") == 100e12


def test_unknown_key_is_rejected_with_its_name(tmp_path: Path) -> None:
    path = write_user_accelerator(
        tmp_path,
        extra="hbm_bandwidth_efficiency = 0.9\nbf16_tflop = 5.0",
        extra_source='hbm_bandwidth_efficiency = "mine"',
    )
    with pytest.raises(PlanError, match=r"bf16_tflop.*unknown key"):
        load_accelerator(path)


def test_number_without_source_in_a_users_file_is_used_with_a_warning(tmp_path: Path) -> None:
    from hwspecs.errors import UnsourcedFigures

    path = write_user_accelerator(
        tmp_path,
        extra="fp8_tflops = 200.0\nhbm_bandwidth_efficiency = 0.9",
        extra_source='hbm_bandwidth_efficiency = "mine"',
    )
    with pytest.warns(UnsourcedFigures, match=r"no source for fp8_tflops \("):
        assert load_accelerator(path).fp8_tflops == 200.0


def test_number_without_source_in_a_catalog_file_is_rejected_with_its_name() -> None:
    from hwspecs.catalog import DATA_DIR, parse_spec, read_toml

    data = read_toml(DATA_DIR / "accelerators" / "h100-sxm.toml")
    del data["sources"]["bf16_tflops"]
    with pytest.raises(PlanError, match="without a source in \\[sources\\]: bf16_tflops"):
        parse_spec(data, Accelerator, "h100-sxm")


def test_defaulted_number_needs_no_source_but_a_given_one_does(tmp_path: Path) -> None:
    # Left at its documented schema default, hbm_bandwidth_efficiency needs no source...
    assert load_accelerator(write_user_accelerator(tmp_path)).hbm_bandwidth_efficiency == 0.8
    # ...but a value the file gives is named when it carries none.
    from hwspecs.errors import UnsourcedFigures

    other = tmp_path / "other"
    other.mkdir()
    with pytest.warns(UnsourcedFigures, match="hbm_bandwidth_efficiency"):
        load_accelerator(write_user_accelerator(other, extra="hbm_bandwidth_efficiency = 0.9"))


def test_unknown_catalog_name_suggests_the_closest() -> None:
    with pytest.raises(PlanError, match="did you mean 'h100-sxm'"):
        load_accelerator("h100-sxn")


def test_link_without_source_for_efficiency_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"busbw_efficiency\.ring"):
        LinkTier.model_validate(
            {
                "id": "x",
                "name": "x",
                "kind": "scale-out",
                "bytes_per_s_per_direction": 1e9,
                "latency_s": 1e-6,
                "busbw_efficiency": {"ring": 0.9},
                "sources": {"bytes_per_s_per_direction": "a", "latency_s": "b"},
            }
        )
