"""The calibrated machine as hwspecs: accelerator, link tier and cluster, and their TOML files.

Mapping of the measurements onto the schema (also written into each file's ``notes``):

* accelerator: ``fp32_tflops`` (and ``tf32_tflops``, since the planner's FP32 recipe costs
  its GEMMs at the TF32 peak and a CPU runs them in FP32) is the best FP32 GEMM rate over
  the workload shapes; ``matmul_efficiency`` is the geometric mean over those shapes divided
  by that best, so peak × efficiency is the typical rate. ``hbm_bytes_per_s`` is the
  measured single-thread copy bandwidth (efficiency 1). ``hbm_bytes`` is the machine's RAM
  divided by the number of ranks. ``attention_forward_efficiency`` and
  ``attention_backward_efficiency`` (FP32 and TF32) are the geometric means over the
  workloads of the measured attention rates (:class:`validate.calibrate.AttentionPoint`)
  divided by the FP32 peak, as the GPU catalog's come from FlashAttention's measured rates.
  ``overlaps_communication`` is false: gloo's threads run on the cores that compute.
* link: ``bytes_per_s_per_direction`` and ``latency_s`` are the 2-rank point-to-point fit
  (``1/β`` and ``α``). ``busbw_efficiency.ring`` is what makes the planner's ring
  all-reduce bandwidth term equal the measured all-reduce on the most ranks
  (``2(n−1)/n / (rate·β)``); ``alltoall`` the same for all-to-all (``(n−1)/n``); ``p2p`` 1.
  Every other fit is kept as ``<collective>_n<ranks>`` (same formula with that collective's
  nccl-tests factor), which the planner does not read. Each fit measured under the link's
  world size (whole world, and groups of 2 inside a world of 4) is also listed in
  ``collective_fits`` (α and 1/β per op and group size), which the planner uses instead of
  its formulas (:func:`planner.comm.collectives.measured_cost`). One link file per world size.
"""

from __future__ import annotations

import json
import math
import os
import platform
from pathlib import Path

from hwspecs.schema import Accelerator, Cluster, ClusterTier, CollectiveFit, LinkTier
from validate.timing import BURST_GEMMS, REPETITIONS

#: nccl-tests bus-bandwidth factor per collective (planner.comm.collectives.volume_factor).
FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "p2p": lambda n: 1.0,
}
MAX_EFFICIENCY = 1.5  # LinkTier accepts (0, 1.5]
WINDOW_MS = 30  # validate.timing.WINDOW_S


def _cpu_field(name: str, default: str) -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(name):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return default


