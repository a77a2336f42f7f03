"""Measure this machine and write it as a cluster spec the planner reads (``--cluster``).

What is measured, one thread per rank as the validation runs use:

* **GEMM FLOP/s** at the shapes of the validation workloads (Q/K/V/O, SwiGLU, LM head for one
  micro-batch), FP32 and BF16, ``torch.mm``, median of several repetitions;
* **attention** (``scaled_dot_product_attention``, causal, GQA, as the workloads call it),
  forward and backward of one sequence of each workload, FP32: FLOP/s on the planner's FLOP
  count (:func:`planner.cost.flops.attention_core_ops`, causal; the backward on 2.5× the
  forward's, FlashAttention's convention), the attention efficiencies the GPU catalog takes
  from FlashAttention's published figures;
* **memory bandwidth**: ``copy_`` of a 64 MiB tensor, read + write bytes over time;
* **host costs** of the eager framework (:mod:`validate.host_costs`): per dispatched
  operation (a tiny op mix, not one of the validated workloads), per DTensor operation, per
  pipeline action kind of torch's runtime, and the data-parallel wrappers' own time (FSDP2
  per wrapped unit, DDP per call); and per functional collective beyond the ``c10d`` call
  (:func:`measure_functional_overhead`);
* **collectives over gloo** for each world size: all-reduce, all-gather, reduce-scatter and
  all-to-all over message sizes (nccl-tests' sizes: the all-reduce buffer, the all-gather
  output, the reduce-scatter input, the all-to-all send buffer), and point-to-point
  ping-pong on 2 ranks. Each (collective, world size) gets its own fit ``t = α + β·S``
  (least squares on relative error); no ring factor is assumed, since gloo on loopback does
  not follow them (its reduce-scatter is an all-reduce plus a copy). Each timed call follows
  a fixed burst of compute (:func:`validate.timing.compute_burst`, about 1 ms) started together after a
  barrier, as a training step's collectives follow compute, and each size's time is the
  mean over :data:`validate.timing.REPETITIONS` calls of the slowest rank (a step pays the sum, so the
  long tail counts). Measured right after a barrier, the same calls took 2–5× less time
  than inside a training step (an all-to-all of 64 KiB on 2 ranks: 0.24–0.27 ms after a
  barrier, 0.29–1.43 ms after 1 ms of compute, three runs).

Compute figures are measured in the ranks of each world size at once (``n`` processes
sharing the machine's cores, as the validation runs do), as throughput over a time window,
so time-sharing shows; each world size gets its own accelerator and cluster file
(``<stem>-n<ranks>.toml``, which :func:`validate.compare.compare` picks per run).

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
from validate.host_costs import (
    measure_op_overhead,
    measure_pipeline_action_overheads,
    measure_sharded_op_overhead,
    measure_wrapper_overheads,
)
from validate.local_specs import accelerator_spec, cluster_spec, link_spec, write_specs
from validate.run import reap
from validate.spec import Workload
from validate.timing import compute_burst, throughput_seconds, timed_calls

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
MESSAGE_BYTES = (2**12, 2**15, 2**18, 2**20, 2**22)


class GemmPoint(BaseModel):
    what: str
    m: int
    k: int
    n: int
    dtype: str
    seconds: float
    flops_per_s: float


class AttentionPoint(BaseModel):
    """One workload's causal attention core, forward and backward (FP32, one thread)."""

    what: str
    heads: int
    kv_heads: int
    seq_len: int
    head_dim: int
    forward_flops: float
    forward_s: float
    backward_s: float

    @property
    def forward_flops_per_s(self) -> float:
        return self.forward_flops / self.forward_s

    @property
    def backward_flops_per_s(self) -> float:
        """On FlashAttention's backward count, 2.5× the forward's (:mod:`planner.cost.compute`)."""
        from planner.api import FLASH_BACKWARD_FLOPS_RATIO

        return FLASH_BACKWARD_FLOPS_RATIO * self.forward_flops / self.backward_s


class CollectiveFit(BaseModel):
    """``seconds ≈ alpha_s + beta_s_per_byte · bytes`` for one collective on groups of
    ``group_size`` ranks (all such groups at once) while ``world_size`` ranks run."""

    collective: str
    world_size: int
    group_size: int | None = None  # None: the whole world
    message_bytes: list[int]
    seconds: list[float]
    alpha_s: float
    beta_s_per_byte: float

    @property
    def algbw_bytes_per_s(self) -> float:
        return 1.0 / self.beta_s_per_byte

    @property
    def ranks(self) -> int:
        """Ranks in one group."""
        return self.group_size or self.world_size


