"""Measure this machine and write it as a cluster spec the planner reads (``--cluster``).

What is measured, one thread per rank as the validation runs use:

* **GEMM FLOP/s** at the shapes of the validation workloads (Q/K/V/O, SwiGLU, LM head for one
  micro-batch), FP32 and BF16, ``torch.mm``, median of several repetitions;
* **attention** (``scaled_dot_product_attention``, causal, GQA, as the workloads call it),
  forward and backward of one sequence of each workload, FP32: FLOP/s on the planner's FLOP
  count (:func:`planner.flops.attention_core_ops`, causal; the backward on 2.5× the
  forward's, FlashAttention's convention), the attention efficiencies the GPU catalog takes
  from FlashAttention's published figures;
* **memory bandwidth**: ``copy_`` of a 64 MiB tensor, read + write bytes over time;
* **pipeline runtime overhead** per action kind (forward, full backward, input and weight
  gradient) of torch's pipeline schedules (:func:`measure_pipeline_action_overheads`);
* **DTensor and functional-collective overheads** (:func:`measure_sharded_op_overhead`,
  :func:`measure_functional_overhead`) and the **data-parallel wrappers'** own host time
  (FSDP2 per wrapped unit, DDP per call: :func:`measure_wrapper_overheads`);
* **per-operation overhead**: forward, backward and AdamW step of a tiny op mix
  (:class:`OpMix`: linears, a norm, SwiGLU, attention, cross-entropy at negligible FLOPs,
  not one of the validated workloads) over the ATen operations it dispatches, counted with a
  ``TorchDispatchMode``: the fixed host cost :mod:`planner.op_counts` multiplies;
* **collectives over gloo** for each world size: all-reduce, all-gather, reduce-scatter and
  all-to-all over message sizes (nccl-tests' sizes: the all-reduce buffer, the all-gather
  output, the reduce-scatter input, the all-to-all send buffer), and point-to-point
  ping-pong on 2 ranks. Each (collective, world size) gets its own fit ``t = α + β·S``
  (least squares on relative error); no ring factor is assumed, since gloo on loopback does
  not follow them (its reduce-scatter is an all-reduce plus a copy). Each timed call follows
  a fixed burst of compute (:func:`compute_burst`, about 1 ms) started together after a
  barrier, as a training step's collectives follow compute, and each size's time is the
  mean over :data:`REPETITIONS` calls of the slowest rank (a step pays the sum, so the
  long tail counts): measured right after a barrier,
  the same calls took 2–5× less time than they do inside the validation steps (an
  all-to-all of 64 KiB on 2 ranks: 0.24–0.27 ms after a barrier, 0.29–1.43 ms after 1 ms of
  compute, three runs), so barrier-aligned fits under-predicted every layout.

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
from validate.local_specs import accelerator_spec, cluster_spec, link_spec, write_specs
from validate.spec import Workload

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
MESSAGE_BYTES = (2**12, 2**15, 2**18, 2**20, 2**22)
REPETITIONS = 15


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
        """On FlashAttention's backward count, 2.5× the forward's (:mod:`planner.compute`)."""
        from planner.compute import FLASH_BACKWARD_FLOPS_RATIO

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


#: Seconds each throughput sample runs for: long against the scheduler's time slices, so
#: ranks sharing a core show their share (a single short call would not).
WINDOW_S = 0.03


def _throughput_seconds(fn, window_s: float = WINDOW_S, repetitions: int = 3) -> float:
    """Seconds per call of ``fn``: calls over a window of ``window_s``, median of samples."""
    fn()
    samples = []
    for _ in range(repetitions):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= window_s:
                break
        samples.append(elapsed / calls)
    return statistics.median(samples)


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
                seconds = _throughput_seconds(lambda a=a, b=b: torch.mm(a, b))
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

    from planner.flops import attention_core_ops

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
            forward_s = _throughput_seconds(forward)
        sync()
        both_s = _throughput_seconds(forward_backward)
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
        return 2 * num_bytes / _throughput_seconds(lambda: dst.copy_(src))
    finally:
        torch.set_num_threads(threads)


def op_mix():
    """A tiny training step of common operations at negligible FLOPs: (step, model).

    RMSNorm, a SwiGLU MLP, causal attention, a residual, an output linear with
    cross-entropy, backward, and AdamW (``foreach=False``) with ``zero_grad(set_to_none=
    False)`` — the operation kinds the workloads dispatch, on (2, 4, 8) tensors.
    """
    import torch
    import torch.nn.functional as F
    from torch import nn

    class OpMix(nn.Module):
        def __init__(self, d: int = 8):
            super().__init__()
            self.gate = nn.Linear(d, 2 * d, bias=False)
            self.up = nn.Linear(d, 2 * d, bias=False)
            self.down = nn.Linear(2 * d, d, bias=False)
            self.norm = nn.Parameter(torch.ones(d))
            self.out = nn.Linear(d, 16, bias=False)

        def forward(self, x, labels):
            normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.norm
            h = x + self.down(F.silu(self.gate(normed)) * self.up(normed))
            q = h.view(2, 4, 2, 4).transpose(1, 2)
            attended = F.scaled_dot_product_attention(q, q, q, is_causal=True)
            h = h + attended.transpose(1, 2).reshape(2, 4, 8)
            return F.cross_entropy(self.out(h).flatten(0, 1), labels.flatten())

    generator = torch.Generator().manual_seed(0)
    model = OpMix()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    x = torch.randn(2, 4, 8, generator=generator)
    labels = torch.randint(16, (2, 4), generator=generator)

    def step() -> None:
        model(x, labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)

    return step, model


def count_dispatched_ops(fn) -> int:
    """ATen operations ``fn`` dispatches (every call a ``TorchDispatchMode`` sees)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Counter.count += 1
            return func(*args, **(kwargs or {}))

    with Counter():
        fn()
    return Counter.count