def accelerator_spec(
    gemms,
    memory_bytes_per_s: float,
    ranks: int,
    method: str,
    op_overhead_s: float | None = None,
    attention=(),
    sharded_op_overhead_s: float | None = None,
    functional_collective_overhead_s: float | None = None,
    pipeline_action_overhead_s: dict[str, float] | None = None,
    data_parallel_overhead_s: dict[str, float] | None = None,
) -> Accelerator:
    by_dtype = {}
    for dtype in ("fp32", "bf16"):
        rates = [p.flops_per_s for p in gemms if p.dtype == dtype]
        best = max(rates)
        typical = math.exp(sum(math.log(r) for r in rates) / len(rates))
        by_dtype[dtype] = (best, min(typical / best, 1.0))
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    shapes = ", ".join(sorted({f"{p.m}x{p.k}x{p.n}" for p in gemms}))
    gemm_source = (
        f"measured: {method}, torch.mm at 1 thread on each of {ranks} concurrent ranks, "
        f"slowest rank, calls per {WINDOW_MS} ms window, median of 3, shapes {shapes}"
    )
    overhead = {}
    if op_overhead_s is not None:
        overhead = {
            "op_overhead_s": f"measured: {method}, validate.host_costs.op_mix (forward, backward "
            f"and AdamW step at negligible FLOPs) on each of {ranks} concurrent ranks, 1 "
            "thread: seconds per step over its ATen operations (TorchDispatchMode count), "
            "slowest rank, 100 ms windows, median of 3"
        }
    if sharded_op_overhead_s is not None:
        overhead["sharded_op_overhead_s"] = (
            f"measured: {method}, validate.host_costs.measure_sharded_op_overhead (AdamW "
            f"foreach=False steps and zero_grad on Shard(0) DTensor parameters over {ranks} "
            "ranks, no communication) on each rank at once, 1 thread: (step time - plain "
            "operations x op_overhead_s) / DTensor operations, slowest rank"
        )
    if pipeline_action_overhead_s:
        overhead["pipeline_action_overhead_s"] = (
            f"measured: {method}, validate.host_costs.measure_pipeline_action_overheads: "
            f"torch 1F1B and ZBV over {ranks} ranks, one reference layer of hidden size 8 per "
            "stage, 2 x ranks micro-batches, 5 steps: each action's duration less its "
            "dispatched operations x op_overhead_s, median over the actions that wait for no "
            "peer (first stage's forwards, last stage's backwards, all weight gradients), "
            "slowest rank"
        )
    if data_parallel_overhead_s:
        overhead["data_parallel_overhead_s"] = (
            f"measured: {method}, validate.host_costs.measure_wrapper_overheads: FSDP2 "
            "(each of 4 layers and the root) and DDP around the reference model at hidden "
            f"size 8, each of {ranks} ranks over a group of itself at once, 1 thread: the "
            "wrapped forward's and backward's median time over 20 less the plain one's, less "
            "the operations the wrapper adds (counted) x op_overhead_s, per unit (FSDP2) or "
            "call (DDP), slowest rank"
        )
    if functional_collective_overhead_s is not None:
        overhead["functional_collective_overhead_s"] = (
            f"measured: {method}, validate.calibrate.measure_functional_overhead: torch "
            f"functional all-reduce, all-gather and reduce-scatter of 4 KiB on {ranks} ranks "
            f"minus the same c10d call, each the median of {REPETITIONS} calls after a "
            "barrier, median over the three, slowest rank"
        )
    attention_fields, attention_sources = {}, {}
    if attention:
        shapes = ", ".join(f"{a.heads}/{a.kv_heads} heads x {a.seq_len} x {a.head_dim}"
                           for a in attention)  # fmt: skip
        for field, rates in (
            ("attention_forward_efficiency", [a.forward_flops_per_s for a in attention]),
            ("attention_backward_efficiency", [a.backward_flops_per_s for a in attention]),
        ):
            typical = math.exp(sum(math.log(r) for r in rates) / len(rates))
            efficiency = min(typical / by_dtype["fp32"][0], 1.0)
            attention_fields[field] = {"fp32": efficiency, "tf32": efficiency}
            attention_sources[field] = (
                f"measured: {method}, scaled_dot_product_attention (causal, GQA, FP32) at 1 "
                f"thread on each of {ranks} concurrent ranks, slowest rank, one sequence of "
                f"each workload ({shapes}), FLOPs as planner.cost.flops.attention_core_ops "
                "(backward on 2.5x the forward's); geometric mean / the fp32 peak"
            )
    return Accelerator(
        id="local-cpu",
        name=f"{_cpu_field('model name', platform_name())}, one core per rank",
        vendor=_cpu_field("vendor_id", "unknown"),
        kind="gpu",
        fp32_tflops=by_dtype["fp32"][0] / 1e12,
        tf32_tflops=by_dtype["fp32"][0] / 1e12,
        bf16_tflops=by_dtype["bf16"][0] / 1e12,
        hbm_bytes=ram // ranks,
        hbm_bytes_per_s=memory_bytes_per_s,
        scale_up_domain_size=ranks,
        nics_per_gpu=1.0,
        matmul_efficiency={
            "fp32": by_dtype["fp32"][1],
            "tf32": by_dtype["fp32"][1],
            "bf16": by_dtype["bf16"][1],
        },
        hbm_bandwidth_efficiency=1.0,
        op_overhead_s=op_overhead_s,
        sharded_op_overhead_s=sharded_op_overhead_s,
        functional_collective_overhead_s=functional_collective_overhead_s,
        pipeline_action_overhead_s=pipeline_action_overhead_s or {},
        data_parallel_overhead_s=data_parallel_overhead_s or {},
        overlaps_communication=False,
        **attention_fields,
        notes=(
            "A CPU core acting as one rank (gloo, one thread). tf32 = fp32: the planner costs "
            "FP32-recipe GEMMs at the tf32 peak; a CPU runs them in FP32. Peaks are the best "
            "measured GEMM rate; efficiencies are the geometric mean over the workload shapes "
            "divided by it. "
            + "; ".join(f"{p.what} {p.dtype} {p.flops_per_s / 1e9:.1f} GFLOP/s" for p in gemms)
            + "".join(
                f"; {a.what} forward {a.forward_flops_per_s / 1e9:.1f}, backward "
                f"{a.backward_flops_per_s / 1e9:.1f} GFLOP/s"
                for a in attention
            )
        ),
        sources={
            "fp32_tflops": gemm_source + " (best fp32 shape)",
            "tf32_tflops": gemm_source + " (CPU has no TF32: the fp32 figure)",
            "bf16_tflops": gemm_source + " (best bf16 shape)",
            "matmul_efficiency": gemm_source + " (geometric mean / best)",
            "hbm_bytes": f"measured: {method}, physical RAM (sysconf) / {ranks} ranks",
            "hbm_bytes_per_s": f"measured: {method}, torch copy_ of 64 MiB at 1 thread on "
            f"each of {ranks} concurrent ranks, read + write bytes, slowest rank",
            "hbm_bandwidth_efficiency": "default: the bandwidth above is itself measured",
            "scale_up_domain_size": f"measured: {method}, all {ranks} ranks share one host",
            "nics_per_gpu": "default: loopback, no NIC",
            "overlaps_communication": "default: a rank is one thread on a CPU core and gloo "
            "moves the data with CPU threads on the same cores, so a collective takes its "
            "time from compute instead of running beside it",
            **overhead,
            **attention_sources,
        },
    )


