"""Host costs of an eager framework on this machine, each on its own micro-benchmark.

What :func:`validate.calibrate.calibrate` measures besides GEMMs, bandwidth and collectives,
one thread per rank, all ranks at once (the figures the planner adds where an accelerator
records them, :mod:`planner.structure.op_counts`; none is measured on a validation layout):

* **per dispatched operation** (:func:`measure_op_overhead`): forward, backward and AdamW
  step of a tiny op mix (:func:`op_mix`: linears, a norm, SwiGLU, attention, cross-entropy
  at negligible FLOPs) over the ATen operations it dispatches, counted with a
  ``TorchDispatchMode``;
* **per DTensor operation** (:func:`measure_sharded_op_overhead`): AdamW steps on
  ``Shard(0)`` DTensor parameters, no communication;
* **per pipeline action** of torch's runtime (:func:`measure_pipeline_action_overheads`):
  1F1B and ZBV over all ranks with one negligible reference layer per stage;
* **per data-parallel wrapper unit or call** (:func:`measure_wrapper_overheads`): FSDP2 and
  DDP around the negligible reference model, each rank over a group of itself.
"""

from __future__ import annotations

import statistics
import time

from validate.op_census import labelled_counter
from validate.spec import Workload
from validate.timing import throughput_seconds


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
    from torch.distributed.tensor import Shard, distribute_tensor

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

        for _ in range(3):
            step()
        counter = labelled_counter()
        counter.label[0] = "step"
        with counter:
            step()
        seconds = throughput_seconds(step, window_s=0.1)
        plain, dtensor = counter.counts["step"]["plain"], counter.counts["step"]["dtensor"]
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

    from planner.api import Layout
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
            counter = labelled_counter()
            for stage in trainer.stages:
                _label_actions(stage, counter.label)
            for step in range(3):
                trainer.step(step)
            with counter:
                trainer.step(3)
            ops = {label: sum(kinds.values()) for label, kinds in counter.counts.items()}
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
        return throughput_seconds(step, window_s=0.1) / ops
    finally:
        torch.set_num_threads(threads)