def measure_sharded_op_overhead(op_overhead_s: float, world_size: int) -> float:
    """Seconds per DTensor operation: AdamW (``foreach=False``) steps and ``zero_grad`` on
    ``Shard(0)`` DTensor parameters over all ranks (no communication), the step's time less
    its plain operations at ``op_overhead_s``, over its DTensor operations."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    from torch.utils._python_dispatch import TorchDispatchMode

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        generator = torch.Generator().manual_seed(0)
        params = []
        for _ in range(8):
            whole = torch.randn(4 * world_size, 8, generator=generator)
            param = torch.nn.Parameter(distribute_tensor(whole, mesh, [Shard(0)]))
            param.grad = distribute_tensor(torch.randn_like(whole), mesh, [Shard(0)])
            params.append(param)
        optimizer = torch.optim.AdamW(params, lr=1e-3, foreach=False)

        def step() -> None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)

        counts = {"dtensor": 0, "plain": 0}

        class Counter(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                flat = [*args, *(kwargs or {}).values()]
                counts["dtensor" if any(isinstance(a, DTensor) for a in flat) else "plain"] += 1
                return func(*args, **(kwargs or {}))

        for _ in range(3):
            step()
        with Counter():
            step()
        seconds = _throughput_seconds(step, window_s=0.1)
        plain, dtensor = counts["plain"], counts["dtensor"]
        return max(seconds - plain * op_overhead_s, 0.0) / dtensor
    finally:
        torch.set_num_threads(threads)


#: The reference layer at negligible size: one per pipeline stage for the action overheads.
PIPELINE_PROBE = Workload(
    name="pipeline-probe", num_layers=2, hidden_size=8, ffn_hidden_size=16,
    num_attention_heads=2, num_kv_heads=1, vocab_size=16, seq_len=4,
)  # fmt: skip
#: (schedule, chunks per rank) the action overheads are measured on: full backward, split.
PIPELINE_PROBE_SCHEDULES = (("1f1b", 1), ("zbv", 2))


def measure_pipeline_action_overheads(
    world_size: int, op_overhead_s: float, steps: int = 5
) -> dict[str, float]:
    """Host seconds torch's pipeline runtime spends per action beyond its operations:
    ``forward``, ``backward`` (full), ``input_grad`` and ``weight_grad`` (split backward).

    A pipeline over all ranks of the reference layer at negligible size (one layer per
    stage) runs 1F1B and ZBV with 2·ranks micro-batches; each action's duration
    (:class:`validate.instrument.ActionRecorder`) less its dispatched operations (counted
    per stage and kind) at ``op_overhead_s``, the median over the actions that wait for no
    peer: forwards of the first stage, backwards of the last, every weight gradient.
    """
    import torch

    from planner.layout import Layout
    from validate.spec import RunSpec
    from validate.workloads.mesh import build_groups
    from validate.workloads.train import build_trainer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    extra: dict[str, list[float]] = {}
    kinds = {"F": "forward", "BW": "backward", "B": "input_grad", "W": "weight_grad"}
    try:
        for schedule, chunks in PIPELINE_PROBE_SCHEDULES:
            m = 2 * world_size
            workload = PIPELINE_PROBE.model_copy(update={"num_layers": world_size * chunks})
            layout = Layout(pp=world_size, vpp=chunks, schedule=schedule, num_microbatches=m,
                            zero_stage=0)  # fmt: skip
            spec = RunSpec(name=f"probe-{schedule}", workload=workload, layout=layout)
            trainer = build_trainer(spec, build_groups(layout, "cpu"), torch.device("cpu"))
            last = world_size * chunks - 1
            counter = _action_op_counter()
            for stage in trainer.stages:
                _label_actions(stage, counter.label)
            for step in range(3):
                trainer.step(step)
            with counter:
                trainer.step(3)
            ops = counter.ops
            for step in range(steps):
                trainer.recorder.events.clear()
                trainer.step(4 + step)
                for event in trainer.recorder.events:
                    kind, stage = event["kind"], event["stage"]
                    waits = (kind == "F" and stage != 0) or (kind in ("B", "BW") and stage != last)
                    if waits:
                        continue
                    seconds = event["end_s"] - event["start_s"]
                    dispatched = ops.get((stage, kind), 0) / m
                    extra.setdefault(kinds[kind], []).append(seconds - dispatched * op_overhead_s)
    finally:
        torch.set_num_threads(threads)
    return {kind: max(statistics.median(values), 0.0) for kind, values in extra.items()}


def _action_op_counter():
    from torch.utils._python_dispatch import TorchDispatchMode

    class ActionOpCounter(TorchDispatchMode):
        """Operations dispatched while each (stage, kind) action runs (``label[0]``)."""

        def __init__(self):
            super().__init__()
            self.label: list[tuple[int, str] | None] = [None]
            self.ops: dict[tuple[int, str], int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if self.label[0] is not None:
                self.ops[self.label[0]] = self.ops.get(self.label[0], 0) + 1
            return func(*args, **(kwargs or {}))

    return ActionOpCounter()


def _label_actions(stage, label: list) -> None:
    """Make ``label[0]`` (stage, kind) while one of ``stage``'s compute actions runs."""
    methods = {"forward_one_chunk": "F", "backward_one_chunk": None,
               "backward_weight_one_chunk": "W"}  # fmt: skip
    for name, kind in methods.items():
        inner = getattr(stage, name)

        def labelled(*args, inner=inner, kind=kind, **kwargs):
            if kind is None:  # full or split backward, as the recorder names them
                full = kwargs.get("full_backward", args[2] if len(args) > 2 else True)
                kind = "BW" if full else "B"
            previous, label[0] = label[0], (stage.stage_index, kind)
            try:
                return inner(*args, **kwargs)
            finally:
                label[0] = previous

        setattr(stage, name, labelled)