class ClusterCalibration(BaseModel):
    """Everything measured, the specs built from it, and where they were written."""

    hostname: str
    date: str
    torch_version: str
    ranks: list[int]
    gemms: list[GemmPoint]
    attention: list[AttentionPoint] = []
    memory_bytes_per_s: float
    collectives: list[CollectiveFit]
    accelerator: Accelerator
    link: LinkTier
    cluster: Cluster
    #: Per world size (as a string key): the accelerator measured under that many ranks.
    accelerators: dict[str, Accelerator] = {}
    #: Per world size: the link with the collectives measured under that many ranks.
    links: dict[str, LinkTier] = {}
    op_overhead_s: dict[str, float] = {}
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
    fits, computes = [], {}
    for world_size in sorted(set(ranks) | {2}):
        world_fits, computes[world_size] = measure_world(world_size, workloads, timeout_s)
        fits.extend(world_fits)
    host, date = socket.gethostname(), datetime.date.today().isoformat()
    method = f"llmplan calibrate on {host} {date}"
    accelerators = {
        str(n): accelerator_spec(
            c.gemms,
            c.memory_bytes_per_s,
            n,
            method,
            c.op_overhead_s,
            c.attention,
            c.sharded_op_overhead_s,
            c.functional_collective_overhead_s,
            c.pipeline_action_overhead_s,
            c.data_parallel_overhead_s,
        )
        for n, c in computes.items()
        if n in ranks
    }
    largest = computes[max(ranks)]
    links = {str(n): link_spec(fits, n, method) for n in ranks}
    link = links[str(max(ranks))]
    calibration = ClusterCalibration(
        hostname=host,
        date=date,
        torch_version=torch.__version__,
        ranks=list(ranks),
        gemms=largest.gemms,
        attention=largest.attention,
        memory_bytes_per_s=largest.memory_bytes_per_s,
        collectives=fits,
        accelerator=accelerators[str(max(ranks))],
        link=link,
        cluster=cluster_spec("local-cpu-accelerator", "local-gloo", max(ranks), method),
        accelerators=accelerators,
        links=links,
        op_overhead_s={str(n): c.op_overhead_s for n, c in computes.items()},
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


def _no_sync() -> None:
    pass


def measure_gemms(workload: Workload, dtypes=("fp32", "bf16"), sync=_no_sync) -> list[GemmPoint]:
    """FLOP/s of each workload GEMM on one thread, per dtype (throughput over a window);
    ``sync`` (a barrier over the calibrating ranks) runs before each shape."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        points = []
        for what, m, k, n in workload_gemm_shapes(workload):
            for dtype in dtypes:
                torch_dtype = torch.float32 if dtype == "fp32" else torch.bfloat16
                a, b = torch.randn(m, k, dtype=torch_dtype), torch.randn(k, n, dtype=torch_dtype)
                sync()
                seconds = throughput_seconds(lambda a=a, b=b: torch.mm(a, b))
                points.append(
                    GemmPoint(what=f"{workload.name}.{what}", m=m, k=k, n=n, dtype=dtype,
                              seconds=seconds, flops_per_s=2 * m * k * n / seconds)
                )  # fmt: skip
        return points
    finally:
        torch.set_num_threads(threads)


def measure_attention(workload: Workload, sync=_no_sync) -> AttentionPoint:
    """Causal GQA attention of one sequence of ``workload`` at one thread, FP32: forward
    and backward seconds (throughput over a window; backward = forward + backward − forward).
    """
    import torch
    import torch.nn.functional as F

    from planner.api import attention_core_ops

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generator = torch.Generator().manual_seed(0)
        heads, kv, d = workload.num_attention_heads, workload.num_kv_heads, workload.head_dim

        def tensor(n: int) -> torch.Tensor:
            shape = (1, n, workload.seq_len, d)
            return torch.randn(*shape, generator=generator).requires_grad_()

        q, k, v = tensor(heads), tensor(kv), tensor(kv)
        grad = torch.randn(1, heads, workload.seq_len, d, generator=generator)

        def forward():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        def forward_backward():
            torch.autograd.backward(forward(), grad)
            q.grad = k.grad = v.grad = None

        sync()
        with torch.no_grad():
            forward_s = throughput_seconds(forward)
        sync()
        both_s = throughput_seconds(forward_backward)
        flops = sum(
            op.forward
            for op in attention_core_ops(workload.model_spec(), workload.seq_len, 1, causal=True)
        )
        return AttentionPoint(
            what=f"{workload.name}.attention", heads=heads, kv_heads=kv, seq_len=workload.seq_len,
            head_dim=d, forward_flops=flops, forward_s=forward_s,
            backward_s=max(both_s - forward_s, 1e-9),
        )  # fmt: skip
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
        return 2 * num_bytes / throughput_seconds(lambda: dst.copy_(src))
    finally:
        torch.set_num_threads(threads)


class ComputeMeasurement(BaseModel):
    """One world size's compute figures, from its slowest rank."""

    world_size: int
    gemms: list[GemmPoint]
    attention: list[AttentionPoint] = []
    memory_bytes_per_s: float
    op_overhead_s: float
    sharded_op_overhead_s: float | None = None
    functional_collective_overhead_s: float | None = None
    pipeline_action_overhead_s: dict[str, float] = {}
    data_parallel_overhead_s: dict[str, float] = {}


def measure_compute(workloads: tuple[Workload, ...], sync=_no_sync) -> dict:
    """This process's GEMMs (BF16 on the first workload only: slow without AMX), copy
    bandwidth and per-operation overhead, as JSON-ready data.

    ``sync`` (a barrier over the calibrating ranks) runs before each measurement, so every
    rank measures the same thing at the same time: without it a rank that finished early
    waits idle in the next barrier and the last ones measure on freed cores (with 4 ranks
    on 2 cores the per-operation overhead then came out as on 2 ranks, half the real one).
    """
    gemms = [
        point
        for i, w in enumerate(workloads)
        for point in measure_gemms(w, ("fp32", "bf16") if i == 0 else ("fp32",), sync)
    ]
    attention = [measure_attention(w, sync) for w in workloads]
    sync()
    memory_bytes_per_s = measure_memory_bandwidth()
    sync()
    return {
        "gemms": [g.model_dump() for g in gemms],
        "attention": [a.model_dump() for a in attention],
        "memory_bytes_per_s": memory_bytes_per_s,
        "op_overhead_s": measure_op_overhead(),
    }


def slowest_rank(world_size: int, per_rank: list[dict]) -> ComputeMeasurement:
    """The figures a step waits for: each GEMM's and the bandwidth's slowest rank, the
    largest per-operation overhead."""
    gemms = [
        min((GemmPoint(**rank["gemms"][i]) for rank in per_rank), key=lambda g: g.flops_per_s)
        for i in range(len(per_rank[0]["gemms"]))
    ]
    attention = [  # each workload's slowest rank, by its backward (the larger share)
        max((AttentionPoint(**rank["attention"][i]) for rank in per_rank),
            key=lambda a: a.forward_s + a.backward_s)
        for i in range(len(per_rank[0]["attention"]))
    ]  # fmt: skip
    return ComputeMeasurement(
        world_size=world_size,
        gemms=gemms,
        attention=attention,
        memory_bytes_per_s=min(rank["memory_bytes_per_s"] for rank in per_rank),
        op_overhead_s=max(rank["op_overhead_s"] for rank in per_rank),
        sharded_op_overhead_s=max(rank["sharded_op_overhead_s"] for rank in per_rank),
        functional_collective_overhead_s=max(
            rank["functional_collective_overhead_s"] for rank in per_rank
        ),
        data_parallel_overhead_s={
            key: max(rank["data_parallel_overhead_s"][key] for rank in per_rank)
            for key in per_rank[0].get("data_parallel_overhead_s", {})
        },
        pipeline_action_overhead_s={  # each kind from the ranks that measured it
            kind: max(
                rank["pipeline_action_overhead_s"][kind]
                for rank in per_rank
                if kind in rank.get("pipeline_action_overhead_s", {})
            )
            for kind in sorted(
                {k for rank in per_rank for k in rank.get("pipeline_action_overhead_s", {})}
            )
        },
    )


def measure_world(
    world_size: int, workloads: tuple[Workload, ...], timeout_s: float = 180.0
) -> tuple[list[CollectiveFit], ComputeMeasurement]:
    """Spawn ``world_size`` gloo ranks; all measure compute at once, then time every
    collective (and p2p on 2). Returns the collective fits and the compute figures."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    reports = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="llmplan-calibrate-") as tmp:
        context = mp.start_processes(
            _collective_rank,
            args=(
                world_size,
                os.path.join(tmp, "rendezvous"),
                reports,
                timeout_s,
                [w.model_dump_json() for w in workloads],
            ),
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
            reap(context.processes)
    if len(per_rank) < world_size:
        raise RuntimeError(f"calibration on {world_size} ranks did not finish in {timeout_s:.0f} s")
    compute = slowest_rank(world_size, [per_rank[r].pop("compute") for r in sorted(per_rank)])
    fits = []
    names = sorted({key.rsplit("@", 1)[0] for key in per_rank[0]})
    for name in names:
        collective, _, group = name.partition("/")
        sizes = sorted(int(k.rsplit("@", 1)[1]) for k in per_rank[0] if k.rsplit("@", 1)[0] == name)
        seconds = []
        for size in sizes:
            reps = zip(*(per_rank[r][f"{name}@{size}"] for r in per_rank), strict=True)
            # The mean, not the median: a step pays the sum of its collectives, and on
            # this machine their latency has a long tail.
            seconds.append(statistics.fmean(max(rep) for rep in reps))
        alpha, beta = fit_alpha_beta(sizes, seconds)
        fits.append(
            CollectiveFit(collective=collective, world_size=world_size,
                          group_size=int(group) if group else None, message_bytes=sizes,
                          seconds=seconds, alpha_s=alpha, beta_s_per_byte=beta)
        )  # fmt: skip
    return fits, compute


def _collective_rank(
    rank: int, world_size: int, init_file: str, reports, timeout_s: float, workloads_json=()
):
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
        pairs = pair_groups(world_size)
        burst = compute_burst()
        workloads = tuple(Workload.model_validate_json(w) for w in workloads_json)
        compute = measure_compute(workloads, dist.barrier) if workloads else None
        if compute is not None:
            dist.barrier()
            compute["sharded_op_overhead_s"] = measure_sharded_op_overhead(
                compute["op_overhead_s"], world_size
            )
            dist.barrier()
            compute["pipeline_action_overhead_s"] = measure_pipeline_action_overheads(
                world_size, compute["op_overhead_s"]
            )
            dist.barrier()
            compute["data_parallel_overhead_s"] = measure_wrapper_overheads(
                compute["op_overhead_s"]
            )
        times: dict[str, object] = {}
        for size in MESSAGE_BYTES:
            calls = collective_calls(size, world_size)
            if pairs is not None:  # groups of 2 inside the world, all pairs at once
                calls.update(
                    {f"{name}/2": call for name, call in collective_calls(size, 2, pairs).items()}
                )
            if world_size == 2:
                full = torch.ones(size // 4)
                calls["p2p"] = lambda full=full: _ping_pong(full, rank)
            for name, call in calls.items():
                # as in a training step: each call follows compute
                samples = timed_calls(call, dist.barrier, burst)
                if name == "p2p":
                    samples = [t / 2 for t in samples]  # one way of a round trip
                times[f"{name}@{size}"] = samples
        if compute is not None:
            compute["functional_collective_overhead_s"] = measure_functional_overhead()
        dist.barrier()
        reports.put(("ok", rank, json.dumps({**times, "compute": compute})))
        dist.destroy_process_group()
    except BaseException:
        reports.put(("error", rank, traceback.format_exc()))
        raise SystemExit(1) from None


def measure_functional_overhead(size: int = MESSAGE_BYTES[0]) -> float:
    """Extra seconds of a collective issued through torch's functional collectives (as
    DTensor redistributes) over the same ``c10d`` call: the median over all-gather,
    reduce-scatter and all-reduce of ``size`` bytes on the whole world, each the median of
    :data:`validate.timing.REPETITIONS` (a barrier before every call), of (functional − c10d)."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    world = dist.get_world_size()
    group = dist.group.WORLD
    full, part = torch.ones(size // 4), torch.ones(size // 4 // world)
    functional = {
        "all_reduce": lambda: funcol.wait_tensor(funcol.all_reduce(full, "sum", group)),
        "all_gather": lambda: funcol.wait_tensor(funcol.all_gather_tensor(part, 0, group)),
        "reduce_scatter": lambda: funcol.wait_tensor(
            funcol.reduce_scatter_tensor(full, "sum", 0, group)
        ),
    }
    plain = collective_calls(size, world)
    extra = []
    for name, call in functional.items():
        seconds = {}
        for kind, fn in (("functional", call), ("c10d", plain[name])):
            seconds[kind] = statistics.median(timed_calls(fn, dist.barrier))
        extra.append(seconds["functional"] - seconds["c10d"])
    return max(statistics.median(extra), 0.0)


def pair_groups(world_size: int):
    """This rank's group of two (ranks 2i, 2i+1) when the world has more than two ranks:
    the 2-rank groups of a 2-D layout (FSDP × TP) run while the other ranks run theirs."""
    import torch.distributed as dist

    if world_size <= 2 or world_size % 2:
        return None
    mine = None
    for first in range(0, world_size, 2):
        group = dist.new_group([first, first + 1])
        if dist.get_rank() in (first, first + 1):
            mine = group
    return mine


def collective_calls(size: int, group_size: int, group=None) -> dict:
    """The four collectives on a message of ``size`` bytes (nccl-tests' S) over ``group``."""
    import torch
    import torch.distributed as dist

    full = torch.ones(size // 4)
    part = torch.ones(size // 4 // group_size)
    return {
        "all_reduce": lambda: dist.all_reduce(full, group=group),
        "all_gather": lambda: dist.all_gather_into_tensor(full, part, group=group),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full, group=group),
        "all_to_all": lambda: dist.all_to_all_single(torch.empty_like(full), full, group=group),
    }


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
