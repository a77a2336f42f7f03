"""Measure this machine and write it as a cluster spec the planner reads (``--cluster``).

What is measured, one thread per rank as the validation runs use:

* **GEMM FLOP/s** at the shapes of the validation workloads (Q/K/V/O, SwiGLU, LM head for one
  micro-batch), FP32 and BF16, ``torch.mm``, median of several repetitions;
* **memory bandwidth**: ``copy_`` of a 64 MiB tensor, read + write bytes over time;
* **collectives over gloo** for each world size: all-reduce, all-gather, reduce-scatter and
  all-to-all over message sizes (nccl-tests' sizes: the all-reduce buffer, the all-gather
  output, the reduce-scatter input, the all-to-all send buffer), and point-to-point
  ping-pong on 2 ranks. Each (collective, world size) gets its own fit ``t = α + β·S``
  (least squares on relative error); no ring factor is assumed, since gloo on loopback does
  not follow them (its reduce-scatter is an all-reduce plus a copy).

The spec: an accelerator ``local-cpu`` (one core = one rank), a link tier ``local-gloo`` and
a cluster ``local-cpu`` with one loopback tier over all ranks; the two spec files are
written next to the cluster file, which names them by absolute path. How the fits map onto
the link schema is in the link's ``notes`` (see :func:`link_spec`).
"""

from __future__ import annotations

import datetime
import json
import os
import queue as queue_module
import socket
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from hwspecs.schema import Accelerator, Cluster, LinkTier
from validate.local_specs import accelerator_spec, cluster_spec, link_spec, write_specs
from validate.spec import Workload

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
MESSAGE_BYTES = (2**12, 2**15, 2**18, 2**20, 2**22)
REPETITIONS = 5


class GemmPoint(BaseModel):
    what: str
    m: int
    k: int
    n: int
    dtype: str
    seconds: float
    flops_per_s: float


class CollectiveFit(BaseModel):
    """``seconds ≈ alpha_s + beta_s_per_byte · bytes`` for one collective on ``world_size`` ranks."""

    collective: str
    world_size: int
    message_bytes: list[int]
    seconds: list[float]
    alpha_s: float
    beta_s_per_byte: float

    @property
    def algbw_bytes_per_s(self) -> float:
        return 1.0 / self.beta_s_per_byte


class ClusterCalibration(BaseModel):
    """Everything measured, the specs built from it, and where they were written."""

    hostname: str
    date: str
    torch_version: str
    ranks: list[int]
    gemms: list[GemmPoint]
    memory_bytes_per_s: float
    collectives: list[CollectiveFit]
    accelerator: Accelerator
    link: LinkTier
    cluster: Cluster
    paths: dict[str, str] = {}

    def fit(self, collective: str, world_size: int) -> CollectiveFit | None:
        return next(
            (
                f
                for f in self.collectives
                if (f.collective, f.world_size) == (collective, world_size)
            ),
            None,
        )


def calibrate(
    ranks: tuple[int, ...] = (2, 4),
    out_path: str | Path | None = None,
    workloads: tuple[Workload, ...] | None = None,
    timeout_s: float = 180.0,
) -> ClusterCalibration:
    """Measure GEMMs, memory bandwidth and gloo collectives; write the three spec files.

    ``out_path`` is the cluster TOML (accelerator and link go beside it); without one the
    files go to a fresh temporary directory, so the returned cluster always loads.
    """
    import torch

    from validate.run import SMALL, TINY

    workloads = workloads or (TINY, SMALL)
    # BF16 GEMMs are slow on CPUs without AMX; the smallest workload's shapes suffice.
    gemms = [
        point
        for i, w in enumerate(workloads)
        for point in measure_gemms(w, ("fp32", "bf16") if i == 0 else ("fp32",))
    ]
    bandwidth = measure_memory_bandwidth()
    fits = []
    for world_size in sorted(set(ranks) | {2}):
        fits.extend(measure_collectives(world_size, timeout_s))
    host, date = socket.gethostname(), datetime.date.today().isoformat()
    method = f"llmplan calibrate on {host} {date}"
    accelerator = accelerator_spec(gemms, bandwidth, max(ranks), method)
    link = link_spec(fits, max(ranks), method)
    calibration = ClusterCalibration(
        hostname=host,
        date=date,
        torch_version=torch.__version__,
        ranks=list(ranks),
        gemms=gemms,
        memory_bytes_per_s=bandwidth,
        collectives=fits,
        accelerator=accelerator,
        link=link,
        cluster=cluster_spec("local-cpu-accelerator", "local-gloo", max(ranks), method),
    )
    if out_path is None:
        out_path = Path(tempfile.mkdtemp(prefix="llmplan-cluster-")) / "local-cpu.toml"
    return write_specs(calibration, Path(out_path))


# ----- measurements ------------------------------------------------------------------------


def workload_gemm_shapes(
    workload: Workload, tokens: int | None = None
) -> list[tuple[str, int, int, int]]:
    """(what, M, K, N) of the forward GEMMs of one micro-batch of ``workload``."""
    h, f, d = workload.hidden_size, workload.ffn_hidden_size, workload.head_dim
    m = tokens or workload.seq_len
    return [
        ("qkv", m, h, (workload.num_attention_heads + 2 * workload.num_kv_heads) * d),
        ("attention_out", m, workload.num_attention_heads * d, h),
        ("mlp_up", m, h, f),
        ("mlp_down", m, f, h),
        ("lm_head", m, h, workload.vocab_size),
    ]