#: The reference model at negligible size, wrapped per layer: data-parallel wrapper costs.
WRAPPER_PROBE = PIPELINE_PROBE.model_copy(update={"name": "wrapper-probe", "num_layers": 4})


def measure_wrapper_overheads(op_overhead_s: float, steps: int = 20) -> dict[str, float]:
    """Host seconds a data-parallel wrapper spends beyond the operations it dispatches:
    FSDP2 per wrapped unit (each layer and the root) and DDP per call, each in forward and
    in backward (``fsdp_unit_forward``, ``fsdp_unit_backward``, ``ddp_forward``,
    ``ddp_backward``).

    Each rank wraps :data:`WRAPPER_PROBE` over a group of itself alone, so no collective
    moves data (their cost is the link's): the wrapped pass's median time less the plain
    pass's, less the operations the wrapper adds (counted) at ``op_overhead_s``.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from validate.workloads.model import build_model, cross_entropy, synthetic_batch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        alone = [dist.new_group([r]) for r in range(dist.get_world_size())][dist.get_rank()]
        tokens, labels = synthetic_batch(WRAPPER_PROBE, 2, 0)
        measured = {}
        for kind in ("plain", "ddp", "fsdp"):
            model = build_model(WRAPPER_PROBE)
            if kind == "ddp":
                model = DistributedDataParallel(model, process_group=alone)
            elif kind == "fsdp":
                mesh = DeviceMesh.from_group(alone, "cpu")
                for layer in model.layers.values():
                    fully_shard(layer, mesh=mesh)
                fully_shard(model, mesh=mesh)
            held = {}

            def forward(model=model, held=held):
                held["loss"] = cross_entropy(model(tokens), labels)

            def backward(held=held):
                held["loss"].backward()

            for _ in range(3):
                forward()
                backward()
            ops = (count_dispatched_ops(forward), count_dispatched_ops(backward))
            seconds = ([], [])
            for _ in range(steps):
                for i, fn in enumerate((forward, backward)):
                    start = time.perf_counter()
                    fn()
                    seconds[i].append(time.perf_counter() - start)
            measured[kind] = [(statistics.median(t), n) for t, n in zip(seconds, ops, strict=True)]
    finally:
        torch.set_num_threads(threads)

    def extra(kind: str, index: int, calls: int) -> float:
        (seconds, ops), (plain_s, plain_ops) = measured[kind][index], measured["plain"][index]
        return max(seconds - plain_s - (ops - plain_ops) * op_overhead_s, 0.0) / calls

    units = WRAPPER_PROBE.num_layers + 1  # each layer and the root
    return {
        "fsdp_unit_forward": extra("fsdp", 0, units),
        "fsdp_unit_backward": extra("fsdp", 1, units),
        "ddp_forward": extra("ddp", 0, 1),
        "ddp_backward": extra("ddp", 1, 1),
    }


def measure_op_overhead() -> float:
    """Seconds per dispatched operation: the op mix's step time over its operation count."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        step, _ = op_mix()
        for _ in range(3):
            step()
        ops = count_dispatched_ops(step)
        return _throughput_seconds(step, window_s=0.1) / ops
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
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            for process in context.processes:
                process.join(timeout=10)
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
                call()
                samples = []
                for _ in range(REPETITIONS):
                    dist.barrier()
                    burst()  # as in a training step: the call follows compute
                    start = time.perf_counter()
                    call()
                    samples.append(time.perf_counter() - start)
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
    :data:`REPETITIONS` (a barrier before every call), of (functional − c10d)."""
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
            fn()
            samples = []
            for _ in range(REPETITIONS):
                dist.barrier()
                start = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - start)
            seconds[kind] = statistics.median(samples)
        extra.append(seconds["functional"] - seconds["c10d"])
    return max(statistics.median(extra), 0.0)


#: GEMMs of the compute burst before each timed collective: about 1 ms at one thread.
BURST_GEMMS = 20


def compute_burst():
    """A fixed amount of compute (``BURST_GEMMS`` workload-sized GEMMs) to run before each
    timed collective, as a training step's collectives follow compute: every rank starts
    it together (a barrier before it) and arrives at the collective as its cores allow."""
    import torch

    generator = torch.Generator().manual_seed(0)
    a = torch.randn(128, 64, generator=generator)
    b = torch.randn(64, 192, generator=generator)

    def burst() -> None:
        for _ in range(BURST_GEMMS):
            torch.mm(a, b)

    return burst


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