def platform_name() -> str:
    return platform.processor() or platform.machine()


#: calibrate's collective names -> the schema's op names.
OP_NAMES = {
    "all_reduce": "all-reduce",
    "all_gather": "all-gather",
    "reduce_scatter": "reduce-scatter",
    "all_to_all": "all-to-all",
    "p2p": "p2p",
}


def _fit_key(fit) -> str:
    """``<collective>_n<world>`` for whole-world fits, ``..._g<group>`` for subgroup fits."""
    key = f"{fit.collective}_n{fit.world_size}"
    return key if fit.ranks == fit.world_size else f"{key}_g{fit.ranks}"


def collective_fit_specs(fits, world_size: int) -> list[CollectiveFit]:
    """The schema's fits for a link used by ``world_size`` ranks: every fit measured while
    that many ranks ran (whole world and its groups of 2), in the schema's op names."""
    return [
        CollectiveFit(op=OP_NAMES[f.collective], group_size=f.ranks, alpha_s=f.alpha_s,
                      bytes_per_s=f.algbw_bytes_per_s)
        for f in fits
        if f.world_size == world_size
    ]  # fmt: skip


def link_spec(fits, ranks: int, method: str) -> LinkTier:
    """The loopback link for runs of ``ranks`` processes (module docstring)."""

    def fit(name, n):
        return next(f for f in fits if (f.collective, f.world_size, f.ranks) == (name, n, n))

    p2p = fit("p2p", 2)
    rate = 1.0 / p2p.beta_s_per_byte
    source = (
        f"measured: {method}, gloo over loopback, each call after a barrier and a burst of "
        f"{BURST_GEMMS} 128x64x192 GEMMs (as a training step's collectives follow compute), "
        f"mean of {REPETITIONS} per size (slowest rank each), fit t = a + b*S"
    )
    efficiency, sources, clamped = {"p2p": 1.0}, {}, []

    def put(key, value, what):
        if value > MAX_EFFICIENCY:
            clamped.append(f"{key} {value:.3f}")
            value = MAX_EFFICIENCY
        efficiency[key] = value
        sources[f"busbw_efficiency.{key}"] = f"{source}: {what}"

    for f in fits:
        if f.collective == "p2p":
            continue
        factor = FACTORS[f.collective](f.ranks)
        put(_fit_key(f), factor / (rate * f.beta_s_per_byte),
            f"{f.collective} on {f.ranks} of {f.world_size} ranks, factor {factor:.3f} / "
            "(rate * b)")  # fmt: skip
    put("ring", efficiency[f"all_reduce_n{ranks}"], f"= all_reduce_n{ranks} (ring all-reduce)")
    put("alltoall", efficiency[f"all_to_all_n{ranks}"], f"= all_to_all_n{ranks}")
    sources["busbw_efficiency.p2p"] = "default: the link rate is the p2p fit itself"
    measured = collective_fit_specs(fits, ranks)
    if measured:
        sources["collective_fits"] = (
            f"{source}: each collective on groups of its group_size while {ranks} ranks ran "
            "(all groups at once), a = alpha_s, bytes_per_s = 1/b"
        )
    fits_text = "; ".join(
        f"{f.collective} {f.ranks} of {f.world_size}: a={f.alpha_s * 1e6:.1f} us, "
        f"S/t={f.algbw_bytes_per_s / 1e9:.2f} GB/s"
        for f in fits
    )
    return LinkTier(
        id="local-gloo",
        name=f"gloo over loopback TCP (one host, {ranks} ranks)",
        kind="host",
        bytes_per_s_per_direction=rate,
        latency_s=p2p.alpha_s,
        busbw_efficiency=efficiency,
        collective_fits=measured,
        notes=(
            "Mapping: collective_fits are the per-(op, group size) fits measured while "
            f"{ranks} ranks ran; the planner uses them instead of its ring/pairwise formulas. "
            "bytes_per_s_per_direction = 1/b and latency_s = a of the 2-rank p2p fit (used where "
            "no fit is listed); busbw_efficiency.<collective>_n<ranks>[_g<group>] = nccl-tests "
            "factor / (rate * b) of that fit (ring = all_reduce, alltoall = all_to_all on the "
            "whole world). "
            + (f"Clamped to {MAX_EFFICIENCY}: {', '.join(clamped)}. " if clamped else "")
            + "Fits: "
            + fits_text
        ),
        sources={
            "bytes_per_s_per_direction": f"{source}: 2-rank ping-pong, 1/b",
            "latency_s": f"{source}: 2-rank ping-pong, a",
            **sources,
        },
    )