def _median_seconds(fn, repetitions: int = REPETITIONS) -> float:
    fn()
    times = []
    for _ in range(repetitions):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_gemms(workload: Workload, dtypes=("fp32", "bf16")) -> list[GemmPoint]:
    """FLOP/s of each workload GEMM on one thread, per dtype."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        points = []
        for what, m, k, n in workload_gemm_shapes(workload):
            for dtype in dtypes:
                torch_dtype = torch.float32 if dtype == "fp32" else torch.bfloat16
                a, b = torch.randn(m, k, dtype=torch_dtype), torch.randn(k, n, dtype=torch_dtype)
                seconds = _median_seconds(lambda a=a, b=b: torch.mm(a, b))
                points.append(
                    GemmPoint(what=f"{workload.name}.{what}", m=m, k=k, n=n, dtype=dtype,
                              seconds=seconds, flops_per_s=2 * m * k * n / seconds)
                )  # fmt: skip
        return points
    finally:
        torch.set_num_threads(threads)


def measure_memory_bandwidth(num_bytes: int = 64 * 2**20) -> float:
    """Bytes/s of one thread copying a tensor (read + write)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.ones(num_bytes // 4)
        dst = torch.empty_like(src)
        return 2 * num_bytes / _median_seconds(lambda: dst.copy_(src))
    finally:
        torch.set_num_threads(threads)


def measure_collectives(world_size: int, timeout_s: float = 180.0) -> list[CollectiveFit]:
    """Spawn ``world_size`` gloo ranks, time every collective (and p2p on 2), fit each."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    reports = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="llmplan-calibrate-") as tmp:
        context = mp.start_processes(
            _collective_rank,
            args=(world_size, os.path.join(tmp, "rendezvous"), reports, timeout_s),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        per_rank, deadline = {}, time.perf_counter() + timeout_s
        try:
            while len(per_rank) < world_size and time.perf_counter() < deadline:
                try:
                    status, rank, payload = reports.get(timeout=0.2)
                except queue_module.Empty:
                    continue
                if status != "ok":
                    raise RuntimeError(f"calibration rank {rank} failed:\n{payload}")
                per_rank[rank] = json.loads(payload)
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            for process in context.processes:
                process.join(timeout=10)
    if len(per_rank) < world_size:
        raise RuntimeError(f"calibration on {world_size} ranks did not finish in {timeout_s:.0f} s")
    fits = []
    names = sorted({key.rsplit("@", 1)[0] for key in per_rank[0]})
    for name in names:
        sizes = sorted(int(k.rsplit("@", 1)[1]) for k in per_rank[0] if k.rsplit("@", 1)[0] == name)
        seconds = []
        for size in sizes:
            reps = zip(*(per_rank[r][f"{name}@{size}"] for r in per_rank), strict=True)
            seconds.append(statistics.median(max(rep) for rep in reps))
        alpha, beta = fit_alpha_beta(sizes, seconds)
        fits.append(
            CollectiveFit(collective=name, world_size=world_size, message_bytes=sizes,
                          seconds=seconds, alpha_s=alpha, beta_s_per_byte=beta)
        )  # fmt: skip
    return fits


def _collective_rank(rank: int, world_size: int, init_file: str, reports, timeout_s: float):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import traceback
    import warnings

    warnings.simplefilter("ignore", FutureWarning)  # reduce_scatter_tensor's rename
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        times: dict[str, list[float]] = {}
        for size in MESSAGE_BYTES:
            elements = size // 4
            full = torch.ones(elements)
            part = torch.ones(elements // world_size)
            calls = {
                "all_reduce": lambda full=full: dist.all_reduce(full),
                "all_gather": lambda full=full, part=part: dist.all_gather_into_tensor(full, part),
                "reduce_scatter": lambda full=full, part=part: dist.reduce_scatter_tensor(
                    part, full
                ),
                "all_to_all": lambda full=full: dist.all_to_all_single(
                    torch.empty_like(full), full
                ),
            }
            if world_size == 2:
                calls["p2p"] = lambda full=full: _ping_pong(full, rank)
            for name, call in calls.items():
                call()
                samples = []
                for _ in range(REPETITIONS):
                    dist.barrier()
                    start = time.perf_counter()
                    call()
                    samples.append(time.perf_counter() - start)
                if name == "p2p":
                    samples = [t / 2 for t in samples]  # one way of a round trip
                times[f"{name}@{size}"] = samples
        dist.barrier()
        reports.put(("ok", rank, json.dumps(times)))
        dist.destroy_process_group()
    except BaseException:
        reports.put(("error", rank, traceback.format_exc()))
        raise SystemExit(1) from None


def _ping_pong(tensor, rank: int) -> None:
    import torch.distributed as dist

    if rank == 0:
        dist.send(tensor, 1)
        dist.recv(tensor, 1)
    else:
        dist.recv(tensor, 0)
        dist.send(tensor, 0)


def fit_alpha_beta(sizes, seconds) -> tuple[float, float]:
    """Least-squares ``t = α + β·S`` on relative error, with ``α ≥ 0`` and ``β > 0``."""
    s, t = np.asarray(sizes, dtype=float), np.asarray(seconds, dtype=float)
    design = np.stack([np.ones_like(s), s], axis=1) / t[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(s), rcond=None)
    if alpha < 0 or beta <= 0:
        alpha = max(alpha, 0.0)
        beta = float(np.sum((s / t) * (1 - alpha / t)) / np.sum((s / t) ** 2))
    return float(alpha), float(max(beta, 1e-15))