def cluster_spec(accelerator: str, link: str, ranks: int, method: str) -> Cluster:
    source = f"measured: {method}, {ranks} processes on one host"
    return Cluster(
        id="local-cpu",
        name=f"this machine: {ranks} gloo ranks, one thread each",
        accelerator=accelerator,
        num_gpus=ranks,
        gpus_per_node=ranks,
        scale_up_domain_size=ranks,
        tiers=[ClusterTier(name="loopback", link=link, group_size=ranks)],
        notes="Written by llmplan calibrate; accelerator and link are the files beside this one.",
        sources={
            "num_gpus": source,
            "gpus_per_node": source,
            "scale_up_domain_size": source,
            "tiers.0": source + "; one loopback tier, no oversubscription",
        },
    )


def write_specs(calibration, out_path: Path):
    """Write cluster (``out_path``), accelerator and link TOMLs; the cluster names them by path.

    Each file is written whole (temporary file + rename): an interrupted calibration leaves
    the previous files or the new ones, never a truncated TOML.
    """
    from commands.outputs import write_text

    out_path = out_path.expanduser().resolve()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    stem = out_path.stem
    accelerator_path = out_path.with_name(f"{stem}-accelerator.toml")
    link_path = out_path.with_name(f"{stem}-link.toml")
    cluster = calibration.cluster.model_copy(
        update={
            "accelerator": str(accelerator_path),
            "tiers": [
                tier.model_copy(update={"link": str(link_path)})
                for tier in calibration.cluster.tiers
            ],
        }
    )
    header = f"# Measured by llmplan calibrate on {calibration.hostname} {calibration.date}.\n"
    write_text(accelerator_path, header + to_toml(calibration.accelerator.model_dump()))
    write_text(link_path, header + to_toml(calibration.link.model_dump()))
    write_text(out_path, header + to_toml(cluster.model_dump()))
    paths = {"cluster": str(out_path), "accelerator": str(accelerator_path), "link": str(link_path)}
    for ranks, accelerator in calibration.accelerators.items():
        sized = world_size_path(out_path, int(ranks))
        sized_accelerator = sized.with_name(f"{sized.stem}-accelerator.toml")
        write_text(sized_accelerator, header + to_toml(accelerator.model_dump()))
        update = {"accelerator": str(sized_accelerator)}
        if ranks in calibration.links:
            sized_link = sized.with_name(f"{sized.stem}-link.toml")
            write_text(sized_link, header + to_toml(calibration.links[ranks].model_dump()))
            update["tiers"] = [
                tier.model_copy(update={"link": str(sized_link)}) for tier in cluster.tiers
            ]
        sized_cluster = cluster.model_copy(update=update)
        write_text(sized, header + to_toml(sized_cluster.model_dump()))
        paths[f"cluster_n{ranks}"] = str(sized)
    return calibration.model_copy(update={"cluster": cluster, "paths": paths})


def world_size_path(cluster_path: str | Path, world_size: int) -> Path:
    """The cluster file calibrated under ``world_size`` concurrent ranks, beside the main one."""
    path = Path(cluster_path)
    return path.with_name(f"{path.stem}-n{world_size}{path.suffix}")


def _value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _key(key: str) -> str:
    bare = key.replace("_", "").replace("-", "").isalnum()
    return key if bare else json.dumps(key)


def to_toml(data: dict) -> str:
    """TOML for a spec: scalars first, then tables, then arrays of tables (None left out)."""
    lines, tables, arrays = [], [], []
    for key, value in data.items():
        if value is None:
            continue
        if isinstance(value, dict):
            tables.append((key, value))
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            arrays.append((key, value))
        else:
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, items in arrays:
        for item in items:
            lines += ["", f"[[{key}]]"]
            lines += [f"{_key(k)} = {_value(v)}" for k, v in item.items() if v is not None]
    for key, table in tables:
        lines += ["", f"[{key}]"]
        lines += [f"{_key(k)} = {_value(v)}" for k, v in table.items() if v is not None]
    return "\n".join(lines) + "\n"
